package inbox

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// source is the channel side of a consumer: where its records come from
// and where what it finished is settled. Kafka (kafkaSource: a consumer
// group, offsets committed) and RabbitMQ (rabbitSource: one queue per
// shard, deliveries acknowledged) each implement it; the partitions,
// lanes, batches, inbox transactions, retries and dead letters above it are
// the same for both.
//
// Both keep one rule: a record is settled with the broker (its offset
// committed, its delivery acknowledged) only once its partition's commit
// point passed it, that is once it and every record before it were
// applied in a committed PostgreSQL transaction or dead-lettered; and only
// while the consumer still owns the partition. A partition the source loses
// (a Kafka partition revoked without a commit, a RabbitMQ channel that
// closed) is abandoned with its work: what it held comes again, to this
// consumer or another, and the inbox absorbs what was applied.
type source interface {
	// broker names the broker in messages: "Kafka" or "RabbitMQ".
	broker() string
	// run consumes until ctx ends, then drains the partitions, settles
	// what they finished and lets go of the broker.
	run(ctx context.Context)
	// ready returns nil once the consumer receives from everything it
	// consumes (joined its group, registered on every shard queue).
	ready() error
	// ping asks the broker whether it answers.
	ping(ctx context.Context) error
	// close releases a source that never ran.
	close()
	// settle commits or acknowledges the finished records of parts, the
	// partitions the consumer owns; the consumer's commitMu is held.
	settle(ctx context.Context, parts []*partition)
	// settleFirst is the negative control UnsafeCommitBeforeDB: it
	// settles ds before they are applied.
	settleFirst(p *partition, ds []*delivery)
	// finished is told of each record p finished; p.mu is held.
	finished(p *partition, r *kgo.Record)
	// pause stops the fetching of p's records (the buffer bound) and
	// reports whether it did: a source whose prefetch bounds them does
	// not. resume starts it again.
	pause(p *partition) bool
	resume(p *partition)
	// where names p for an operator: "topic T partition N", "RabbitMQ
	// queue Q".
	where(p *partition) string
	// produceDeadLetter writes out, the dead letter of rec, and waits for
	// the broker's acknowledgement.
	produceDeadLetter(ctx context.Context, out, rec *kgo.Record) error
	// addTopic consumes topic too (a live migration's new topic).
	addTopic(topic string)
}
