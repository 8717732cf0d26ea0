// Package outbox writes events into Ferry's outbox table inside the caller's
// own database transaction.
//
// The event commits or rolls back with the business rows written in the same
// transaction: a rolled-back transaction leaves no event, a committed one always
// has its event. The writer never opens, commits or rolls back a transaction of
// its own. The Ferry relay then reads committed rows from the write-ahead log
// and publishes each to Kafka with the event's id in the "id" header, so
// consumers can apply every event exactly once.
//
// Write works with pgx (pgx.Tx, *pgx.Conn, *pgxpool.Pool); WriteSQL works with
// database/sql (*sql.Tx, *sql.DB, *sql.Conn) and any PostgreSQL driver. Both
// insert any number of events in one statement, one round trip.
//
// Payloads are bytes and reach Kafka unchanged: JSON, protobuf and Avro are all
// fine. Header values are strings.
package outbox
