// Package inbox consumes Ferry's Kafka topics and applies each message
// exactly once: the inbox row (consumer, message id) and the handler's effect
// commit in one PostgreSQL transaction, and the Kafka offset is committed only
// after it. A redelivered message conflicts on the inbox row and becomes a
// no-op.
//
// # Handlers
//
// A Worker hosts handlers, registered per consumer and topic:
//
//	w, err := inbox.New(&inbox.Config{DB: pool, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}})
//	w.Handle("stock.reservation", "outbox.event.order", reserveStock)
//	err = w.Run(ctx) // until ctx ends; then drains, commits and leaves the group
//
// A consumer is one Kafka consumer group (group id = consumer name) and one
// namespace of the inbox. Each message is applied in one transaction:
//
//	BEGIN
//	INSERT INTO inbox (consumer, message_id) ... ON CONFLICT DO NOTHING
//	-- 0 rows: a duplicate; commit without calling the handler
//	handler(ctx, tx, message)   -- the effect, and outbox.Write for chained events
//	COMMIT
//	-- later: commit the Kafka offset
//
// The message id is the record's "id" header (the outbox id), never the
// offset, so it is the same after a relay replay, a redrive or a broker
// migration.
//
// # Order and throughput
//
// A partition's messages take effect in offset order, one at a time;
// partitions run concurrently, at most Config.Concurrency transactions at
// once. Config.KeyConcurrency > 1 runs several keys of a partition at once,
// keeping each key's order and committing the offset only below the lowest
// unfinished message. Config.BatchSize > 1 applies consecutive messages in
// one transaction with a savepoint per message.
//
// A batch holds the locks of all its messages until it commits, and
// batches run at once: a handler that locks rows other messages lock too
// (a product's stock, an account's balance) names them with
// HandleOpts.Locks, and the worker takes them in one order before any
// handler of the transaction runs, so batches take turns instead of
// deadlocking:
//
//	w.HandleWith("stock.reservation", "outbox.event.order", reserveStock,
//		&inbox.HandleOpts{Locks: func(m *inbox.Message) []string { return skusOf(m) }})
//
// # Failures
//
// A handler error is retried with exponential backoff and jitter, up to
// Config.MaxAttempts calls; the wait ends at once when the partition is
// revoked or the worker stops. An error wrapped with Permanent or
// Undecodable, a record without id and an exhausted retry budget send the
// message to its dead-letter topic (Config.DeadLetterTopic, "<topic>.dlq" by
// default) with headers that say why, when and from where. The offset moves
// past a dead-lettered message only once Kafka acknowledged the dead letter.
// An unreachable database is never the message's fault: it is retried
// without limit and never dead-letters anything. ListDeadLetters shows dead
// letters and Redrive republishes them with their original id.
//
// # Rebalances and shutdown
//
// On revoke the worker stops the revoked partitions' work, waits for the
// transactions in flight (Config.DrainTimeout) and commits what finished,
// while the member still owns the partitions; it never commits for a
// partition it no longer owns. On a lost partition it only stops. When
// Run's context ends it drains the same way, commits, leaves the group and
// returns nil.
//
// # Retention
//
// Prune (or Config.Prune inside Run) deletes inbox rows older than the
// dedupe window and outbox rows older than the outbox retention, in small
// batches, and refuses a window below its safety minimum.
package inbox
