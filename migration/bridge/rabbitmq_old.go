package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/commitpoint"
	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// ErrLateQueues is a bridge from a RabbitMQ old channel whose queues did
// not exist when the plan left OLD_ONLY: what the producers published
// before is in no queue of the bridge, and the order of the aggregates
// those messages belong to could not be kept across the channels.
var ErrLateQueues = errors.New("bridge: the bridge's queues on the old RabbitMQ channel were not declared before the plan left OLD_ONLY")

// rabbitPrefetchMax is AMQP's largest prefetch count (a short).
const rabbitPrefetchMax = 65535

// A RabbitMQ old channel cannot be read from its beginning: a message is
// in the queues bound when it was published, and nowhere else. The bridge
// therefore declares queues of its own (its Config.Group as the consumer
// of rabbitmq.Topology: one quorum queue per exchange and shard of the old
// channel, bound as the workers' are) as soon as it starts, and refuses to
// declare them once the plan has left OLD_ONLY (ErrLateQueues). Its copies
// say so in their stamp: they are authoritative, with Since the epoch of
// the step their session began at (the step before it for OLD_RETIRED,
// whose step writes no fences) and Peer the exchange. A worker holds such a
// copy until it passed that epoch's fence on every shard of the exchange on
// the old channel: the relay wrote those fences after the bridge's queues
// existed, behind every message a worker could still hold from before
// them, so a key's messages apply in the order the producer published them
// whichever channel brings them first.
//
// Each queue is read on a channel of its own, in order; its deliveries are
// acknowledged (multiple) only up to the contiguous prefix whose copies the
// new cluster acknowledged. A session that ends (the run's end, OLD_ONLY,
// a refusal, a lost connection) stops reading, waits for the answers in
// flight (Config.ShutdownTimeout), and closes its channels without
// cancelling their consumers, so that what it did not acknowledge goes back
// to the head of its queue before the next consumer of the queue (single
// active consumer) gets anything.

// rabbitOld is how the bridge reaches a RabbitMQ old channel.
type rabbitOld struct {
	conn   rabbitmq.Conn
	names  rabbitmq.Names
	shards int
}

func (b *Bridge) rabbitOld(p migration.Plan) (*rabbitOld, error) {
	if b.cfg.TopicRegex != "" {
		return nil, fmt.Errorf("bridge: Config.TopicRegex %q: plan %q's old channel is RabbitMQ, whose exchanges cannot be listed: name them in Config.Topics",
			b.cfg.TopicRegex, b.cfg.Plan)
	}
	pc := rabbitmq.PlanChannel{Side: string(migration.OldSide), URL: p.Old.URL, PasswordEnv: p.Old.PasswordEnv,
		TLS: kafkaauth.TLSFiles{CA: p.Old.TLSCAFile, Cert: p.Old.TLSCertFile, Key: p.Old.TLSKeyFile}}
	conn, err := pc.Conn(b.cfg.Getenv)
	if err != nil {
		return nil, fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
	}
	conn.Name = "ferry-bridge " + b.cfg.Plan
	return &rabbitOld{conn: conn, names: pc.Names(), shards: p.Old.Shards}, nil
}

func (o *rabbitOld) topology(b *Bridge) *rabbitmq.Topology {
	return &rabbitmq.Topology{Consumer: b.cfg.Group, Topics: b.cfg.Topics, Shards: o.shards}
}

// declare declares the bridge's queues while the plan is OLD_ONLY, and
// checks that they exist otherwise.
func (o *rabbitOld) declare(ctx context.Context, b *Bridge, phase migration.Phase) error {
	conn, err := o.conn.Dial(o.names)
	if err != nil {
		return fmt.Errorf("bridge: old channel: %w", err)
	}
	defer conn.Close()
	t := o.topology(b)
	if err := t.Check(); err != nil {
		return fmt.Errorf("bridge: the bridge's queues (Config.Group %q): %w", b.cfg.Group, err)
	}
	missing, err := rabbitmq.Missing(conn, t)
	if err != nil {
		return fmt.Errorf("bridge: old channel: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	if phase != migration.OldOnly {
		return fmt.Errorf("%w: plan %q is %s and %d queues are missing (%s): take the plan back to OLD_ONLY, start the bridge, then DUAL_WRITE again",
			ErrLateQueues, b.cfg.Plan, phase, len(missing), strings.Join(missing[:min(3, len(missing))], ", "))
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("bridge: old channel: %w", err)
	}
	defer ch.Close()
	if err := rabbitmq.Declare(ch, t); err != nil {
		return fmt.Errorf("bridge: old channel: %w", err)
	}
	// A step taken while the queues were being declared may have fenced
	// the old channel before them: read it again, and take them back if so.
	st, err := b.ctl.State(ctx, b.cfg.Plan)
	if err != nil {
		return fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
	}
	if st.Phase != migration.OldOnly {
		for _, q := range missing {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		return fmt.Errorf("%w: plan %q became %s while they were declared: take the plan back to OLD_ONLY and start the bridge again",
			ErrLateQueues, b.cfg.Plan, st.Phase)
	}
	b.log.Info("declared the bridge's queues on the old RabbitMQ channel: they keep what producers publish from now on",
		slog.Int("queues", len(missing)), slog.String("group", b.cfg.Group))
	return nil
}

// runFromRabbitMQ is Run for a RabbitMQ old channel.
// The bridge is Ready once its queues exist.
func (b *Bridge) runFromRabbitMQ(ctx context.Context, st *migration.State, newPub func() (publisher, error)) error {
	old, err := b.rabbitOld(st.Plan)
	if err != nil {
		return err
	}
	if err := old.declare(ctx, b, st.Phase); err != nil {
		return err
	}
	watch := newStepWatch(b.ctl, st, b.cfg.StepInterval, b.log)
	b.watch.Store(watch)
	wctx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { watch.run(wctx) })
	defer watching.Wait()
	defer stopWatch()
	b.log.Info("bridge following the plan", slog.String("group", b.cfg.Group), slog.Any("exchanges", b.cfg.Topics),
		slog.String("old_url", old.conn.Redacted()), slog.Any("new_brokers", st.Plan.New.Brokers),
		slog.String("phase", string(st.Phase)), slog.Int("epoch", st.Epoch))
	return b.follow(ctx, watch, func() (error, error) { return b.copyFromRabbitMQ(ctx, watch, old, newPub) })
}

// awaitCopying waits while the step is OLD_ONLY; false when ctx ended.
func (b *Bridge) awaitCopying(ctx context.Context, watch *stepWatch) bool {
	for {
		step, changed := watch.current()
		if step.Phase != migration.OldOnly {
			b.waiting.Store(false)
			return true
		}
		if !b.waiting.Swap(true) {
			b.log.Info("the plan is OLD_ONLY: waiting for DUAL_WRITE; nothing is copied or committed meanwhile",
				slog.Int("epoch", step.Epoch))
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// rabbitSession is one stretch of copying from a RabbitMQ old channel.
type rabbitSession struct {
	b        *Bridge
	watch    *stepWatch
	producer publisher
	since    int // the copies' Stamp.Since

	mu       sync.Mutex
	answered *sync.Cond
	inflight int
	refused  error
	lost     error
	stop     context.CancelFunc
}

// rabbitQueue is one of the bridge's queues, read on a channel of its own.
type rabbitQueue struct {
	exchange string
	shard    int
	name     string
	ch       *amqp.Channel
	tags     commitpoint.Tracker // delivery tags; guarded by the session's mu
	acked    int64               // the last tag acknowledged
}

// sinceOf is the epoch whose fences on the old channel a session's copies
// wait for: every step but OLD_ONLY and OLD_RETIRED fences the old channel.
func sinceOf(step route.Step) int {
	if step.Phase == migration.OldRetired {
		return step.Epoch - 1
	}
	return step.Epoch
}

// copyFromRabbitMQ copies until ctx ends, the step goes back to OLD_ONLY, a
// copy is refused (the error) or the old channel is lost (lost).
func (b *Bridge) copyFromRabbitMQ(ctx context.Context, watch *stepWatch, old *rabbitOld, newPub func() (publisher, error)) (lost, err error) {
	step, _ := watch.current()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s := &rabbitSession{b: b, watch: watch, since: sinceOf(step), stop: stop}
	s.answered = sync.NewCond(&s.mu)
	stopWake := context.AfterFunc(sctx, s.wake)
	defer stopWake()

	conn, err := old.conn.Dial(old.names)
	if err != nil {
		return err, nil // the broker may come back: retried
	}
	defer conn.Close()
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	producer, err := newPub()
	if errors.Is(err, errLost) {
		return err, nil
	}
	if err != nil {
		return nil, err
	}
	s.producer = producer
	defer producer.Close()

	var queues []*rabbitQueue
	for _, ex := range b.cfg.Topics {
		for shard := range old.shards {
			queues = append(queues, &rabbitQueue{exchange: ex, shard: shard, tags: commitpoint.New(),
				name: rabbitmq.QueueName(ex, shard, b.cfg.Group)})
		}
	}
	prefetch := min(rabbitPrefetchMax, max(1, b.cfg.MaxInFlightRecords/len(queues)))
	var readers sync.WaitGroup
	for _, q := range queues {
		deliveries, err := s.open(conn, q, prefetch)
		if err != nil {
			stop()
			readers.Wait()
			return err, nil
		}
		readers.Go(func() { s.read(sctx, q, deliveries) })
	}
	b.log.Info("copying from the old RabbitMQ channel", slog.Int("queues", len(queues)), slog.Int("since_epoch", s.since),
		slog.String("phase", string(step.Phase)), slog.Int("epoch", step.Epoch))
	go func() {
		select {
		case e := <-closes:
			if e != nil {
				s.fail(fmt.Errorf("old channel connection closed: %w", e))
			}
		case <-sctx.Done():
		}
	}()
	go func() {
		for {
			step, changed := watch.current()
			if step.Phase == migration.OldOnly {
				stop()
				return
			}
			select {
			case <-sctx.Done():
				return
			case <-changed:
			}
		}
	}()
	<-sctx.Done()
	readers.Wait()
	if n := s.waitAnswers(b.cfg.ShutdownTimeout); n > 0 {
		b.log.Warn("stopping before the new cluster answered every copy; those are copied again next time",
			slog.Int("unanswered", n), slog.Duration("shutdown_timeout", b.cfg.ShutdownTimeout))
	}
	s.mu.Lock()
	refused, lost := s.refused, s.lost
	s.mu.Unlock()
	// Closing, not cancelling: what is unacknowledged goes back first.
	// RabbitMQ 3.10 may drop acks a quorum queue has not applied when
	// their channel closes: those messages are delivered and copied
	// again, with the same ids.
	for _, q := range queues {
		if q.ch != nil {
			_ = q.ch.Close()
		}
	}
	if refused == nil && lost == nil && ctx.Err() == nil {
		b.log.Info("the plan went back to OLD_ONLY: the bridge stopped reading; what it had not copied stays in its queues")
	}
	return lost, refused
}

// open opens q's channel and consumes q on it.
func (s *rabbitSession) open(conn *amqp.Connection, q *rabbitQueue, prefetch int) (<-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("prefetch on %s: %w", q.name, err)
	}
	// Not exclusive: a single-active-consumer queue keeps other
	// bridges waiting, and hands over when this channel closes.
	deliveries, err := ch.Consume(q.name, "", false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("consume %s: %w", q.name, err)
	}
	q.ch = ch
	return deliveries, nil
}

func (s *rabbitSession) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered.Broadcast()
}

// read sends the copy of each of q's deliveries, in their order, until ctx
// ends.
func (s *rabbitSession) read(ctx context.Context, q *rabbitQueue, deliveries <-chan amqp.Delivery) {
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				s.fail(fmt.Errorf("the old channel closed queue %s's channel", q.name))
				return
			}
			s.send(q, &d)
		}
	}
}

// send sends d's copy, or skips d when it is Ferry's relay's own (a fence,
// or an event with a route stamp: the relay writes the new channel itself).
func (s *rabbitSession) send(q *rabbitQueue, d *amqp.Delivery) {
	tag := int64(d.DeliveryTag)
	s.mu.Lock()
	q.tags.Add(tag, 0)
	s.mu.Unlock()
	_, stamped := d.Headers[route.HeaderRoute]
	_, fence := d.Headers[route.HeaderFence]
	if stamped || fence {
		s.b.skipped.Add(1)
		s.finish(q, tag, false)
		return
	}
	step, _ := s.watch.current()
	out, derived := s.b.copier.copyOfDelivery(d, q.exchange, q.shard, step, s.since)
	s.mu.Lock()
	s.inflight++
	s.mu.Unlock()
	s.b.consumed.Add(1)
	if derived {
		s.b.derived.Add(1)
	}
	s.producer.Produce(context.Background(), out, func(_ *kgo.Record, err error) {
		if errors.Is(err, errLost) {
			s.inflightDone()
			s.fail(err)
			return
		}
		if err != nil {
			s.refuse(&RefusedError{Topic: q.exchange, Partition: int32(q.shard), Offset: tag, Queue: q.name, NewTopic: out.Topic, Err: err})
			return
		}
		s.b.published.Add(1)
		s.finish(q, tag, true)
	})
}

// finish marks tag done (its copy acknowledged when sent) and
// acknowledges the contiguous prefix to the old channel.
func (s *rabbitSession) finish(q *rabbitQueue, tag int64, sent bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.tags.Finish(tag)
	if point, ok := q.tags.Point(); ok && point.Offset-1 > q.acked {
		q.acked = point.Offset - 1
		// A closed channel refuses: its deliveries go back to the queue,
		// and their copies are made again (the same ids).
		_ = q.ch.Ack(uint64(q.acked), true)
	}
	if sent {
		s.inflight--
		s.answered.Broadcast()
	}
}

// inflightDone counts an answer that finished nothing.
func (s *rabbitSession) inflightDone() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.answered.Broadcast()
}

func (s *rabbitSession) refuse(err *RefusedError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.answered.Broadcast()
	if s.refused != nil {
		return
	}
	s.refused = err
	s.b.log.Error("the new cluster refused a copy; the bridge stops", slog.String("exchange", err.Topic),
		slog.Int("shard", int(err.Partition)), slog.String("new_topic", err.NewTopic), slog.String("error", err.Err.Error()))
	s.stop()
}

func (s *rabbitSession) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost == nil && s.refused == nil {
		s.lost = err
	}
	s.stop()
}

// waitAnswers waits up to d for the new cluster's answers in flight, and
// returns how many are missing.
func (s *rabbitSession) waitAnswers(d time.Duration) int {
	return waitAnswered(&s.mu, s.answered, d, func() int { return s.inflight })
}

// brokerHeaders are the headers RabbitMQ adds to a message it delivers
// again or dead-letters: not the producer's, and different on every
// delivery, they are not copied.
var brokerHeaders = []string{"x-delivery-count", "x-death", "x-first-death-exchange", "x-first-death-queue",
	"x-first-death-reason", "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason"}

// copyOfDelivery is the new channel's copy of a message of the old
// channel's exchange, delivered from the bridge's queue of shard, and
// whether its id was derived. The key is the aggregate id header (the
// routing key when there is none, so that the shard's messages stay in
// order), the id the outbox.HeaderID header, else the message id, else a
// digest of exchange, routing key and body (rabbitmq.DerivedID, which a
// worker reading the original derives too), never the delivery tag or the
// redelivered flag, which differ between deliveries. The value, headers
// and timestamp are the producer's.
func (c *copier) copyOfDelivery(d *amqp.Delivery, exchange string, shard int, step route.Step, since int) (*kgo.Record, bool) {
	r := rabbitmq.Record(d, exchange, shard)
	if r.Key == nil {
		r.Key = []byte(d.RoutingKey)
	}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	var own, named []byte // the id header (or the message id) and Config.IDHeader's
	for _, h := range r.Headers {
		switch {
		case h.Key == outbox.HeaderID:
			own = h.Value
			continue
		case h.Key == rabbitmq.HeaderCreatedAt, slices.Contains(brokerHeaders, h.Key):
			continue
		case h.Key == c.idHeader:
			named = h.Value
		}
		headers = append(headers, h)
	}
	var id []byte
	switch {
	case c.fromPayload:
	case c.idHeader == outbox.HeaderID:
		id = own
	default:
		id = named
	}
	derived := len(id) == 0
	if derived {
		id = []byte(rabbitmq.DerivedID(d))
	}
	headers = append(headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: id})
	stamp := route.Stamp{Plan: c.plan, Epoch: step.Epoch, Slice: route.Slice(r.Key), Side: migration.NewSide,
		Role: route.Authoritative, Since: since, Peer: exchange, Bridged: true}
	headers = append(headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: stamp.Bytes()})
	return &kgo.Record{
		Topic:     newTopic(c.topicMap, c.template, exchange),
		Key:       r.Key,
		Value:     r.Value,
		Headers:   headers,
		Timestamp: r.Timestamp,
	}, derived
}
