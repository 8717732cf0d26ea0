package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaSource is the source of a consumer on Kafka: one consumer group on
// one cluster, offsets committed every CommitInterval and at each revoke.
// Its poll loop only hands records to partition workers and never blocks on
// them, so a rebalance never waits for a handler or a retry backoff (franz-go
// heartbeats on its own goroutine; BlockRebalanceOnPoll only holds
// rebalances between a poll and AllowRebalance, a few microseconds here).
type kafkaSource struct {
	g  *groupConsumer
	cl *kgo.Client
}

func newKafkaSource(g *groupConsumer, kafkaOpts []kgo.Opt) (*kafkaSource, error) {
	k := &kafkaSource{g: g}
	start, reset := g.w.cfg.OffsetReset.offsets()
	// A resumed partition joins the next fetch only after the one in flight
	// returns, which with no new data takes FetchMaxWait: franz-go's 5s
	// default would stall every pause/resume. 500ms is the Java client's
	// default; KafkaOpts may still override it.
	opts := append([]kgo.Opt{kgo.FetchMaxWait(500 * time.Millisecond)}, kafkaOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(g.name),
		kgo.ConsumeTopics(g.topics()...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeStartOffset(start),
		kgo.ConsumeResetOffset(reset),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnPartitionsAssigned(k.onAssigned),
		kgo.OnPartitionsRevoked(k.onRevoked),
		kgo.OnPartitionsLost(k.onLost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: kafka client for consumer %s: %w", g.name, err)
	}
	k.cl = cl
	return k, nil
}

func (k *kafkaSource) broker() string { return "Kafka" }

func (k *kafkaSource) ready() error {
	if !k.g.joined.Load() {
		return fmt.Errorf("consumer %s has not joined its group yet", k.g.name)
	}
	return nil
}

func (k *kafkaSource) ping(ctx context.Context) error { return k.cl.Ping(ctx) }

func (k *kafkaSource) close() { k.cl.Close() }

func (k *kafkaSource) produceDeadLetter(ctx context.Context, out, _ *kgo.Record) error {
	return k.cl.ProduceSync(ctx, out).FirstErr()
}

func (k *kafkaSource) addTopic(topic string) { k.cl.AddConsumeTopics(topic) }

func (k *kafkaSource) where(p *partition) string {
	return fmt.Sprintf("%s partition %d", p.topic, p.id)
}

func (k *kafkaSource) finished(*partition, *kgo.Record) {}

func (k *kafkaSource) pause(p *partition) bool {
	k.cl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
	return true
}

func (k *kafkaSource) resume(p *partition) {
	k.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
}

// run polls until ctx ends, then drains, commits and leaves the group.
func (k *kafkaSource) run(ctx context.Context) {
	k.g.consume(ctx, k.pollLoop, k.commitLoop)
	// Leaving the group calls onRevoked once more, with nothing left to do.
	k.cl.CloseAllowingRebalance()
	k.g.log.Info("left the group")
}

func (k *kafkaSource) pollLoop(ctx context.Context) {
	g := k.g
	for {
		fetches := k.cl.PollRecords(ctx, pollRecordsMax)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			k.cl.AllowRebalance()
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
		k.cl.AllowRebalance()
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

func (k *kafkaSource) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	g := k.g
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
func (k *kafkaSource) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	g := k.g
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
func (k *kafkaSource) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	g := k.g
	n := count(lost)
	if n == 0 {
		return
	}
	g.w.metrics.nLost.Add(int64(n))
	g.w.metrics.assigned.WithLabelValues(g.name).Sub(float64(n))
	g.log.Warn("partitions lost (group membership ended); their work stops uncommitted", slog.Any("partitions", lost))
	g.release(g.take(lost), false)
}

func (k *kafkaSource) commitLoop(ctx context.Context) {
	g := k.g
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

// settle commits the finished offsets of parts that moved since their
// last commit. A failure is logged and counted; the next commit carries the
// same offsets again.
func (k *kafkaSource) settle(ctx context.Context, parts []*partition) {
	g := k.g
	var recs []*kgo.Record
	var moved []*partition
	var points []kgo.EpochOffset
	for _, p := range parts {
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
	if err := k.cl.CommitRecords(ctx, recs...); err != nil {
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

// settleFirst is the negative control's broken order: the offset is
// committed before the database transaction, so a crash in between loses
// the message. commitMu is taken here.
func (k *kafkaSource) settleFirst(p *partition, ds []*delivery) {
	last := ds[len(ds)-1].rec
	g := k.g
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	ctx, cancel := context.WithTimeout(p.stopCtx, 15*time.Second)
	defer cancel()
	if err := k.cl.CommitRecords(ctx, last); err != nil {
		p.log.Warn("unsafe early commit failed", slog.String("error", err.Error()))
		return
	}
	p.committed(kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1})
}
