package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// pollRecordsMax bounds one poll, so the window in which rebalances wait
// for the poll loop stays short.
const pollRecordsMax = 2000

// commitTimeout bounds one offset commit; the next commit carries the same
// offsets again.
const commitTimeout = 10 * time.Second

type topicPartition struct {
	topic     string
	partition int32
}

// groupConsumer runs one consumer: one Kafka consumer group on one cluster.
// Its poll loop only hands records to partition workers and never blocks on
// them, so a rebalance never waits for a handler or a retry backoff (franz-go
// heartbeats on its own goroutine; BlockRebalanceOnPoll only holds
// rebalances between a poll and AllowRebalance, a few microseconds here).
// A second cluster for a live migration is a second groupConsumer with the
// same handlers: the inbox deduplicates across them.
type groupConsumer struct {
	w        *Worker
	name     string
	handlers map[string]handling
	cl       *kgo.Client   // Kafka; nil when rmq is set
	rmq      *rabbitSource // RabbitMQ; nil on Kafka
	log      *slog.Logger
	joined   atomic.Bool
	beat     atomic.Int64 // unix nanos of the commit loop's last run (see Worker.Healthy)
	kafkaOK  atomic.Int64 // unix nanos of Kafka's last answer to a ping (see Worker.Ready)

	mu    sync.Mutex                    // guards parts
	parts map[topicPartition]*partition // the partitions the member owns

	// commitMu orders every offset commit of this consumer, so that a
	// periodic commit never lands after the final commit of a revoke. It
	// is taken before mu: a partition leaves parts (take) only under both,
	// and a periodic commit reads parts and commits under commitMu, so it
	// never carries a partition the member gave up.
	commitMu sync.Mutex
}

func newGroupConsumer(w *Worker, name string, handlers map[string]handling, kafkaOpts []kgo.Opt) (*groupConsumer, error) {
	g := &groupConsumer{
		w:        w,
		name:     name,
		handlers: handlers,
		log:      w.cfg.Logger.With(slog.String("consumer", name)),
		parts:    make(map[topicPartition]*partition),
	}
	topics := make([]string, 0, len(handlers))
	for t := range handlers {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	start, reset := w.cfg.OffsetReset.offsets()
	// A resumed partition joins the next fetch only after the one in flight
	// returns, which with no new data takes FetchMaxWait: franz-go's 5s
	// default would stall every pause/resume. 500ms is the Java client's
	// default; KafkaOpts may still override it.
	opts := append([]kgo.Opt{kgo.FetchMaxWait(500 * time.Millisecond)}, kafkaOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(name),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeStartOffset(start),
		kgo.ConsumeResetOffset(reset),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnPartitionsAssigned(g.onAssigned),
		kgo.OnPartitionsRevoked(g.onRevoked),
		kgo.OnPartitionsLost(g.onLost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: kafka client for consumer %s: %w", name, err)
	}
	g.cl = cl
	return g, nil
}

// newRabbitGroupConsumer is a consumer of RabbitMQ's shard queues: the same
// partitions, lanes and dead letters as on Kafka, fed by rabbitSource.
func newRabbitGroupConsumer(w *Worker, name string, handlers map[string]handling) *groupConsumer {
	g := &groupConsumer{
		w:        w,
		name:     name,
		handlers: handlers,
		log:      w.cfg.Logger.With(slog.String("consumer", name)),
		parts:    make(map[topicPartition]*partition),
	}
	g.rmq = newRabbitSource(g, w.cfg.RabbitMQ)
	return g
}

// rabbitPartition starts the partition of a shard queue's new channel.
func (g *groupConsumer) rabbitPartition(topic string, shard int32, ch *amqp.Channel) *partition {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := newPartition(g, topic, shard, g.handlers[topic])
	p.rmq = ch
	g.parts[topicPartition{topic, shard}] = p
	return p
}

// ping asks the broker whether it answers, for Ready.
func (g *groupConsumer) ping(ctx context.Context) error {
	if g.rmq != nil {
		return g.rmq.ping()
	}
	return g.cl.Ping(ctx)
}

// close releases the client of a consumer that never ran.
func (g *groupConsumer) close() {
	if g.cl != nil {
		g.cl.Close()
	}
}

// produceDeadLetter writes out, the dead letter of rec, and waits for the
// broker's acknowledgement.
func (g *groupConsumer) produceDeadLetter(ctx context.Context, out, rec *kgo.Record) error {
	if g.rmq != nil {
		return g.rmq.pub.publish(ctx, out, rec)
	}
	return g.cl.ProduceSync(ctx, out).FirstErr()
}

// run polls until ctx ends, then drains, commits and leaves the group.
func (g *groupConsumer) run(ctx context.Context) {
	if g.rmq != nil {
		g.rmq.run(ctx)
		return
	}
	commitCtx, stopCommits := context.WithCancel(context.Background())
	var committer sync.WaitGroup
	g.beat.Store(time.Now().UnixNano())
	committer.Go(func() { g.commitLoop(commitCtx) })

	g.pollLoop(ctx)

	g.log.Info("draining")
	g.release(g.takeAll(), true)
	stopCommits()
	committer.Wait()
	// Leaving the group calls onRevoked once more, with nothing left to do.
	g.cl.CloseAllowingRebalance()
	g.log.Info("left the group")
}

func (g *groupConsumer) pollLoop(ctx context.Context) {
	for {
		fetches := g.cl.PollRecords(ctx, pollRecordsMax)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			g.cl.AllowRebalance()
			return
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			g.log.Error("fetch failed", slog.String("topic", topic), slog.Int("partition", int(partition)),
				slog.String("error", err.Error()))
		})
		now := time.Now()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			g.partition(fp.Topic, fp.Partition).enqueue(fp.Records, fp.HighWatermark, now)
		})
		g.cl.AllowRebalance()
		if failed && fetches.NumRecords() == 0 {
			// A partition in a fatal state (OffsetResetNone without a
			// commit) answers at once; do not spin on it.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// handles reports whether the consumer consumes topic.
func (g *groupConsumer) handles(topic string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.handlers[topic]
	return ok
}

// addTopic makes the consumer consume topic too, with h (a live
// migration's new channel, as the worker learns its topics).
func (g *groupConsumer) addTopic(topic string, h handling) {
	g.mu.Lock()
	g.handlers[topic] = h
	g.mu.Unlock()
	g.cl.AddConsumeTopics(topic)
}

// stuck returns an error naming a partition that cannot move, nil if none.
func (g *groupConsumer) stuck() error {
	g.mu.Lock()
	parts := make([]*partition, 0, len(g.parts))
	for _, p := range g.parts {
		parts = append(parts, p)
	}
	g.mu.Unlock()
	for _, p := range parts {
		if why := p.stuckReason(); why != "" && g.rmq != nil {
			return fmt.Errorf("consumer %s, RabbitMQ queue %s cannot move: %s", g.name, rabbitmq.QueueName(p.topic, int(p.id), g.name), why)
		} else if why != "" {
			return fmt.Errorf("consumer %s, %s partition %d cannot move: %s", g.name, p.topic, p.id, why)
		}
	}
	return nil
}

// partition returns the worker of an owned partition, starting it on first
// use. With BlockRebalanceOnPoll, polled records always belong to partitions
// the member owns at that moment.
func (g *groupConsumer) partition(topic string, id int32) *partition {
	tp := topicPartition{topic, id}
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.parts[tp]
	if !ok {
		p = newPartition(g, topic, id, g.handlers[topic]) // handlers is guarded by mu too
		g.parts[tp] = p
	}
	return p
}

func (g *groupConsumer) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	g.joined.Store(true)
	n := count(assigned)
	g.w.metrics.assigned.WithLabelValues(g.name).Add(float64(n))
	if n > 0 {
		g.log.Info("partitions assigned", slog.Any("partitions", assigned))
	}
}

// onRevoked stops the revoked partitions' work (waking retry backoffs),
// waits for their transactions in flight, and commits what they finished
// while the member still owns them.
func (g *groupConsumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	n := count(revoked)
	if n == 0 {
		return
	}
	g.w.metrics.nRevoked.Add(int64(n))
	g.w.metrics.assigned.WithLabelValues(g.name).Sub(float64(n))
	g.log.Info("partitions revoked", slog.Any("partitions", revoked))
	g.release(g.take(revoked), true)
}

// onLost stops the lost partitions' work without committing: another member
// may own them already.
func (g *groupConsumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	n := count(lost)
	if n == 0 {
		return
	}
	g.w.metrics.nLost.Add(int64(n))
	g.w.metrics.assigned.WithLabelValues(g.name).Sub(float64(n))
	g.log.Warn("partitions lost (group membership ended); their work stops uncommitted", slog.Any("partitions", lost))
	g.release(g.take(lost), false)
}

// take removes partitions from the owned set, so that no later periodic
// commit includes them. A periodic commit in flight ends first: until take
// returns, the member still owns them.
func (g *groupConsumer) take(tps map[string][]int32) []*partition {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*partition
	for topic, ids := range tps {
		for _, id := range ids {
			tp := topicPartition{topic, id}
			if p, ok := g.parts[tp]; ok {
				out = append(out, p)
				delete(g.parts, tp)
			}
		}
	}
	return out
}

func (g *groupConsumer) takeAll() []*partition {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*partition, 0, len(g.parts))
	for tp, p := range g.parts {
		out = append(out, p)
		delete(g.parts, tp)
	}
	return out
}

// release stops parts, waits for their work (cancelling transactions still
// running after DrainTimeout) and, when commit is set, commits their final
// offsets.
func (g *groupConsumer) release(parts []*partition, commit bool) {
	if len(parts) == 0 {
		return
	}
	for _, p := range parts {
		p.stop()
	}
	if h := g.w.cfg.hooks.stopped; h != nil {
		h()
	}
	if !waitDone(parts, g.w.cfg.DrainTimeout) {
		g.log.Warn("drain timeout: cancelling transactions in flight", slog.Duration("drain_timeout", g.w.cfg.DrainTimeout))
		for _, p := range parts {
			p.cancel()
		}
		if !waitDone(parts, g.w.cfg.DrainTimeout) {
			// A handler that ignores its context must not hold the group:
			// leave it behind. Its message is not finished, so not
			// committed; if its transaction still commits, the redelivery
			// is a duplicate.
			g.log.Error("a handler ignores cancellation; abandoning its work")
		}
	}
	for _, p := range parts {
		p.forget()
	}
	if commit {
		g.commit(context.Background(), parts)
	}
}

// waitDone waits up to d for every partition's lanes to return.
func waitDone(parts []*partition, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, p := range parts {
		select {
		case <-p.done:
		case <-t.C:
			return false
		}
	}
	return true
}

func (g *groupConsumer) commitLoop(ctx context.Context) {
	t := time.NewTicker(g.w.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if h := g.w.cfg.hooks.periodicCommit; h != nil {
			h()
		}
		for _, p := range g.commitOwned(ctx) {
			p.updateLag()
		}
		g.beat.Store(time.Now().UnixNano())
	}
}

// commitOwned commits the finished offsets of the partitions the member
// owns at this moment, and returns them. It reads the owned set under
// commitMu, not before: a set read earlier may hold a partition revoked or
// lost since, whose work another member may own and commit by now.
func (g *groupConsumer) commitOwned(ctx context.Context) []*partition {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.mu.Lock()
	parts := make([]*partition, 0, len(g.parts))
	for _, p := range g.parts {
		parts = append(parts, p)
	}
	g.mu.Unlock()
	g.commitLocked(ctx, parts)
	return parts
}

// commit commits the finished offsets of parts that moved since their last
// commit. A failure is logged and counted; the next commit carries the same
// offsets again.
func (g *groupConsumer) commit(ctx context.Context, parts []*partition) {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.commitLocked(ctx, parts)
}

func (g *groupConsumer) commitLocked(ctx context.Context, parts []*partition) {
	var recs []*kgo.Record
	var moved []*partition
	var points []kgo.EpochOffset
	for _, p := range parts {
		if p.rmq != nil {
			g.rmq.ack(p)
			continue
		}
		if at, ok := p.uncommitted(); ok {
			// CommitRecords commits offset+1 of each record.
			recs = append(recs, &kgo.Record{Topic: p.topic, Partition: p.id, LeaderEpoch: at.Epoch, Offset: at.Offset - 1})
			moved = append(moved, p)
			points = append(points, at)
		}
	}
	if len(recs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err := g.cl.CommitRecords(ctx, recs...); err != nil {
		g.w.metrics.nCommitErrors.Add(1)
		g.w.metrics.commitErrors.WithLabelValues(g.name).Inc()
		if ctx.Err() == nil {
			g.log.Warn("offset commit failed; the next commit retries it", slog.String("error", err.Error()))
		}
		return
	}
	for i, p := range moved {
		p.committed(points[i])
	}
}

func count(tps map[string][]int32) int {
	n := 0
	for _, ps := range tps {
		n += len(ps)
	}
	return n
}
