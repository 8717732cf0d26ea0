package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// rabbitChannelInFlight bounds the publishes of one channel waiting for
// their confirmation. The confirmation and return listeners are buffered to
// it, so that amqp091-go (which drops a notification a listener has not
// taken within 5 s) can never find them full: one confirmation and at most
// one return per publish. The relay's --max-in-flight bounds the whole.
const rabbitChannelInFlight = 4096

// rabbitProbeKey is the routing key of the probe publish that checks the
// write permission on an exchange: no shard queue is bound with it (shard
// keys are three digits), and the probe is not mandatory, so the broker
// drops it.
const rabbitProbeKey = "ferry.probe"

// Transient errors of the RabbitMQ sink: the outcome of the publishes in
// flight is unknown, the session fails and resends from the confirmed
// position, on a new connection.
var (
	errRabbitNack   = errors.New("rabbitmq nacked a publish (an internal error of a queue): outcome unknown")
	errRabbitClosed = errors.New("rabbitmq connection or channel closed with publishes unconfirmed")
	errRabbitAbort  = errors.New("rabbitmq sink aborted its buffered records")
)

// sinkBlocker is a Sink that can be blocked by the broker (RabbitMQ's
// resource alarms); Ready reports the reason.
type sinkBlocker interface {
	// Blocked returns why the broker blocks the sink's connection; "" when
	// it does not.
	Blocked() string
}

// rabbitmqSink publishes to RabbitMQ with the guarantees of the Kafka
// sink (see Sink): a promise exactly once per record, per-shard order, and
// an abort that fails everything unconfirmed.
//
//   - One publishing connection, recovery off (rabbitmq.Conn.Dial), and
//     cfg.Channels confirm-mode channels; shard s goes to channel s mod K,
//     always, so one shard's records leave in order on one channel.
//   - One goroutine per channel publishes from an unbounded queue (Produce
//     never waits: the replication loop calls it), with mandatory set,
//     persistent, the outbox id as message id, and the connection's user
//     as the validated user id (the broker refuses a publish whose user id
//     is not the connection's user, so a message carrying Ferry's relay
//     user came from a connection that logged in as it).
//   - One goroutine per channel reads the confirmations in tag order.
//     amqp091-go's single reader goroutine hands a basic.return to the
//     returns listener before it handles the basic.ack that follows it, so
//     draining the returns without blocking before each confirmation finds
//     that publish's return already there; returns are matched by message
//     id (they carry no tag). Ack: success; ack with a return:
//     rabbitmq.ErrUnroutable, held like an unknown topic; nack, a closed
//     channel or connection: every record unconfirmed on the connection
//     fails as transient, and the next session resends from the confirmed
//     position on a new connection, never one message in place.
//   - Before its first publish to an exchange (and every
//     Config.TopicConfigRefresh), a probe channel declares it passively and
//     publishes to it a message that routes nowhere: a missing exchange or
//     a refused write closes the probe channel, not a publishing one whose
//     confirms in flight it would kill. Meanwhile the exchange's records
//     wait, in order. A missing exchange answers rabbitmq.ErrExchangeMissing,
//     a refusal rabbitmq.ErrAccessRefused: both held in place. A
//     publishing channel closed by ACCESS_REFUSED (a permission revoked
//     since the probe) fails the connection like any close: the records of
//     a dead channel cannot be held in place without resending them on a
//     channel reopened mid-session, which could reorder; the new
//     connection probes again and holds the exchange then.
//   - Records AMQP cannot carry, or over MaxMessageBytes, are refused
//     before they are sent (rabbitmq.Publishing): a message over the
//     broker's max_message_size would close the channel, and the session
//     would fail on it forever.
type rabbitmqSink struct {
	conn     rabbitmq.Conn
	names    rabbitmq.Names
	shards   int
	nch      int
	maxBytes int
	window   int // rabbitChannelInFlight, or less
	ttl      time.Duration
	log      *slog.Logger
	m        *metrics
	// mandatory is false only in the negative control (ferryfault builds):
	// an unroutable message is then acknowledged and dropped.
	mandatory bool
	// confirmOnSend is the negative control's (ferryfault builds): a
	// record succeeds once written, before its confirmation.
	confirmOnSend bool
	// consumers must have their shard queues before an exchange is
	// published to (RabbitMQConfig.Consumers).
	consumers []string

	mu      sync.Mutex
	cur     *rabbitConn // nil: the next Produce dials a new one
	blocked atomic.Pointer[string]

	// learnMu guards learning, the exchanges being probed with their
	// records, as in kafkaSink. Records leave a queue under it.
	learnMu  sync.Mutex
	learning map[string]*learningTopic
}

func newRabbitMQSink(c *RabbitMQConfig, cfg *Config, m *metrics, log *slog.Logger) *rabbitmqSink {
	return &rabbitmqSink{
		conn:      c.conn(),
		names:     c.names(),
		shards:    c.Shards,
		nch:       c.Channels,
		maxBytes:  c.MaxMessageBytes,
		window:    min(rabbitChannelInFlight, cfg.MaxInFlightRecords+1),
		ttl:       cfg.TopicConfigRefresh,
		log:       log,
		m:         m,
		mandatory: !cfg.unsafeNoMandatory,
		// unsafeConfirmOnSend already confirms on send in the session;
		// the sink's own control answers the promise at the write, which
		// is what a relay that trusts the socket would do.
		confirmOnSend: cfg.unsafeRabbitConfirmOnSend,
		learning:      map[string]*learningTopic{},
		consumers:     c.Consumers,
	}
}

// current is the connection records go to, made (not dialed: its
// goroutine dials) when there is none.
func (s *rabbitmqSink) current() *rabbitConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		s.cur = newRabbitConn(s)
	}
	return s.cur
}

// Produce implements Sink. It never waits for the broker.
func (s *rabbitmqSink) Produce(_ context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	if faultDrop != nil && faultDrop(rec, s.log) {
		promise(rec, nil)
		return
	}
	rc := s.current()
	q := queuedRecord{rec: rec, promise: promise}
	s.learnMu.Lock()
	if l, ok := s.learning[rec.Topic]; ok {
		l.queue = append(l.queue, q)
		s.learnMu.Unlock()
		return
	}
	if !rc.knows(rec.Topic, s.ttl) {
		l := &learningTopic{queue: []queuedRecord{q}}
		s.learning[rec.Topic] = l
		s.learnMu.Unlock()
		go s.probeThenSend(rc, rec.Topic, l)
		return
	}
	rc.enqueue(q)
	s.learnMu.Unlock()
}

// probeThenSend probes an exchange, then sends l's records in order (those
// queued meanwhile included), or answers them all with the probe's error.
func (s *rabbitmqSink) probeThenSend(rc *rabbitConn, topic string, l *learningTopic) {
	err := rc.probe(context.Background(), topic)
	s.learnMu.Lock()
	if s.learning[topic] != l {
		s.learnMu.Unlock()
		return // aborted: AbortBufferedRecords answered the records
	}
	delete(s.learning, topic)
	if err == nil {
		rc.learned(topic)
		for _, q := range l.queue {
			rc.enqueue(q)
		}
	}
	s.learnMu.Unlock()
	if err != nil {
		for _, q := range l.queue {
			q.promise(q.rec, err)
		}
	}
}

// AbortBufferedRecords implements Sink: it fails every record queued or
// unconfirmed, closes the connection and lets the next Produce dial a new
// one. Frames of the old connection still in the kernel's buffers may
// reach the broker after the resend; they are duplicates, and the first
// copies keep their order.
func (s *rabbitmqSink) AbortBufferedRecords(context.Context) error {
	failLearning(&s.learnMu, s.learning, errRabbitAbort)
	s.Close()
	return nil
}

// Close closes the connection; records still unconfirmed fail.
func (s *rabbitmqSink) Close() {
	s.mu.Lock()
	rc := s.cur
	s.cur = nil
	s.mu.Unlock()
	if rc != nil {
		rc.fail(errRabbitAbort)
	}
}

// Ping checks that the connection is open and a channel answers: an idle
// relay's proof that RabbitMQ answers (see Relay.Ready).
func (s *rabbitmqSink) Ping(ctx context.Context) error {
	rc := s.current()
	conn, err := rc.wait(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Blocked implements sinkBlocker.
func (s *rabbitmqSink) Blocked() string {
	if p := s.blocked.Load(); p != nil {
		return *p
	}
	return ""
}

// rabbitConn is one connection's life: dialed by its own goroutine, failed
// as a whole, never reused after a failure.
type rabbitConn struct {
	s     *rabbitmqSink
	ready chan struct{} // closed once dialed, or failed
	dead  chan struct{} // closed by fail
	conn  *amqp.Connection
	chans []*rabbitChannel

	failOnce sync.Once
	failErr  error

	knownMu sync.Mutex
	known   map[string]time.Time // exchange -> when a probe found it writable

	probeMu      sync.Mutex
	probeCh      *amqp.Channel
	probeConfirm chan amqp.Confirmation
	probeClose   chan *amqp.Error
}

func newRabbitConn(s *rabbitmqSink) *rabbitConn {
	rc := &rabbitConn{s: s, ready: make(chan struct{}), dead: make(chan struct{}), known: map[string]time.Time{}}
	rc.chans = make([]*rabbitChannel, s.nch)
	for i := range rc.chans {
		c := &rabbitChannel{rc: rc, idx: i, pending: map[uint64]pendingPublish{}}
		c.cond = sync.NewCond(&c.mu)
		rc.chans[i] = c
	}
	go rc.dial()
	return rc
}

// dial connects, retrying with backoff until it succeeds or the connection
// is given up; records wait meanwhile, as franz-go's do for a broker that
// does not answer.
func (rc *rabbitConn) dial() {
	s := rc.s
	retry := backoff.Sequence{Base: reconnectBackoff, Ceiling: 15 * time.Second}
	for {
		conn, err := rc.open()
		if err == nil {
			rc.conn = conn
			close(rc.ready)
			return
		}
		wait := retry.Next()
		s.log.Warn("cannot connect to RabbitMQ; retrying", slog.String("rabbitmq", s.conn.Redacted()),
			slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		select {
		case <-rc.dead:
			close(rc.ready)
			return
		case <-time.After(wait):
		}
	}
}

// open dials and opens the publishing channels, in confirm mode, with
// their listeners.
func (rc *rabbitConn) open() (*amqp.Connection, error) {
	s := rc.s
	conn, err := s.conn.Dial(s.names)
	if err != nil {
		return nil, err
	}
	s.blocked.Store(nil)
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 16))
	go rc.watchBlocks(blocks)
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	for _, c := range rc.chans {
		if err := c.open(conn); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("open a publishing channel: %w", err)
		}
	}
	go func() {
		select {
		case e, ok := <-closes:
			if ok && e != nil {
				rc.s.m.channelCloses.WithLabelValues(closeCode(e)).Inc()
				rc.fail(fmt.Errorf("%w: the connection: %w", errRabbitClosed, e))
				return
			}
			rc.fail(fmt.Errorf("%w: the connection", errRabbitClosed))
		case <-rc.dead:
		}
	}()
	for _, c := range rc.chans {
		go c.publishLoop()
		go c.confirmLoop()
	}
	return conn, nil
}

// watchBlocks keeps the broker's connection.blocked reason for Ready. It
// reads at once, so amqp091-go never drops an unblock.
func (rc *rabbitConn) watchBlocks(blocks <-chan amqp.Blocking) {
	for b := range blocks {
		select {
		case <-rc.dead:
			continue // the block was this connection's; fail cleared it
		default:
		}
		if b.Active {
			reason := "RabbitMQ blocked the connection: " + b.Reason
			rc.s.blocked.Store(&reason)
			rc.s.log.Warn("rabbitmq blocks the relay's connection (a resource alarm): publishes wait", slog.String("reason", b.Reason))
		} else {
			rc.s.blocked.Store(nil)
			rc.s.log.Info("rabbitmq unblocked the relay's connection")
		}
	}
}

// wait returns the dialed connection, or why there is none.
func (rc *rabbitConn) wait(ctx context.Context) (*amqp.Connection, error) {
	select {
	case <-rc.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-rc.dead:
		return nil, rc.failErr
	default:
	}
	return rc.conn, nil
}

// gone reports whether the connection failed (fail).
func (rc *rabbitConn) gone() bool {
	select {
	case <-rc.dead:
		return true
	default:
		return false
	}
}

// fail gives the connection up: every record queued or unconfirmed on it
// fails with err (wrapped as transient), and the connection is closed.
func (rc *rabbitConn) fail(err error) {
	rc.failOnce.Do(func() {
		rc.failErr = err
		close(rc.dead)
		// A block is a connection's: the next one tells its own. Kept, it
		// would turn /readyz red with a stale reason for as long as the
		// relay has nothing to publish and dials no new connection.
		rc.s.blocked.Store(nil)
		var failed []queuedRecord
		for _, c := range rc.chans {
			failed = append(failed, c.drain()...)
		}
		for _, q := range failed {
			q.promise(q.rec, err)
		}
		go func() {
			<-rc.ready
			if rc.conn != nil {
				// A blocked connection may never answer connection.close.
				_ = rc.conn.CloseDeadline(time.Now().Add(5 * time.Second))
			}
		}()
		if !errors.Is(err, errRabbitAbort) {
			rc.s.log.Warn("rabbitmq publishing connection failed; the session resends from the confirmed position on a new one",
				slog.Int("unconfirmed", len(failed)), slog.String("error", err.Error()))
		}
	})
}

// knows reports whether a probe found topic's exchange writable within ttl.
func (rc *rabbitConn) knows(topic string, ttl time.Duration) bool {
	rc.knownMu.Lock()
	defer rc.knownMu.Unlock()
	at, ok := rc.known[topic]
	return ok && time.Since(at) < ttl
}

func (rc *rabbitConn) learned(topic string) {
	rc.knownMu.Lock()
	rc.known[topic] = time.Now()
	rc.knownMu.Unlock()
}

// shardOf is the shard a record goes to: its aggregate's, or for a
// migration fence the one it names (its partition).
func (s *rabbitmqSink) shardOf(rec *kgo.Record) int {
	if _, fence := rec.Context.(*fenceRecord); fence {
		return int(rec.Partition)
	}
	return rabbitmq.Shard(rec.Key, s.shards)
}

// enqueue hands q to its shard's channel, behind every earlier record of
// the shard; a dead connection fails it.
func (rc *rabbitConn) enqueue(q queuedRecord) {
	shard := rc.s.shardOf(q.rec)
	if !rc.chans[shard%len(rc.chans)].push(q) {
		q.promise(q.rec, rc.failErr)
	}
}

// probe checks, on the probe channel, that topic's exchange exists and the
// relay may write to it. A missing exchange, or a refused write, closes the
// probe channel (the next probe opens another); no publishing channel is
// touched. Nothing is remembered of a refusal: the next record asks again.
// A probe that outlives ctx gives its channel up, so that a late answer
// is never taken for the next probe's.
func (rc *rabbitConn) probe(ctx context.Context, topic string) error {
	conn, err := rc.wait(ctx)
	if err != nil {
		return err
	}
	rc.probeMu.Lock()
	defer rc.probeMu.Unlock()
	if rc.probeCh == nil || rc.probeCh.IsClosed() {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			rc.fail(fmt.Errorf("%w: open the probe channel: %w", errRabbitClosed, err))
			return rc.failErr
		}
		rc.probeCh = ch
		rc.probeConfirm = ch.NotifyPublish(make(chan amqp.Confirmation, 1))
		rc.probeClose = ch.NotifyClose(make(chan *amqp.Error, 1))
	}
	ch := rc.probeCh
	refused := func(e *amqp.Error) error {
		rc.probeCh = nil
		switch e.Code {
		case amqp.NotFound:
			return fmt.Errorf("rabbitmq exchange %s: %w (the workers' `worker schema` declares it): %w", topic, rabbitmq.ErrExchangeMissing, e)
		case amqp.AccessRefused:
			return fmt.Errorf("rabbitmq exchange %s: %w: user %q may not write to it: %w", topic, rabbitmq.ErrAccessRefused, rc.s.conn.User(), e)
		}
		return fmt.Errorf("%w: probe of exchange %s: %w", errRabbitClosed, topic, e)
	}
	if err := ch.ExchangeDeclarePassive(topic, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) {
			return refused(ae)
		}
		return fmt.Errorf("%w: probe of exchange %s: %w", errRabbitClosed, topic, err)
	}
	probe := amqp.Publishing{MessageId: "ferry-probe", UserId: rc.s.conn.User(), DeliveryMode: amqp.Transient}
	if err := ch.Publish(topic, rabbitProbeKey, false, false, probe); err != nil {
		rc.probeCh = nil
		return fmt.Errorf("%w: probe of exchange %s: %w", errRabbitClosed, topic, err)
	}
	select {
	case c, ok := <-rc.probeConfirm:
		if ok && c.Ack {
			return rc.consumerQueues(ch, topic)
		}
		if ok {
			rc.s.m.nacks.Inc()
			return fmt.Errorf("probe of exchange %s: %w", topic, errRabbitNack)
		}
		if e, ok := <-rc.probeClose; ok && e != nil {
			return refused(e)
		}
		rc.probeCh = nil
		return fmt.Errorf("%w: probe of exchange %s", errRabbitClosed, topic)
	case <-rc.dead:
		return rc.failErr
	case <-ctx.Done():
		rc.probeCh = nil
		go func() { _ = ch.Close() }() // may wait for a broker that does not answer
		return ctx.Err()
	}
}

// consumerQueues checks, on the probe channel, that every shard queue of
// each of Config.RabbitMQ.Consumers exists for topic: a queue that does
// not exist would let the exchange's events pass by its consumer unseen
// while other consumers' queues take them (no return comes). A missing one
// closes the probe channel, as a missing exchange does. probeMu is held.
func (rc *rabbitConn) consumerQueues(ch *amqp.Channel, topic string) error {
	for _, consumer := range rc.s.consumers {
		for shard := range rc.s.shards {
			q := rabbitmq.QueueName(topic, shard, consumer)
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err == nil {
				continue
			}
			rc.probeCh = nil
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return fmt.Errorf("rabbitmq exchange %s: %w: consumer %q has no queue %s (declare its queues with `worker schema`)",
					topic, rabbitmq.ErrConsumerQueuesMissing, consumer, q)
			}
			return fmt.Errorf("%w: probe of queue %s: %w", errRabbitClosed, q, err)
		}
	}
	return nil
}

// rabbitChannel is one confirm-mode channel and its two goroutines.
type rabbitChannel struct {
	rc       *rabbitConn
	idx      int
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closes   chan *amqp.Error

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []queuedRecord
	pending map[uint64]pendingPublish // delivery tag -> publish awaiting its confirmation
	closed  bool
}

type pendingPublish struct {
	queuedRecord
	id string // the message id, which a return carries
}

func (c *rabbitChannel) open(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	c.ch = ch
	// Sized to the in-flight bound: never full, so never dropped.
	c.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, c.rc.s.window+1))
	c.returns = ch.NotifyReturn(make(chan amqp.Return, c.rc.s.window+1))
	c.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// push queues q; false when the connection is failed.
func (c *rabbitChannel) push(q queuedRecord) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.queue = append(c.queue, q)
	c.cond.Signal()
	return true
}

// drain closes the channel's queue and returns every record not yet
// answered, for fail to answer.
func (c *rabbitChannel) drain() []queuedRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	out := c.queue
	c.queue = nil
	for tag, p := range c.pending {
		out = append(out, p.queuedRecord)
		delete(c.pending, tag)
	}
	c.cond.Broadcast()
	return out
}

// next waits for a record to publish and room in the window; false once
// the connection failed.
func (c *rabbitChannel) next() (queuedRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.closed && (len(c.queue) == 0 || len(c.pending) >= c.rc.s.window) {
		c.cond.Wait()
	}
	if c.closed {
		return queuedRecord{}, false
	}
	q := c.queue[0]
	c.queue[0] = queuedRecord{}
	c.queue = c.queue[1:]
	return q, true
}

// publishLoop is the channel's only publisher: one goroutine, so that the
// records of its shards leave in the order they were produced.
func (c *rabbitChannel) publishLoop() {
	s := c.rc.s
	user := s.conn.User()
	for {
		q, ok := c.next()
		if !ok {
			return
		}
		key, pub, err := rabbitmq.Publishing(q.rec, s.shards, user, s.maxBytes)
		if _, fence := q.rec.Context.(*fenceRecord); fence {
			key = rabbitmq.RoutingKey(int(q.rec.Partition))
		}
		if err != nil {
			// Never sent: quarantined (permanentReason).
			q.promise(q.rec, fmt.Errorf("rabbitmq exchange %s: %w", q.rec.Topic, err))
			continue
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			q.promise(q.rec, c.rc.failErr)
			return
		}
		tag := c.ch.GetNextPublishSeqNo()
		c.pending[tag] = pendingPublish{q, pub.MessageId}
		c.mu.Unlock()
		err = c.ch.Publish(q.rec.Topic, key, s.mandatory, false, pub)
		if err != nil {
			if c.take(tag) {
				q.promise(q.rec, fmt.Errorf("%w: publish: %w", errRabbitClosed, err))
			}
			c.rc.fail(fmt.Errorf("%w: publish on channel %d: %w", errRabbitClosed, c.idx, err))
			return
		}
		if s.confirmOnSend && c.take(tag) {
			q.promise(q.rec, nil) // the negative control: success before the confirm
		}
	}
}

// take removes tag from the pending publishes; false when someone else
// (fail) answered it already.
func (c *rabbitChannel) take(tag uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[tag]; !ok {
		return false
	}
	delete(c.pending, tag)
	c.cond.Signal()
	return true
}

// confirmLoop resolves the channel's publishes, in tag order (amqp091-go
// resequences), each once.
func (c *rabbitChannel) confirmLoop() {
	s := c.rc.s
	returned := map[string]int{} // message id -> returns not yet matched to their ack
	drainReturns := func() {
		for {
			select {
			case r := <-c.returns:
				returned[r.MessageId]++
			default:
				return
			}
		}
	}
	for conf := range c.confirms {
		// The return of this publish, if any, came before its ack: it is
		// in the buffer now.
		drainReturns()
		c.mu.Lock()
		p, ok := c.pending[conf.DeliveryTag]
		if ok {
			delete(c.pending, conf.DeliveryTag)
			c.cond.Signal()
		}
		c.mu.Unlock()
		wasReturned := returned[p.id] > 0
		if wasReturned {
			returned[p.id]--
			if returned[p.id] == 0 {
				delete(returned, p.id)
			}
		}
		if !ok {
			continue // answered already (fail, or the negative control)
		}
		switch {
		case !conf.Ack:
			s.m.nacks.Inc()
			p.promise(p.rec, errRabbitNack)
			c.rc.fail(fmt.Errorf("%w: channel %d, delivery tag %d", errRabbitNack, c.idx, conf.DeliveryTag))
		case wasReturned:
			s.m.returns.Inc()
			p.promise(p.rec, fmt.Errorf("rabbitmq exchange %s, routing key %s: %w", p.rec.Topic,
				rabbitmq.RoutingKey(s.shardOf(p.rec)), rabbitmq.ErrUnroutable))
		default:
			p.promise(p.rec, nil)
		}
	}
	// amqp091-go closes the listener when the channel closes: whatever is
	// still pending has an unknown outcome.
	var e *amqp.Error
	select {
	case e = <-c.closes:
	case <-c.rc.dead:
	case <-time.After(time.Second):
	}
	if e != nil {
		s.m.channelCloses.WithLabelValues(closeCode(e)).Inc()
		c.rc.fail(fmt.Errorf("%w: channel %d: %w", errRabbitClosed, c.idx, e))
		return
	}
	c.rc.fail(fmt.Errorf("%w: channel %d", errRabbitClosed, c.idx))
}

// closeCode is the AMQP reply code of a close, as a metric label.
func closeCode(e *amqp.Error) string { return fmt.Sprint(e.Code) }
