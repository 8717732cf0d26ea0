package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// HeaderDeadLetterOriginalQueue is set on the dead letters of a RabbitMQ
// worker: the shard queue the message came from.
const HeaderDeadLetterOriginalQueue = "ferry.dlq.original_queue"

// rabbitDrainMax bounds the deliveries handed to a partition at once.
const rabbitDrainMax = 256

// consumerTag names the worker's consumers in the management UI; a tag is
// per channel, and each shard queue has a channel of its own.
const consumerTag = "ferry-worker"

// lagInterval is how often a RabbitMQ consumer reads its queues' depths.
const lagInterval = 5 * time.Second

// rabbitSource is a consumer's RabbitMQ side: the queues of its topics' shards
// play Kafka's partitions, one channel each. The per-partition machinery
// (lanes, batches, the commit point, dead letters) is the groupConsumer's,
// shared with Kafka; what differs is here:
//   - a partition is one channel's deliveries: its offsets are the
//     channel's delivery tags, increasing from 1, and its commit point is
//     what may be acknowledged with multiple=true on that channel, after the
//     PostgreSQL commit;
//     (rabbitmq.md 9.2 suggests Offset -1 and per-delivery acks; the tag as
//     offset reuses the commit point as the one rule for multiple acks);
//   - a channel that dies takes its partition with it, as a lost Kafka
//     partition: its work stops, its acknowledgements are never sent (a
//     closed *amqp.Channel never sends again; there is no automatic
//     recovery), the broker redelivers and the inbox absorbs what was
//     applied;
//   - acks go out as soon as the commit point moves (finish kicks the ack
//     loop), not every CommitInterval: the prefetch would otherwise stall
//     a shard on acks waiting for the interval;
//   - the stop finishes the work, acknowledges it, then closes the
//     channels, never basic.cancel (with a single active consumer, a
//     cancel activates the next consumer while this one still applies
//     older messages).
type rabbitSource struct {
	g               *groupConsumer
	cfg             *RabbitMQConfig
	log             *slog.Logger
	reportsDeclared bool // the report stream was declared (publishReports)
	producers       producerTally
	lag             atomic.Int64 // lagTotal; -1 until every queue was read

	// runMu guards what addTopic needs to consume a topic while running.
	runMu   sync.Mutex
	runCtx  context.Context // set by run; nil before
	stopped bool            // run is draining: no topic starts any more
	shards  sync.WaitGroup  // the consumeShard goroutines

	connMu sync.Mutex
	conn   *amqp.Connection // the consuming connection; nil or closed: dial again

	pub *deadLetterPublisher

	regMu      sync.Mutex
	topics     []string                         // consumed; addTopic adds to them
	registered map[topicPartition]*amqp.Channel // shard queues consumed now
	total      int                              // len(topics) * shards
	kick       chan struct{}                    // a partition finished something: acknowledge it
}

func newRabbitSource(g *groupConsumer, cfg *RabbitMQConfig) *rabbitSource {
	topics := g.topics()
	s := &rabbitSource{
		g: g, cfg: cfg, topics: topics, log: g.log,
		pub:        &deadLetterPublisher{cfg: cfg, name: g.name},
		registered: map[topicPartition]*amqp.Channel{},
		total:      len(topics) * cfg.Shards,
		kick:       make(chan struct{}, 1),
	}
	s.lag.Store(-1)
	return s
}

// connection returns the consuming connection, dialing a new one when there
// is none or it closed.
func (s *rabbitSource) connection() (*amqp.Connection, error) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := s.cfg.conn(" " + s.g.name).Dial(rabbitNames)
	if err != nil {
		return nil, err
	}
	s.conn = conn
	return conn, nil
}

func (s *rabbitSource) broker() string { return "RabbitMQ" }

func (s *rabbitSource) ready() error {
	if q := s.notReady(); q != "" {
		return fmt.Errorf("consumer %s is not registered on RabbitMQ queue %s yet", s.g.name, q)
	}
	return nil
}

func (s *rabbitSource) close() {}

func (s *rabbitSource) produceDeadLetter(ctx context.Context, out, rec *kgo.Record) error {
	return s.pub.publish(ctx, out, rec)
}

// addTopic consumes topic's shard queues too (a live migration's new
// channel, as the worker learns its topics); once run drains, it only
// counts the topic.
func (s *rabbitSource) addTopic(topic string) {
	s.regMu.Lock()
	if slices.Contains(s.topics, topic) {
		s.regMu.Unlock()
		return
	}
	s.topics = append(s.topics, topic)
	s.total += s.cfg.Shards
	s.g.joined.Store(false)
	s.regMu.Unlock()
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.runCtx != nil && !s.stopped {
		s.startTopic(s.runCtx, topic)
	}
}

// topicList is the topics consumed now.
func (s *rabbitSource) topicList() []string {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	return slices.Clone(s.topics)
}

// startTopic consumes topic's shard queues until ctx ends; runMu is held.
func (s *rabbitSource) startTopic(ctx context.Context, topic string) {
	for shard := range s.cfg.Shards {
		s.shards.Go(func() { s.consumeShard(ctx, topic, shard) })
	}
}

func (s *rabbitSource) where(p *partition) string {
	return "RabbitMQ queue " + rabbitmq.QueueName(p.topic, int(p.id), s.g.name)
}

// pause and resume do nothing: the prefetch bounds what a channel holds.
func (s *rabbitSource) pause(*partition) bool { return false }
func (s *rabbitSource) resume(*partition)     {}

// settle acknowledges each partition's deliveries up to its commit point.
func (s *rabbitSource) settle(_ context.Context, parts []*partition) {
	for _, p := range parts {
		s.ack(p)
	}
}

// ping reports whether the consuming connection is up.
func (s *rabbitSource) ping(context.Context) error {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn == nil || s.conn.IsClosed() {
		return errors.New("no RabbitMQ connection")
	}
	return nil
}

// run consumes every shard queue until ctx ends, then drains: the work in
// flight finishes, is acknowledged, and the channels close.
func (s *rabbitSource) run(ctx context.Context) {
	g := s.g
	g.consume(ctx, func(ctx context.Context) {
		s.runMu.Lock()
		s.runCtx = ctx
		for _, topic := range s.topicList() {
			s.startTopic(ctx, topic)
		}
		s.runMu.Unlock()
		<-ctx.Done()
		s.runMu.Lock()
		s.stopped = true
		s.runMu.Unlock()
		s.shards.Wait()
	}, s.ackLoop, s.lagLoop)
	s.regMu.Lock()
	g.w.metrics.assigned.WithLabelValues(g.name).Sub(float64(len(s.registered)))
	for tp, ch := range s.registered {
		// Close, not cancel: what was delivered and not acknowledged goes
		// back to the head of the queue, in order, before the next
		// consumer gets anything.
		_ = ch.Close()
		delete(s.registered, tp)
	}
	s.regMu.Unlock()
	g.joined.Store(false)
	s.connMu.Lock()
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.connMu.Unlock()
	s.pub.close()
	g.log.Info("closed the RabbitMQ channels")
}

// consumeShard consumes one shard queue, on a new channel after each loss,
// until ctx ends. It leaves its last partition to run's drain.
func (s *rabbitSource) consumeShard(ctx context.Context, topic string, shard int) {
	g := s.g
	queue := rabbitmq.QueueName(topic, shard, g.name)
	tp := topicPartition{topic, int32(shard)}
	log := g.log.With(slog.String("queue", queue))
	for n := 1; ctx.Err() == nil; n++ {
		ch, deliveries, closed, err := s.open(queue)
		if err != nil {
			wait := backoff.Delay(n, g.w.cfg.RetryBackoff, g.w.cfg.RetryBackoffMax)
			log.Warn("cannot consume the shard queue; retrying", slog.Duration("retry_in", wait), slog.String("error", err.Error()))
			if !sleepCtx(ctx, wait) {
				return
			}
			continue
		}
		p := g.rabbitPartition(topic, int32(shard), ch)
		s.register(tp, ch)
		if s.consume(ctx, p, topic, shard, deliveries) {
			return // the stop: run drains, acknowledges and closes
		}
		// The channel died: its deliveries come again, to whichever
		// consumer the broker activates. Never acknowledge them here.
		s.unregister(tp)
		g.w.metrics.nLost.Add(1)
		g.w.metrics.assigned.WithLabelValues(g.name).Dec()
		reason := "closed"
		select {
		case e := <-closed:
			if e != nil {
				reason = e.Error()
			}
		default:
		}
		log.Warn("channel lost; its unacknowledged deliveries will be redelivered", slog.String("reason", reason))
		g.release(g.take(map[string][]int32{topic: {int32(shard)}}), false)
		n = 0
		if !sleepCtx(ctx, g.w.cfg.RetryBackoff) {
			return
		}
	}
}

// open opens a channel on the consuming connection and consumes queue on it,
// with the prefetch as its in-flight bound.
func (s *rabbitSource) open(queue string) (*amqp.Channel, <-chan amqp.Delivery, <-chan *amqp.Error, error) {
	conn, err := s.connection()
	if err != nil {
		return nil, nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open a channel: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, nil, fmt.Errorf("qos: %w", err)
	}
	// exclusive=false: a single-active-consumer queue refuses exclusive
	// consumers; the broker keeps the others waiting.
	deliveries, err := ch.Consume(queue, consumerTag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	return ch, deliveries, closed, nil
}

// consume hands deliveries to p until ctx ends (true) or the channel closes
// (false). Deliveries still buffered at the stop are left unacknowledged:
// they go back to the queue with the channel.
func (s *rabbitSource) consume(ctx context.Context, p *partition, topic string, shard int, deliveries <-chan amqp.Delivery) bool {
	redelivered := s.g.w.metrics.redelivered.WithLabelValues(s.g.name, topic)
	recs := make([]*kgo.Record, 0, rabbitDrainMax)
	users := map[string]int64{} // the batch's deliveries by validated user id
	take := func(d amqp.Delivery) {
		if d.Redelivered {
			redelivered.Inc()
			s.g.w.metrics.nRedelivered.Add(1)
		}
		users[d.UserId]++
		rec := rabbitmq.Record(&d, topic, shard)
		if s.g.w.cfg.IDFromPayloadHash && !rabbitmq.HasID(rec) {
			// The id the migration bridge gives its copy too.
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: []byte(rabbitmq.DerivedID(&d))})
		}
		recs = append(recs, rec)
	}
	for {
		select {
		case <-ctx.Done():
			return true
		case d, ok := <-deliveries:
			if !ok {
				return ctx.Err() != nil
			}
			take(d)
		more:
			for len(recs) < rabbitDrainMax {
				select {
				case d, ok := <-deliveries:
					if !ok {
						break more
					}
					take(d)
				default:
					break more
				}
			}
			s.producers.note(topic, users, time.Now())
			clear(users)
			p.enqueue(recs, 0, time.Now())
			recs = recs[:0:0]
		}
	}
}

func (s *rabbitSource) register(tp topicPartition, ch *amqp.Channel) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.registered[tp] = ch
	s.g.w.metrics.assigned.WithLabelValues(s.g.name).Inc()
	s.g.joined.Store(len(s.registered) == s.total)
}

func (s *rabbitSource) unregister(tp topicPartition) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	delete(s.registered, tp)
	s.g.joined.Store(false)
}

// notReady names a shard queue the consumer is not registered on, "" when
// it is registered on all.
func (s *rabbitSource) notReady() string {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	for _, topic := range s.topics {
		for shard := range s.cfg.Shards {
			if _, ok := s.registered[topicPartition{topic, int32(shard)}]; !ok {
				return rabbitmq.QueueName(topic, shard, s.g.name)
			}
		}
	}
	return ""
}

// finished wakes the ack loop; p.mu is held.
func (s *rabbitSource) finished(p *partition, r *kgo.Record) {
	if s.g.w.cfg.unsafeRequeueRetries {
		if !p.requeued[r.Offset] {
			if err := p.rmq.Ack(uint64(r.Offset), false); err != nil {
				p.log.Warn("unsafe single ack failed", slog.String("error", err.Error()))
			}
		}
		delete(p.requeued, r.Offset)
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// ackLoop acknowledges what the partitions finished, soon after it
// finished (the prefetch would otherwise stall on acks that wait for an
// interval), and at least every CommitInterval.
func (s *rabbitSource) ackLoop(ctx context.Context) {
	t := time.NewTicker(s.g.w.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.g.beat.Store(time.Now().UnixNano())
		case <-s.kick:
		}
		s.g.commitOwned(ctx)
	}
}

// ack acknowledges p's deliveries up to its commit point, on the channel
// that delivered them; commitMu is held. Called only for partitions the
// consumer still owns: a lost one left g.parts before it could be reached.
func (s *rabbitSource) ack(p *partition) {
	cfg := &s.g.w.cfg
	if cfg.unsafeCommitBeforeDB || cfg.unsafeRequeueRetries {
		return // the negative controls acknowledge one by one
	}
	at, ok := p.uncommitted()
	if !ok {
		return
	}
	tag := uint64(at.Offset - 1)
	if h := cfg.hooks.rabbitAck; h != nil {
		h(tag)
	}
	// multiple=true: every lower tag of this channel is finished (the
	// commit point's guarantee), and the tag itself was never acknowledged
	// (the point only moves forward): RabbitMQ closes the channel on an
	// unknown tag.
	if err := p.rmq.Ack(tag, true); err != nil {
		s.g.w.metrics.nCommitErrors.Add(1)
		s.g.w.metrics.commitErrors.WithLabelValues(s.g.name).Inc()
		p.log.Warn("ack failed; the channel is gone and its deliveries come again", slog.String("error", err.Error()))
		return
	}
	p.committed(at)
}

// lagLoop sets each shard queue's lag gauge from its ready messages (read
// with a passive declaration) and its deliveries not finished yet, every
// lagInterval. The ready count comes on a channel of its own (a passive
// declaration that fails closes the channel it was asked on).
func (s *rabbitSource) lagLoop(ctx context.Context) {
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var total int64
		read := true
		for _, topic := range s.topicList() {
			for shard := range s.cfg.Shards {
				if ch == nil || ch.IsClosed() {
					conn, err := s.connection()
					if err != nil {
						read = false
						break
					}
					if ch, err = conn.Channel(); err != nil {
						ch, read = nil, false
						break
					}
				}
				q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(topic, shard, s.g.name), true, false, false, false, nil)
				if err != nil {
					read = false
					continue
				}
				// Ready in the queue, plus delivered and not finished (as
				// Kafka's lag counts from the first unfinished record).
				lag := q.Messages + s.g.pending(topic, shard)
				s.g.w.metrics.lag.WithLabelValues(s.g.name, topic, strconv.Itoa(shard)).Set(float64(lag))
				total += int64(lag)
			}
		}
		if !read {
			total = -1
		}
		s.lag.Store(total)
	}
}

// lagTotal is the consumer's lag summed over its shard queues at the last
// reading; ok false before a reading of every queue.
func (s *rabbitSource) lagTotal() (lag int64, ok bool) {
	lag = s.lag.Load()
	return lag, lag >= 0
}

// pending is how many deliveries of a shard queue's partition are not
// finished or wait behind one that is not.
func (g *groupConsumer) pending(topic string, shard int) int {
	g.mu.Lock()
	p := g.parts[topicPartition{topic, int32(shard)}]
	g.mu.Unlock()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tracker.Pending()
}

// settleFirst is the negative control's broken order: each delivery is
// acknowledged before its transaction, so a crash in between loses it.
func (s *rabbitSource) settleFirst(p *partition, ds []*delivery) {
	for _, d := range ds {
		if err := p.rmq.Ack(uint64(d.rec.Offset), false); err != nil {
			p.log.Warn("unsafe early ack failed", slog.String("error", err.Error()))
		}
	}
}

// requeue is the negative control's retry: the delivery goes back to the
// broker (on RabbitMQ 3.x to the back of a quorum queue) and the lane moves
// on, which reorders the aggregate.
func (p *partition) requeue(d *delivery) bool {
	p.mu.Lock()
	if p.requeued == nil {
		p.requeued = map[int64]bool{}
	}
	p.requeued[d.rec.Offset] = true
	p.mu.Unlock()
	if err := p.rmq.Nack(uint64(d.rec.Offset), false, true); err != nil {
		p.log.Warn("unsafe requeue failed", slog.String("error", err.Error()))
	}
	p.metrics.retry()
	p.finish(d.rec)
	d.endSpan("requeued", d.lastErr)
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// deadLetterPublisher publishes a consumer's dead letters on a connection of
// its own (TCP pushback on publishes must not delay the consuming
// connection's acks), one at a time, with confirms and mandatory.
type deadLetterPublisher struct {
	cfg  *RabbitMQConfig
	name string

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
	closed  atomic.Bool
}

// publish writes out, the dead letter of orig, to orig's topic's dead-letter
// exchange and waits for the broker's confirmation. A record AMQP cannot
// carry fails with rabbitmq.ErrMessageTooLarge or ErrInvalidRecord (refused
// for good: parked); a nack, a return (the .dlx bound to nothing) or a
// closed channel is an error to retry.
func (d *deadLetterPublisher) publish(ctx context.Context, out, orig *kgo.Record) error {
	exchange := orig.Topic + rabbitmq.DeadLetterExchangeSuffix
	rec := *out
	rec.Topic = exchange
	rec.Headers = make([]kgo.RecordHeader, 0, len(out.Headers)+1)
	for _, h := range out.Headers {
		if h.Key == HeaderDeadLetterOriginalOffset {
			// A delivery tag means nothing outside its channel.
			h.Value = nil
		}
		rec.Headers = append(rec.Headers, h)
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderDeadLetterOriginalQueue,
		Value: []byte(rabbitmq.QueueName(orig.Topic, int(orig.Partition), d.name))})
	rk, msg, err := rabbitmq.Publishing(&rec, d.cfg.Shards, "", rabbitmq.MaxMessageBytesDefault)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.channel(); err != nil {
		return err
	}
	for len(d.returns) > 0 {
		<-d.returns // of an earlier publish that failed before its confirm
	}
	returns := d.returns
	dc, err := d.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, rk, true, false, msg)
	if err != nil {
		d.reset()
		return fmt.Errorf("publish to %s: %w", exchange, err)
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		d.reset() // its confirmation would be taken for the next publish's
		return fmt.Errorf("publish to %s: no confirmation: %w", exchange, ctx.Err())
	}
	acked := dc.Acked()
	// The broker sends a return before the confirmation of its message,
	// and the library hands it over first: one publish at a time, so a
	// return now is this message's.
	select {
	case r, ok := <-returns:
		if ok {
			return fmt.Errorf("%w: %s returned it (%d %s)", rabbitmq.ErrUnroutable, exchange, r.ReplyCode, r.ReplyText)
		}
		// Closed: the channel is gone (a missing exchange closes it).
	default:
	}
	if !acked || d.ch.IsClosed() {
		why := "a nack"
		if d.ch.IsClosed() {
			why = "the channel closed"
			if e := d.closeErr(); e != nil {
				why += ": " + e.Error()
			}
			d.reset()
		}
		return fmt.Errorf("publish to %s: not confirmed (%s)", exchange, why)
	}
	return nil
}

// channel makes sure a confirm-mode channel is open; mu is held.
func (d *deadLetterPublisher) channel() error {
	if d.ch != nil && !d.ch.IsClosed() {
		return nil
	}
	d.reset()
	conn, err := d.cfg.conn(" " + d.name + " dead letters").Dial(rabbitNames)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("open a confirm channel: %w", err)
	}
	d.conn, d.ch = conn, ch
	d.returns = ch.NotifyReturn(make(chan amqp.Return, 16))
	d.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// closeErr is why the channel closed, if the broker said; mu is held.
func (d *deadLetterPublisher) closeErr() *amqp.Error {
	select {
	case e := <-d.closes:
		return e
	case <-time.After(100 * time.Millisecond):
		return nil
	}
}

// reset drops the connection; mu is held.
func (d *deadLetterPublisher) reset() {
	if d.conn != nil {
		_ = d.conn.Close()
	}
	d.conn, d.ch = nil, nil
}

func (d *deadLetterPublisher) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed.Store(true)
	d.reset()
}
