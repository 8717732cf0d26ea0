package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// fakeChannel is a rabbitChannel fed by the test instead of amqp091-go:
// the test plays the reader goroutine, sending returns and confirmations
// in the order the broker's frames would bring them.
type fakeChannel struct {
	c       *rabbitChannel
	mu      sync.Mutex
	answers map[string][]error // record id -> what its promise got
	done    chan struct{}
}

func newFakeChannel(t *testing.T, window int) *fakeChannel {
	t.Helper()
	s := &rabbitmqSink{shards: 16, nch: 1, window: window, log: slog.New(slog.DiscardHandler),
		m: newMetrics(nil, func() error { return nil })}
	rc := &rabbitConn{s: s, ready: make(chan struct{}), dead: make(chan struct{})}
	close(rc.ready) // no connection: fail closes nothing
	c := &rabbitChannel{rc: rc, pending: map[uint64]pendingPublish{},
		confirms: make(chan amqp.Confirmation, window+1),
		returns:  make(chan amqp.Return, window+1),
		closes:   make(chan *amqp.Error, 1)}
	c.cond = sync.NewCond(&c.mu)
	rc.chans = []*rabbitChannel{c}
	f := &fakeChannel{c: c, answers: map[string][]error{}, done: make(chan struct{})}
	go func() { defer close(f.done); c.confirmLoop() }()
	t.Cleanup(func() { rc.fail(errRabbitAbort) })
	return f
}

// publish registers a publish under tag, as publishLoop does.
func (f *fakeChannel) publish(tag uint64, id string) {
	rec := &kgo.Record{Topic: "outbox.t", Key: []byte(id)}
	f.c.mu.Lock()
	f.c.pending[tag] = pendingPublish{queuedRecord{rec: rec, promise: func(r *kgo.Record, err error) {
		f.mu.Lock()
		f.answers[id] = append(f.answers[id], err)
		f.mu.Unlock()
	}}, id}
	f.c.mu.Unlock()
}

func (f *fakeChannel) answer(t *testing.T, id string) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		a := f.answers[id]
		f.mu.Unlock()
		if len(a) > 1 {
			t.Fatalf("record %s answered %d times: %v", id, len(a), a)
		}
		if len(a) == 1 {
			return a[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s never answered", id)
		}
		time.Sleep(time.Millisecond)
	}
}

// A return is matched to its own publish by message id, whatever the
// other publishes around it: only the returned one is unroutable.
func TestRabbitConfirmLoopMatchesReturnsByMessageID(t *testing.T) {
	t.Parallel()
	const n = 10_000
	f := newFakeChannel(t, n)
	for i := 1; i <= n; i++ {
		f.publish(uint64(i), fmt.Sprint("id-", i))
	}
	// The broker's frames: each returned publish's basic.return comes
	// before its basic.ack, as amqp091-go's reader delivers them.
	for i := 1; i <= n; i++ {
		if i%7 == 0 {
			f.c.returns <- amqp.Return{MessageId: fmt.Sprint("id-", i), ReplyCode: amqp.NoRoute}
		}
		f.c.confirms <- amqp.Confirmation{DeliveryTag: uint64(i), Ack: true}
	}
	for i := 1; i <= n; i++ {
		err := f.answer(t, fmt.Sprint("id-", i))
		switch {
		case i%7 == 0 && !errors.Is(err, rabbitmq.ErrUnroutable):
			t.Fatalf("publish %d was returned, answered %v", i, err)
		case i%7 != 0 && err != nil:
			t.Fatalf("publish %d was acked without a return, answered %v", i, err)
		}
	}
}

// A nack fails every record pending on the connection as transient (no
// quarantine, no resend in place), each exactly once.
func TestRabbitConfirmLoopNackFailsEveryPending(t *testing.T) {
	t.Parallel()
	f := newFakeChannel(t, 16)
	for i := 1; i <= 5; i++ {
		f.publish(uint64(i), fmt.Sprint("id-", i))
	}
	f.c.confirms <- amqp.Confirmation{DeliveryTag: 1, Ack: true}
	f.c.confirms <- amqp.Confirmation{DeliveryTag: 2, Ack: false}
	if err := f.answer(t, "id-1"); err != nil {
		t.Fatalf("acked publish answered %v", err)
	}
	for i := 2; i <= 5; i++ {
		err := f.answer(t, fmt.Sprint("id-", i))
		if err == nil {
			t.Fatalf("publish %d pending behind a nack answered success", i)
		}
		if _, permanent := permanentReason(err); permanent {
			t.Fatalf("publish %d: a nack is not permanent: %v", i, err)
		}
		if _, held := refusalOf(err); held {
			t.Fatalf("publish %d: a nack is not held in place: %v", i, err)
		}
	}
	// A confirmation of the dead channel arriving late answers nothing again.
	f.c.confirms <- amqp.Confirmation{DeliveryTag: 3, Ack: true}
	time.Sleep(10 * time.Millisecond)
	f.answer(t, "id-3")
}

// A channel that closes with publishes unconfirmed (amqp091-go closes the
// listener) fails them as transient.
func TestRabbitConfirmLoopChannelCloseFailsPending(t *testing.T) {
	t.Parallel()
	f := newFakeChannel(t, 16)
	f.publish(1, "a")
	f.publish(2, "b")
	f.c.confirms <- amqp.Confirmation{DeliveryTag: 1, Ack: true}
	f.c.closes <- &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}
	close(f.c.confirms)
	if err := f.answer(t, "a"); err != nil {
		t.Fatalf("acked before the close, answered %v", err)
	}
	err := f.answer(t, "b")
	if !errors.Is(err, errRabbitClosed) {
		t.Fatalf("pending at the close answered %v, want errRabbitClosed", err)
	}
	if _, held := refusalOf(err); held {
		t.Fatalf("a closed channel is transient, not held: %v", err)
	}
	<-f.done
}

// The sink's errors land in the relay's classes.
func TestRabbitErrorsAreClassified(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("rabbitmq exchange x: %w", err) }
	if r, ok := permanentReason(wrap(rabbitmq.ErrMessageTooLarge)); !ok || r != ReasonMessageTooLarge {
		t.Errorf("too large: %q %t", r, ok)
	}
	if r, ok := permanentReason(wrap(rabbitmq.ErrInvalidRecord)); !ok || r != ReasonInvalidRecord {
		t.Errorf("invalid: %q %t", r, ok)
	}
	for err, want := range map[error]string{
		rabbitmq.ErrUnroutable: refusedUnroutable, rabbitmq.ErrExchangeMissing: refusedUnknownTopic, rabbitmq.ErrAccessRefused: refusedAuthz,
	} {
		if c, ok := refusalOf(wrap(err)); !ok || c != want {
			t.Errorf("%v: class %q %t, want %q", err, c, ok, want)
		}
		if _, ok := permanentReason(wrap(err)); ok {
			t.Errorf("%v is not permanent", err)
		}
	}
	for _, err := range []error{errRabbitNack, errRabbitClosed, errRabbitAbort} {
		if _, ok := refusalOf(err); ok {
			t.Errorf("%v is held, want a session failure", err)
		}
		if _, ok := permanentReason(err); ok {
			t.Errorf("%v is permanent, want a session failure", err)
		}
	}
}

// A fence's metadata asked of a RabbitMQ connection that failed is
// refused for good (errLayoutGone), so that the session ends and the next
// one dials anew, instead of asking the dead connection again forever;
// while the connection is still being dialed it is an ordinary error,
// asked again in place.
func TestRabbitLayoutOnAFailedConnectionEndsTheSession(t *testing.T) {
	s := &rabbitmqSink{shards: 8}
	rc := &rabbitConn{s: s, ready: make(chan struct{}), dead: make(chan struct{}), known: map[string]time.Time{}}
	s.cur = rc
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := (rabbitLayout{s}).counts(ctx, "orders"); err == nil || errors.Is(err, errLayoutGone) {
		t.Fatalf("counts while dialing = %v, want a timeout to ask again, not errLayoutGone", err)
	}
	rc.failErr = fmt.Errorf("%w: the connection: CONNECTION_FORCED", errRabbitClosed)
	close(rc.ready)
	close(rc.dead)
	if _, err := (rabbitLayout{s}).counts(context.Background(), "orders"); !errors.Is(err, errLayoutGone) || !errors.Is(err, errRabbitClosed) {
		t.Fatalf("counts on a failed connection = %v, want errLayoutGone wrapping the connection's error", err)
	}
}
