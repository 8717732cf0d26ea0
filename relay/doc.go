// Package relay tails PostgreSQL's write-ahead log through logical
// replication (pgoutput) and publishes every committed outbox row to Kafka:
// key = aggregate id, the outbox id in the "id" header. It confirms a WAL
// position to PostgreSQL only once Kafka acknowledged every record before it,
// so a crash can repeat what was in flight but never lose an event.
package relay
