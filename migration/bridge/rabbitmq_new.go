package bridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
)

// publisher is where a session sends its copies: franz-go's client for a
// Kafka new channel, rabbitPublisher for a RabbitMQ one. Each promise is
// called once; an error that wraps errLost is transient (the session ends
// and the copy is made again by the next), any other is a refusal.
type publisher interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
	Close()
}

// errLost is a copy whose outcome is unknown: the new channel's connection
// or channel closed, or the broker nacked it.
var errLost = errors.New("bridge: the new RabbitMQ channel was lost with the copy unconfirmed")

// rabbitWindow bounds the publishes waiting for their confirm; the
// confirm and return listeners are buffered to it, so amqp091-go never
// finds them full.
const rabbitWindow = 4096

// rabbitPublisher publishes copies to a RabbitMQ new channel on one
// confirm-mode channel, in the order given, so that each shard's copies
// keep their order: mandatory and persistent, the id as message id, the
// shard of the key as routing key (rabbitmq.Publishing). A copy is
// acknowledged by its confirm; a return (no queue bound) or a record AMQP
// cannot carry is a refusal; a nack or a closed channel is transient
// (errLost). Before its first copy to an exchange it waits until every
// group of the plan has its shard queues there: a queue receives only what
// is published after it exists, and a copy routed to another group's
// queue alone is lost for the group whose queue is missing. Hold names
// what it waits for.
type rabbitPublisher struct {
	shards int
	user   string
	groups []string
	log    func(string)

	conn *amqp.Connection
	ch   *amqp.Channel

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []queuedCopy
	pending map[uint64]queuedCopy
	closed  bool
	checked map[string]bool // exchanges whose groups' queues exist
	hold    string          // what the publisher waits for; "" when nothing
	done    sync.WaitGroup
}

type queuedCopy struct {
	rec     *kgo.Record
	promise func(*kgo.Record, error)
	id      string // the message id, which a return carries
}

// newRabbitPublisher connects to the plan's RabbitMQ new channel.
func (b *Bridge) newRabbitPublisher(p migration.Plan) (*rabbitPublisher, error) {
	pc := rabbitmq.PlanChannel{Side: string(migration.NewSide), URL: p.New.URL, PasswordEnv: p.New.PasswordEnv,
		TLS: kafkaauth.TLSFiles{CA: p.New.TLSCAFile, Cert: p.New.TLSCertFile, Key: p.New.TLSKeyFile}}
	conn, err := pc.Conn(b.cfg.Getenv)
	if err != nil {
		return nil, fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
	}
	conn.Name = "ferry-bridge " + b.cfg.Plan + " (new)"
	c, err := conn.Dial(pc.Names())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLost, err)
	}
	ch, err := c.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w: %w", errLost, err)
	}
	rp := &rabbitPublisher{shards: p.New.Shards, user: conn.User(), groups: p.Groups, conn: c, ch: ch,
		pending: map[uint64]queuedCopy{}, checked: map[string]bool{},
		log: func(msg string) { b.log.Warn(msg) }}
	rp.cond = sync.NewCond(&rp.mu)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, rabbitWindow+1))
	returns := ch.NotifyReturn(make(chan amqp.Return, rabbitWindow+1))
	rp.done.Go(rp.publishLoop)
	rp.done.Go(func() { rp.confirmLoop(confirms, returns) })
	b.publisher.Store(rp)
	return rp, nil
}

// Produce queues r's copy; it never waits.
func (p *rabbitPublisher) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		promise(r, errLost)
		return
	}
	p.queue = append(p.queue, queuedCopy{rec: r, promise: promise})
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close closes the connection; every copy not confirmed fails with errLost.
func (p *rabbitPublisher) Close() {
	p.fail()
	_ = p.conn.Close()
	p.done.Wait()
}

// Hold is what the publisher waits for before it publishes on; "" when
// nothing.
func (p *rabbitPublisher) Hold() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hold
}

// fail answers every copy queued or unconfirmed with errLost, once.
func (p *rabbitPublisher) fail() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	out := p.queue
	p.queue = nil
	for tag, q := range p.pending {
		out = append(out, q)
		delete(p.pending, tag)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, q := range out {
		q.promise(q.rec, errLost)
	}
}

// next waits for a copy and room in the window; false once closed.
func (p *rabbitPublisher) next() (queuedCopy, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.closed && (len(p.queue) == 0 || len(p.pending) >= rabbitWindow) {
		p.cond.Wait()
	}
	if p.closed {
		return queuedCopy{}, false
	}
	q := p.queue[0]
	p.queue[0] = queuedCopy{}
	p.queue = p.queue[1:]
	return q, true
}

// publishLoop is the channel's only publisher, so copies leave in order.
func (p *rabbitPublisher) publishLoop() {
	for {
		q, ok := p.next()
		if !ok {
			return
		}
		if !p.awaitQueues(q.rec.Topic) {
			q.promise(q.rec, errLost)
			return
		}
		key, pub, err := rabbitmq.Publishing(q.rec, p.shards, p.user, rabbitmq.MaxMessageBytesDefault)
		if err != nil {
			q.promise(q.rec, fmt.Errorf("rabbitmq exchange %s: %w", q.rec.Topic, err))
			continue
		}
		q.id = pub.MessageId
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			q.promise(q.rec, errLost)
			return
		}
		tag := p.ch.GetNextPublishSeqNo()
		p.pending[tag] = q
		p.mu.Unlock()
		if err := p.ch.Publish(q.rec.Topic, key, true, false, pub); err != nil {
			p.fail()
			return
		}
	}
}

// awaitQueues waits until every group of the plan has its shard queues on
// exchange, checking every second; false once closed.
func (p *rabbitPublisher) awaitQueues(exchange string) bool {
	p.mu.Lock()
	ok := p.checked[exchange]
	p.mu.Unlock()
	for !ok {
		var missing []string
		for _, g := range p.groups {
			m, err := rabbitmq.Missing(p.conn, &rabbitmq.Topology{Consumer: g, Topics: []string{exchange}, Shards: p.shards})
			if err != nil {
				p.fail()
				return false
			}
			if len(m) > 0 {
				missing = append(missing, fmt.Sprintf("consumer %q has no queue %s", g, m[0]))
			}
		}
		ok = len(missing) == 0
		hold := ""
		if !ok {
			hold = "copies to exchange " + exchange + " wait for the groups' queues: " + strings.Join(missing, "; ")
		}
		p.mu.Lock()
		if ok {
			p.checked[exchange] = true
		}
		changed, closed := hold != p.hold, p.closed
		p.hold = hold
		p.mu.Unlock()
		if changed && hold != "" {
			p.log(hold)
		}
		if closed {
			return false
		}
		if !ok {
			time.Sleep(time.Second) // the broker cannot say when a queue appears
		}
	}
	return true
}

// confirmLoop answers each publish in tag order (amqp091-go resequences).
// amqp091-go hands a publish's basic.return to the returns listener
// before the basic.ack that follows it, so draining the returns before
// each confirm finds that publish's return there; they are matched by
// message id.
func (p *rabbitPublisher) confirmLoop(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	returned := map[string]int{}
	for conf := range confirms {
		for drained := false; !drained; {
			select {
			case r := <-returns:
				returned[r.MessageId]++
			default:
				drained = true
			}
		}
		p.mu.Lock()
		q, ok := p.pending[conf.DeliveryTag]
		delete(p.pending, conf.DeliveryTag)
		p.cond.Broadcast()
		p.mu.Unlock()
		wasReturned := returned[q.id] > 0
		if wasReturned {
			if returned[q.id]--; returned[q.id] == 0 {
				delete(returned, q.id)
			}
		}
		switch {
		case !ok:
		case !conf.Ack:
			q.promise(q.rec, errLost)
			p.fail()
		case wasReturned:
			q.promise(q.rec, fmt.Errorf("rabbitmq exchange %s: %w", q.rec.Topic, rabbitmq.ErrUnroutable))
		default:
			q.promise(q.rec, nil)
		}
	}
	p.fail() // the channel closed: what is pending has an unknown outcome
}
