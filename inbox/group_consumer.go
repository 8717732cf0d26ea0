package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
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

// groupConsumer runs one consumer on one channel: the partitions, lanes,
// batches, retries and dead letters of its handlers, fed by its source (a
// Kafka consumer group, kafkaSource, or RabbitMQ's shard queues,
// rabbitSource). A second channel for a live migration is a second
// groupConsumer with the same handlers: the inbox deduplicates across them.
type groupConsumer struct {
	w        *Worker
	name     string
	handlers map[string]handling
	src      source
	follower bool // a live migration's new channel (Worker.follow), not the consumer's own
	log      *slog.Logger
	joined   atomic.Bool
	beat     atomic.Int64 // unix nanos of the commit loop's last run (see Worker.Healthy)
	brokerOK atomic.Int64 // unix nanos of the broker's last answer to a ping (see Worker.Ready)

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
	g := newConsumer(w, name, handlers)
	src, err := newKafkaSource(g, kafkaOpts)
	if err != nil {
		return nil, err
	}
	g.src = src
	return g, nil
}

// newRabbitGroupConsumer is a consumer of RabbitMQ's shard queues: the same
// partitions, lanes and dead letters as on Kafka, fed by rabbitSource.
func newRabbitGroupConsumer(w *Worker, name string, handlers map[string]handling) *groupConsumer {
	g := newConsumer(w, name, handlers)
	g.src = newRabbitSource(g, w.cfg.RabbitMQ)
	return g
}

func newConsumer(w *Worker, name string, handlers map[string]handling) *groupConsumer {
	return &groupConsumer{
		w:        w,
		name:     name,
		handlers: handlers,
		log:      w.cfg.Logger.With(slog.String("consumer", name)),
		parts:    make(map[topicPartition]*partition),
	}
}

// topics returns the topics the consumer has handlers for, sorted.
func (g *groupConsumer) topics() []string {
	topics := make([]string, 0, len(g.handlers))
	for t := range g.handlers {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	return topics
}

// kafka returns the Kafka client of a consumer on Kafka, nil on RabbitMQ.
// Live migrations read and write Kafka (reports, quarantine, the
// follower's channel): only a Kafka consumer reaches them.
func (g *groupConsumer) kafka() *kgo.Client {
	if k, ok := g.src.(*kafkaSource); ok {
		return k.cl
	}
	return nil
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
func (g *groupConsumer) ping(ctx context.Context) error { return g.src.ping(ctx) }

// close releases the client of a consumer that never ran.
func (g *groupConsumer) close() { g.src.close() }

// produceDeadLetter writes out, the dead letter of rec, and waits for the
// broker's acknowledgement.
func (g *groupConsumer) produceDeadLetter(ctx context.Context, out, rec *kgo.Record) error {
	return g.src.produceDeadLetter(ctx, out, rec)
}

// run consumes until ctx ends, then drains, settles and lets go.
func (g *groupConsumer) run(ctx context.Context) { g.src.run(ctx) }

// consume runs a source: fetch until ctx ends, with loops (commits, acks,
// lag) beside it, then the drain: every partition's work finishes and is
// settled while the consumer still owns it, and only then do the loops
// stop.
func (g *groupConsumer) consume(ctx context.Context, fetch func(context.Context), loops ...func(context.Context)) {
	loopCtx, stopLoops := context.WithCancel(context.Background())
	var running sync.WaitGroup
	g.beat.Store(time.Now().UnixNano())
	for _, loop := range loops {
		running.Go(func() { loop(loopCtx) })
	}
	fetch(ctx)
	g.log.Info("draining")
	g.release(g.takeAll(), true)
	stopLoops()
	running.Wait()
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
	g.src.addTopic(topic)
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
		if why := p.stuckReason(); why != "" {
			return fmt.Errorf("consumer %s, %s cannot move: %s", g.name, g.src.where(p), why)
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

// commit settles with the broker what parts finished since their last
// commit (Kafka commits the offsets, RabbitMQ acknowledges the deliveries).
// A failure is logged and counted; the next commit carries it again.
func (g *groupConsumer) commit(ctx context.Context, parts []*partition) {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	g.commitLocked(ctx, parts)
}

func (g *groupConsumer) commitLocked(ctx context.Context, parts []*partition) {
	g.src.settle(ctx, parts)
}

func count(tps map[string][]int32) int {
	n := 0
	for _, ps := range tps {
		n += len(ps)
	}
	return n
}
