package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// TestUnbindShardNeverRoutesToSomeConsumersOnly holds the
// rabbitmq-unbind-shard fault to what the suite says it is: shard 0
// unroutable for every consumer at once. A message the broker routes to
// one consumer's queue and not another's is lost for the other even with
// mandatory (it is not returned), which the relay cannot see; a fault that
// passes through that state makes the suite count losses Ferry is not
// asked to prevent. A publisher sends to shard 0 with mandatory as fast as
// confirms allow while the fault unbinds and binds the shard again; every
// message not returned must be in every consumer's queue.
func TestUnbindShardNeverRoutesToSomeConsumersOnly(t *testing.T) {
	ferrytest.RabbitMQURL(t) // skips with -short, fails without a stack
	ctx := ferrytest.Context(t, 2*time.Minute)
	o := Short()
	o.Broker, o.Shards, o.Log = BrokerRabbitMQ, 2, &testLog{t}
	p := &pipeline{o: &o, t0: time.Now(), topic: fmt.Sprintf("faults.unbind%d.item", time.Now().UnixNano()),
		consumers: []string{"faults.unbind.c1", "faults.unbind.c2", "faults.unbind.c3"},
		stack:     &Stack{RabbitMQURL: os.Getenv(ferrytest.EnvRabbitMQURL), RabbitMQPassword: os.Getenv(ferrytest.EnvRabbitMQPassword)}}
	if err := p.declareRabbitMQTopic(ctx, p.topic, p.consumers); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.deleteRabbitMQ)

	pub := startShardPublisher(t, ctx, p)
	for range 4 {
		pub.waitConfirmed(t, 200)
		if err := p.unbindShard(ctx, 0, false); err != nil {
			t.Fatal(err)
		}
		pub.waitReturned(t, 50)
		if err := p.unbindShard(ctx, 0, true); err != nil {
			t.Fatal(err)
		}
	}
	pub.waitConfirmed(t, 200)
	sent, returned := pub.stop(t)
	if returned == 0 {
		t.Fatalf("no message returned in %d: the fault never made shard 0 unroutable", sent)
	}
	conn, err := p.dialRabbit(ctx, "count")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.consumers {
		q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(p.topic, 0, c), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := sent - returned; q.Messages != want {
			t.Errorf("%s holds %d messages; %d were sent and %d returned unroutable, so %d reached some queue: %d lost for this consumer",
				q.Name, q.Messages, sent, returned, want, want-q.Messages)
		}
	}
}

// shardPublisher publishes to shard 0 of a pipeline's exchange with
// mandatory and confirms, counting confirms and returns.
type shardPublisher struct {
	cancel context.CancelFunc
	done   chan error

	mu                        sync.Mutex
	changed                   *sync.Cond
	sent, confirmed, returned int
}

func startShardPublisher(t *testing.T, ctx context.Context, p *pipeline) *shardPublisher {
	t.Helper()
	conn, err := p.dialRabbit(ctx, "publish")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	stopped, cancel := context.WithCancel(ctx)
	s := &shardPublisher{cancel: cancel, done: make(chan error, 1)}
	s.changed = sync.NewCond(&s.mu)
	go func() {
		for range returns {
			s.bump(func() { s.returned++ })
		}
	}()
	go func() {
		for c := range confirms {
			if !c.Ack {
				s.done <- fmt.Errorf("publish %d nacked", c.DeliveryTag)
				return
			}
			s.bump(func() { s.confirmed++ })
		}
	}()
	go func() {
		const window = 64
		for n := 0; stopped.Err() == nil; n++ {
			s.mu.Lock()
			for s.sent-s.confirmed >= window {
				s.changed.Wait()
			}
			s.sent++
			s.mu.Unlock()
			err := ch.PublishWithContext(ctx, p.topic, rabbitmq.RoutingKey(0), true, false,
				amqp.Publishing{MessageId: strconv.Itoa(n), DeliveryMode: amqp.Persistent, Body: []byte("x")})
			if err != nil {
				s.done <- err
				return
			}
		}
		s.done <- nil
	}()
	return s
}

func (s *shardPublisher) bump(f func()) {
	s.mu.Lock()
	f()
	s.mu.Unlock()
	s.changed.Broadcast()
}

// waitFor waits until count is n more than it was at the call.
func (s *shardPublisher) waitFor(t *testing.T, what string, n int, count func() int) {
	t.Helper()
	s.mu.Lock()
	from := count()
	s.mu.Unlock()
	s.until(t, func() error {
		if got := count() - from; got < n {
			return fmt.Errorf("%d of %d more messages %s", got, n, what)
		}
		return nil
	})
}

// until waits up to a minute for cond, called with s.mu held, to hold.
func (s *shardPublisher) until(t *testing.T, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s.mu.Lock()
		err := cond()
		s.mu.Unlock()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *shardPublisher) waitConfirmed(t *testing.T, n int) {
	t.Helper()
	s.waitFor(t, "confirmed", n, func() int { return s.confirmed })
}

func (s *shardPublisher) waitReturned(t *testing.T, n int) {
	t.Helper()
	s.waitFor(t, "returned", n, func() int { return s.returned })
}

// stop stops publishing and waits for every confirm; it returns how many
// messages were published and how many of them came back unroutable.
func (s *shardPublisher) stop(t *testing.T) (sent, returned int) {
	t.Helper()
	s.cancel()
	if err := <-s.done; err != nil {
		t.Fatal(err)
	}
	s.until(t, func() error {
		if s.confirmed < s.sent {
			return fmt.Errorf("%d of %d publishes confirmed", s.confirmed, s.sent)
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.returned
}
