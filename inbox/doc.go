// Package inbox consumes Ferry's Kafka topics and applies each message
// exactly once: the inbox row (consumer, message id) and the handler's effect
// commit in one PostgreSQL transaction, and the Kafka offset is committed only
// after it. A redelivered message conflicts on the inbox row and becomes a
// no-op.
package inbox
