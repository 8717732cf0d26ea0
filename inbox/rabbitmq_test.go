package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// TestRabbitExactlyOnceInOrder: every message reaches the handler once, in
// per-aggregate order, with several key lanes and batches; an inbox row per
// message; and after the stop nothing is left in the queues, so every
// delivery was acknowledged (after its commit: the acks follow the commit
// point).
func TestRabbitExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, nil)
	want := b.events(40, 25)
	cfg := b.config()
	cfg.KeyConcurrency = 4
	cfg.BatchSize = 8
	w, _ := New(cfg)
	w.Handle(b.consumer, b.topic, effectHandler)
	stop := b.start(w)
	waitReady(t, w)
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues after the stop: not acknowledged", n)
	}
	t.Logf("%d messages, stats %+v", want, w.Stats())
}

// TestRabbitAckOnlyAfterCommit: an ack is sent only for deliveries whose
// transaction committed: the ack hook sees every tag it acknowledges
// already committed.
func TestRabbitAckOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(5, 40)
	cfg := b.config()
	cfg.KeyConcurrency = 3
	cfg.BatchSize = 4
	var early, acks atomic.Int64
	w, _ := New(cfg)
	w.Handle(b.consumer, b.topic, effectHandler)
	// Each message handed to a handler records its delivery tag; an ack of
	// tag T must find every message with a tag <= T in the inbox.
	var tagsMu sync.Mutex
	tags := map[uint64]string{}
	w.Use(func(next Handler) Handler {
		return func(ctx context.Context, tx pgx.Tx, m *Message) error {
			tagsMu.Lock()
			tags[uint64(m.Offset)] = m.ID
			tagsMu.Unlock()
			return next(ctx, tx, m)
		}
	})
	// One shard, one channel: its tags run 1, 2, 3... with no gap, so an
	// ack of T covers exactly the tags 1..T, each of which must have been
	// handled and committed.
	var last uint64
	w.cfg.hooks.rabbitAck = func(tag uint64) {
		acks.Add(1)
		var ids []string
		tagsMu.Lock()
		for tg := last + 1; tg <= tag; tg++ {
			id, ok := tags[tg]
			if !ok {
				early.Add(1) // not even handled yet
				continue
			}
			ids = append(ids, id)
		}
		last = tag
		tagsMu.Unlock()
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM inbox WHERE consumer = $1 AND message_id = ANY($2)`, b.consumer, ids).Scan(&n); err != nil {
			t.Error(err)
		}
		early.Add(int64(len(ids) - n))
	}
	stop := b.start(w)
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	if early.Load() != 0 {
		t.Errorf("%d delivery tags acknowledged before their commit", early.Load())
	}
	if acks.Load() == 0 {
		t.Error("no ack seen")
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues after the stop", n)
	}
}

// TestRabbitClosedBeforeCommitIsRedelivered is the seed's "a consumer
// closes without ack": the connection dies while the first message is in
// its handler, before the commit. The broker redelivers it (Redelivered)
// on a new channel and it takes effect once.
func TestRabbitClosedBeforeCommitIsRedelivered(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(3, 10)
	cfg := b.config()
	w, _ := New(cfg)
	var cut atomic.Bool
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if cut.CompareAndSwap(false, true) {
			cutConnection(w)
			return errors.New("the connection went away under the handler")
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	st := w.Stats()
	if st.Redelivered == 0 || st.PartitionsLost == 0 {
		t.Errorf("stats %+v: want redeliveries and a lost channel", st)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
}

// TestRabbitAckLostAfterCommit is the seed's "the ack is lost after the
// commit": the connection dies after the commit, before its ack. The
// redelivery finds the inbox row: one effect, duplicates skipped.
func TestRabbitAckLostAfterCommit(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(3, 10)
	cfg := b.config()
	w, _ := New(cfg)
	var cut atomic.Bool
	w.cfg.hooks.rabbitAck = func(uint64) {
		if cut.CompareAndSwap(false, true) {
			cutConnection(w)
		}
	}
	w.Handle(b.consumer, b.topic, effectHandler)
	stop := b.start(w)
	b.waitEffects(want)
	deadline := time.Now().Add(30 * time.Second)
	for w.Stats().Duplicates == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	st := w.Stats()
	if st.Duplicates == 0 || st.Redelivered == 0 {
		t.Errorf("stats %+v: want the redelivered messages skipped as duplicates", st)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
	t.Logf("stats %+v", st)
}

// TestRabbitRetriesKeepOrder: a handler that fails transiently, then
// succeeds, is retried while its delivery is held: the aggregate's later
// events wait, no order inversion (a requeue would put it behind them).
func TestRabbitRetriesKeepOrder(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(4, 20)
	cfg := b.config()
	cfg.KeyConcurrency = 2
	w, _ := New(cfg)
	var mu sync.Mutex
	failed := map[string]int{}
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if strings.HasSuffix(m.ID, "-3") || strings.HasSuffix(m.ID, "-11") {
			mu.Lock()
			failed[m.ID]++
			n := failed[m.ID]
			mu.Unlock()
			if n <= 2 {
				return fmt.Errorf("transient failure %d", n)
			}
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	if st := w.Stats(); st.Retries == 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v: want retries and no dead letter", st)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
}

// TestRabbitPermanentFailureDeadLetters: a permanent failure goes to the
// topic's .dlq stream with Ferry's reason headers and the shard queue, and
// the original is acknowledged.
func TestRabbitPermanentFailureDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, nil)
	want := b.events(3, 5)
	cfg := b.config()
	w, _ := New(cfg)
	poison := b.consumer + "-k1-3"
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == poison {
			return Permanent(errors.New("no such product"))
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	b.waitEffects(want - 1)
	dls := b.deadLetters(1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	d := dls[0]
	h := func(k string) string { s, _ := d.Headers[k].(string); return s }
	if h("id") != poison || h(HeaderDeadLetterReason) != string(ReasonPermanent) || h(HeaderDeadLetterConsumer) != b.consumer ||
		h(HeaderDeadLetterOriginalTopic) != b.topic || !strings.Contains(h(HeaderDeadLetterError), "no such product") ||
		h(HeaderDeadLetterOriginalQueue) != rabbitmq.QueueName(b.topic, rabbitmq.Shard([]byte("k1"), 4), b.consumer) {
		t.Errorf("dead letter headers %v", d.Headers)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues: the dead-lettered original was not acknowledged", n)
	}
	if n := b.effects(); n != want-1 {
		t.Errorf("%d effects, want %d", n, want-1)
	}
}

// TestRabbitStopHandsOverInOrder: a worker that stops while a second one
// waits on the same queues (single active consumer) finishes, acknowledges
// and closes; the second takes over where it stopped, with no order
// inversion and no double effect.
func TestRabbitStopHandsOverInOrder(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 2 })
	slow := func(name string) Handler {
		return func(ctx context.Context, tx pgx.Tx, m *Message) error {
			time.Sleep(time.Millisecond)
			return insertEffect(ctx, tx, m, name)
		}
	}
	newWorker := func(name string) *Worker {
		cfg := b.config()
		cfg.KeyConcurrency = 4
		cfg.BatchSize = 4
		w, _ := New(cfg)
		w.Handle(b.consumer, b.topic, slow(name))
		return w
	}
	a := newWorker("a")
	stopA := b.start(a)
	waitReady(t, a)
	bw := newWorker("b")
	b.start(bw)
	waitReady(t, bw)
	want := b.events(30, 30)
	// Stop a while it applies.
	deadline := time.Now().Add(60 * time.Second)
	for b.effects() < want/4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	b.waitEffects(want)
	b.check(want)
	var byA, byB int
	_ = b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE worker = 'a'), count(*) FILTER (WHERE worker = 'b') FROM effects`).Scan(&byA, &byB)
	if byA == 0 || byB == 0 {
		t.Errorf("effects by a %d, by b %d: want both", byA, byB)
	}
	t.Logf("a applied %d, b %d", byA, byB)
}

// TestRabbitTLSAndWrongPassword: the worker consumes over amqps with the
// stack's CA and its own user; a wrong password fails Run at start with an
// error that says so, without the password.
func TestRabbitTLSAndWrongPassword(t *testing.T) {
	t.Parallel()
	tlsURL := needEnv(t, "FERRY_TEST_RABBITMQ_TLS_URL")
	ca := needEnv(t, "FERRY_TEST_RABBITMQ_CA_FILE")
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(2, 5)
	cfg := b.config()
	cfg.RabbitMQ.URL, cfg.RabbitMQ.TLSCAFile = tlsURL, ca
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.Handle(b.consumer, b.topic, effectHandler)
	stop := b.start(w)
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)

	bad := b.config()
	bad.RabbitMQ.Password = "not-the-password-42"
	w2, _ := New(bad)
	w2.Handle(b.consumer, b.topic, effectHandler)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err = w2.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "wrong password") || strings.Contains(err.Error(), "not-the-password-42") {
		t.Fatalf("Run with a wrong password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

// TestRabbitBrokerDeliveryLimitDeadLetter: a message whose consumer dies
// holding it, again and again, is dead-lettered by the broker itself past
// the queue's delivery limit, into the same .dlq stream as Ferry's dead
// letters, with x-death reason delivery_limit; the others take effect.
func TestRabbitBrokerDeliveryLimitDeadLetter(t *testing.T) {
	t.Parallel()
	// Prefetch 1: only the poison message is held when the connection dies,
	// so only its delivery count rises.
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1; c.DeliveryLimit = 2; c.Prefetch = 1 })
	want := b.events(2, 4)
	poison := b.consumer + "-k0-2"
	cfg := b.config()
	w, _ := New(cfg)
	var cuts atomic.Int64
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == poison {
			cuts.Add(1)
			cutConnection(w)
			return errors.New("the worker dies holding this message")
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	b.waitEffects(want - 1)
	dls := b.deadLetters(1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	d := dls[0]
	if id, _ := d.Headers["id"].(string); id != poison || rabbitmq.DeathReason(&d) != "delivery_limit" ||
		rabbitmq.DeathQueue(&d) != rabbitmq.QueueName(b.topic, 0, b.consumer) {
		t.Errorf("broker dead letter: id %v, reason %q, queue %q", d.Headers["id"], rabbitmq.DeathReason(&d), rabbitmq.DeathQueue(&d))
	}
	if n := b.effects(); n != want-1 {
		t.Errorf("%d effects, want %d", n, want-1)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
	t.Logf("the connection was cut %d times holding the poison message", cuts.Load())
	// What `worker dlq list` shows.
	listed, err := ListRabbitMQDeadLetters(b.ctx, &b.rcfg, b.topic+rabbitmq.DeadLetterStreamSuffix, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Reason != ReasonDeliveryLimit || listed[0].Consumer != b.consumer || listed[0].ID != poison ||
		listed[0].OriginalTopic != b.topic || listed[0].OriginalQueue != rabbitmq.QueueName(b.topic, 0, b.consumer) {
		t.Errorf("listed %+v", listed)
	}
}

// TestRabbitRedriveAppliesOnce: a dead letter redriven (twice) to its shard
// queue takes effect once: the second copy is a duplicate.
func TestRabbitRedriveAppliesOnce(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 2 })
	want := b.events(2, 3)
	poison := b.consumer + "-k1-2"
	var refuse atomic.Bool
	refuse.Store(true)
	cfg := b.config()
	w, _ := New(cfg)
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == poison && refuse.Load() {
			return Permanent(errors.New("not yet"))
		}
		return effectHandler(ctx, tx, m)
	})
	b.start(w)
	b.waitEffects(want - 1)
	stream := b.topic + rabbitmq.DeadLetterStreamSuffix
	b.deadLetters(1)
	listed, err := ListRabbitMQDeadLetters(b.ctx, &b.rcfg, stream, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Reason != ReasonPermanent || listed[0].ID != poison || listed[0].Consumer != b.consumer {
		t.Fatalf("listed %+v", listed)
	}
	refuse.Store(false)
	for range 2 {
		res, err := RedriveRabbitMQ(b.ctx, &b.rcfg, stream, &DeadLetterFilter{IDs: []string{poison}}, time.Second)
		if err != nil || len(res.Redriven) != 1 {
			t.Fatalf("redrive: %+v, %v", res, err)
		}
	}
	b.waitEffects(want)
	deadline := time.Now().Add(30 * time.Second)
	for w.Stats().Duplicates == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// Not b.check: a redriven event comes after its aggregate's later ones,
	// as on Kafka; what must hold is one effect each.
	var total, distinct int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != want || distinct != want {
		t.Errorf("%d effects of %d messages, want %d of %d", total, distinct, want, want)
	}
	if st := w.Stats(); st.Duplicates != 1 {
		t.Errorf("stats %+v: want the second redrive skipped as a duplicate", st)
	}
}

// TestRabbitUndeliverableDeadLetterIsParked: a message whose dead letter
// AMQP cannot carry (its 300-byte id cannot be a message id, a short
// string) neither blocks its shard nor is lost: it goes to inbox_parked,
// the original is acknowledged, and the next message is applied.
func TestRabbitUndeliverableDeadLetterIsParked(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	longID := strings.Repeat("i", 300)
	rk, msg, err := rabbitmq.Publishing(b.record("short", "k", 1), 1, "", rabbitmq.MaxMessageBytesDefault)
	if err != nil {
		t.Fatal(err)
	}
	msg.Headers["id"], msg.MessageId = longID, ""
	if err := b.pub.PublishWithContext(b.ctx, b.topic, rk, true, false, msg); err != nil {
		t.Fatal(err)
	}
	b.publish(b.record(b.consumer+"-next", "k", 2))
	w, _ := New(b.config())
	w.Handle(b.consumer, b.topic, effectHandler)
	stop := b.start(w)
	b.waitEffects(1)
	deadline := time.Now().Add(30 * time.Second)
	for w.Stats().Parked == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var n int
	var reason, dlErr string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*), min(reason), min(dead_letter_error) FROM inbox_parked WHERE consumer = $1`, b.consumer).Scan(&n, &reason, &dlErr); err != nil {
		t.Fatal(err)
	}
	if n != 1 || reason != string(ReasonUndecodable) || !strings.Contains(dlErr, "cannot carry") {
		t.Errorf("parked %d, reason %q, dead-letter error %q", n, reason, dlErr)
	}
	if q := b.queued(); q != 0 {
		t.Errorf("%d messages left in the queue: the parked one was not acknowledged", q)
	}
}

// TestRabbitStuckDeadLetterIsNotReady: a dead letter the broker cannot take
// for now (the topic's .dlx is gone: the publish fails) holds the delivery,
// and Ready names the shard and why, until the exchange is back; then the
// dead letter is written and the original acknowledged.
func TestRabbitStuckDeadLetterIsNotReady(t *testing.T) {
	t.Parallel()
	t.Run("exchange gone", func(t *testing.T) {
		t.Parallel()
		testStuckDeadLetter(t, func(ch *amqp.Channel, topic string) error {
			return ch.ExchangeDelete(topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
		}, "NOT_FOUND")
	})
	// With mandatory, a .dlx that routes nowhere returns the dead letter:
	// not acknowledged and forgotten.
	t.Run("unroutable", func(t *testing.T) {
		t.Parallel()
		testStuckDeadLetter(t, func(ch *amqp.Channel, topic string) error {
			_, err := ch.QueueDelete(topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
			return err
		}, "unroutable")
	})
}

func testStuckDeadLetter(t *testing.T, breakIt func(ch *amqp.Channel, topic string) error, want string) {
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	w, _ := New(b.config())
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if strings.HasSuffix(m.ID, "-poison") {
			return Permanent(errors.New("refused"))
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	waitReady(t, w) // it declared its topology: remove the .dlx now
	if err := breakIt(ch, b.topic); err != nil {
		t.Fatal(err)
	}
	b.publish(b.record(b.consumer+"-poison", "k", 1), b.record(b.consumer+"-next", "k", 2))
	deadline := time.Now().Add(30 * time.Second)
	var ready error
	for time.Now().Before(deadline) {
		if ready = w.Ready(); ready != nil && strings.Contains(ready.Error(), "cannot be written") && strings.Contains(ready.Error(), want) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ready == nil || !strings.Contains(ready.Error(), "cannot be written") {
		t.Fatalf("Ready = %v, want the stuck dead letter named", ready)
	}
	t.Logf("Ready: %v", ready)
	if n := b.effects(); n != 0 {
		t.Fatalf("%d effects while the shard waits on its dead letter, want 0", n)
	}
	if err := rabbitmq.DeclareExchange(ch, b.topic, ""); err != nil {
		t.Fatal(err)
	}
	b.waitEffects(1)
	if dls := b.deadLetters(1); len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	waitReady(t, w)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if q := b.queued(); q != 0 {
		t.Errorf("%d messages left in the queue", q)
	}
}

// TestRabbitLagGauge: ferry_worker_consumer_lag of a shard queue counts its
// ready messages and its deliveries not finished, as Kafka's counts from
// the first unfinished record to the high watermark.
func TestRabbitLagGauge(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1; c.Prefetch = 10 })
	want := b.events(1, 50)
	cfg := b.config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	release := make(chan struct{})
	w, _ := New(cfg)
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	lag := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ferry_worker_consumer_lag" {
				for _, m := range mf.GetMetric() {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	deadline := time.Now().Add(3 * lagInterval)
	for lag() != float64(want) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := lag(); got != float64(want) {
		t.Fatalf("lag %v while nothing is applied, want %d (40 ready + 10 held)", got, want)
	}
	close(release)
	b.waitEffects(want)
	deadline = time.Now().Add(3 * lagInterval)
	for lag() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := lag(); got != 0 {
		t.Errorf("lag %v once everything is applied, want 0", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// closeWorkerConnections has the broker close the worker's consuming
// connections of consumer (management API, as `rabbitmqctl
// close_connection` does), and returns how many it closed.
func closeWorkerConnections(t *testing.T, consumer string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		body, err := ferrytest.RabbitMQManagement(t, "GET", "/api/connections?columns=name,user_provided_name", nil)
		if err != nil {
			t.Fatal(err)
		}
		var conns []struct {
			Name string `json:"name"`
			User string `json:"user_provided_name"`
		}
		if err := json.Unmarshal(body, &conns); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range conns {
			if c.User == "ferry-worker "+consumer {
				if _, err := ferrytest.RabbitMQManagement(t, "DELETE", "/api/connections/"+url.PathEscape(c.Name), nil); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
		if n > 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRabbitBrokerClosesConnections: the broker closes the worker's
// connection twice while handlers hold deliveries (as an operator's
// close_connection or a node's restart would): every unacknowledged
// delivery comes again, redelivered, at the head of its queue; the
// transactions that commit after the close have their acks dropped, and
// their redeliveries are duplicates. One effect each, in order, and nothing
// left in the queues.
func TestRabbitBrokerClosesConnections(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, nil)
	cfg := b.config()
	cfg.KeyConcurrency = 2
	cfg.BatchSize = 4
	w, _ := New(cfg)
	var gateMu sync.Mutex
	var gate chan struct{} // nil: handlers run; else they wait for its close
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		gateMu.Lock()
		g := gate
		gateMu.Unlock()
		if g != nil {
			select {
			case <-g:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	waitReady(t, w)
	want := b.events(20, 30)
	closed := 0
	for _, at := range []int{want / 4, want / 2} {
		deadline := time.Now().Add(60 * time.Second)
		for b.effects() < at && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		g := make(chan struct{})
		gateMu.Lock()
		gate = g
		gateMu.Unlock()
		time.Sleep(100 * time.Millisecond) // handlers now hold their deliveries
		closed += closeWorkerConnections(t, b.consumer)
		gateMu.Lock()
		gate = nil
		gateMu.Unlock()
		close(g)
	}
	b.waitEffects(want)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	st := w.Stats()
	if closed != 2 || st.PartitionsLost < 2 || st.Redelivered == 0 {
		t.Errorf("closed %d connections, stats %+v: want 2 closed, channels lost and redeliveries", closed, st)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
	t.Logf("stats %+v", st)
}
