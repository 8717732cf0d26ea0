//go:build ferryfault

package inbox

// The negative controls of the fault-injection suite, which must see the
// loss they cause. They exist only in builds with the ferryfault tag (the
// suite's), never in the public API or a release binary.

// UnsafeCommitOffsetsBeforeDB makes a worker commit each message's Kafka
// offset before its database transaction, instead of after the commit. It
// breaks Ferry's consumer rule on purpose and loses effects when the worker
// crashes between the two.
func UnsafeCommitOffsetsBeforeDB(cfg *Config) { cfg.unsafeCommitBeforeDB = true }

// UnsafeNoMigrationQuarantine keeps a worker from quarantining the events
// of a live migration whose shadow copy arrived and which it never applied
// (their authoritative copy lost): they stay unapplied and unaccounted, as
// with a consumer that leaves the old channel at cutover without a drain.
// The suite's checker must report those events lost.
func UnsafeNoMigrationQuarantine(cfg *Config) { cfg.unsafeNoMigrationQuarantine = true }

// UnsafeAckBeforeDB makes a RabbitMQ worker acknowledge each delivery
// before its database transaction, instead of after the commit: a crash in
// between loses the message.
func UnsafeAckBeforeDB(cfg *Config) { cfg.unsafeCommitBeforeDB = true }

// UnsafeRequeueRetries makes a RabbitMQ worker retry a failed delivery by
// Nack(requeue=true) instead of holding it: RabbitMQ 3.x puts it at the
// back of the quorum queue, behind the aggregate's later events, and the
// suite's checker must see the order inversions.
func UnsafeRequeueRetries(cfg *Config) { cfg.unsafeRequeueRetries = true }
