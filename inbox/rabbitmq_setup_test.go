package inbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// needEnv is ferrytest's need for the RabbitMQ variables of the stack
// (scripts/stack up prints them): an integration test fails without them.
func needEnv(t testing.TB, env string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test: skipped with -short")
	}
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", env)
	}
	return v
}

// rbundle is what a RabbitMQ worker test needs: its own database, topic and
// consumer, the consumer's queues declared, and a connection that publishes
// as the relay does.
type rbundle struct {
	t        *testing.T
	ctx      context.Context
	db       *ferrytest.DB
	topic    string
	consumer string
	rcfg     RabbitMQConfig
	conn     *amqp.Connection
	pubMu    sync.Mutex
	pub      *amqp.Channel
}

func rabbitConfig(t testing.TB) RabbitMQConfig {
	return RabbitMQConfig{
		URL:      needEnv(t, "FERRY_TEST_RABBITMQ_URL"),
		Password: needEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD"),
		Shards:   4,
		Prefetch: 64,
	}
}

func setupRabbit(t *testing.T, mod func(*RabbitMQConfig)) *rbundle {
	t.Helper()
	ctx := ferrytest.Context(t, 3*time.Minute)
	b := &rbundle{t: t, ctx: ctx, rcfg: rabbitConfig(t)}
	if mod != nil {
		mod(&b.rcfg)
	}
	b.db = ferrytest.NewMigratedDB(t)
	if _, err := b.db.Pool.Exec(ctx, effectsTable); err != nil {
		t.Fatal(err)
	}
	b.topic = "outbox.event." + ferrytest.Name(t, "t")
	b.consumer = ferrytest.Name(t, "c")
	if _, err := DeclareRabbitMQ(ctx, &b.rcfg, b.consumer, []string{b.topic}); err != nil {
		t.Fatal(err)
	}
	d := b.rcfg.withDefaults()
	conn, err := d.conn(" test").Dial(rabbitNames)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	b.conn = conn
	if b.pub, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.deleteTopology() })
	return b
}

// deleteTopology removes the test's queues, exchanges and stream.
func (b *rbundle) deleteTopology() {
	d := b.rcfg.withDefaults()
	conn, err := d.conn(" test cleanup").Dial(rabbitNames)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for s := range b.rcfg.withDefaults().Shards {
		_, _ = ch.QueueDelete(rabbitmq.QueueName(b.topic, s, b.consumer), false, false, false)
	}
	_, _ = ch.QueueDelete(b.topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
	_ = ch.ExchangeDelete(b.topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
	_ = ch.ExchangeDelete(b.topic, false, false)
}

// publish sends events as the relay does (rabbitmq.Publishing, mandatory,
// confirms), in order, and waits for the confirms.
func (b *rbundle) publish(recs ...*kgo.Record) {
	b.t.Helper()
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	var dcs []*amqp.DeferredConfirmation
	for _, r := range recs {
		rk, p, err := rabbitmq.Publishing(r, b.rcfg.withDefaults().Shards, "", rabbitmq.MaxMessageBytesDefault)
		if err != nil {
			b.t.Fatal(err)
		}
		dc, err := b.pub.PublishWithDeferredConfirmWithContext(b.ctx, r.Topic, rk, true, false, p)
		if err != nil {
			b.t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(b.ctx); !ok || err != nil {
			b.t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

func (b *rbundle) record(id, key string, seq int) *kgo.Record {
	return &kgo.Record{
		Topic: b.topic,
		Key:   []byte(key),
		Value: []byte(strconv.Itoa(seq)),
		Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte(id)},
			{Key: outbox.HeaderEventType, Value: []byte("Tested")},
			{Key: outbox.HeaderAggregateType, Value: []byte("test")},
			{Key: outbox.HeaderAggregateID, Value: []byte(key)},
		},
		Timestamp: time.Now(),
	}
}

// events publishes keys x n events, seq 1..n per key, interleaved.
func (b *rbundle) events(keys, n int) int {
	var recs []*kgo.Record
	for s := 1; s <= n; s++ {
		for k := range keys {
			recs = append(recs, b.record(fmt.Sprintf("%s-k%d-%d", b.consumer, k, s), fmt.Sprintf("k%d", k), s))
		}
	}
	for len(recs) > 0 {
		m := min(len(recs), 500)
		b.publish(recs[:m]...)
		recs = recs[m:]
	}
	return keys * n
}

func (b *rbundle) config() *Config {
	r := b.rcfg
	return &Config{
		DB:              b.db.Pool,
		RabbitMQ:        &r,
		RetryBackoff:    10 * time.Millisecond,
		RetryBackoffMax: 50 * time.Millisecond,
		CommitInterval:  50 * time.Millisecond,
		DrainTimeout:    10 * time.Second,
		Logger:          testLogger(b.t),
	}
}

func (b *rbundle) start(w *Worker) (stop func() error) {
	kb := &bundle{t: b.t}
	return kb.start(w)
}

// effects counts the test handler's rows.
func (b *rbundle) effects() int {
	b.t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

func (b *rbundle) waitEffects(want int) {
	b.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		n := b.effects()
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%d effects after 90s, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check asserts exactly one effect per message and, per key, effects in
// seq order; it returns the order inversions it saw (reported as errors).
func (b *rbundle) check(want int) {
	b.t.Helper()
	var total, distinct int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&total, &distinct); err != nil {
		b.t.Fatal(err)
	}
	if total != want || distinct != want {
		b.t.Errorf("%d effects of %d messages, want %d of %d (exactly once)", total, distinct, want, want)
	}
	var inversions int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (
		SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY n) AS inv FROM effects) x WHERE inv`).Scan(&inversions); err != nil {
		b.t.Fatal(err)
	}
	if inversions != 0 {
		b.t.Errorf("%d per-aggregate order inversions, want 0", inversions)
	}
	var rows int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM inbox WHERE consumer = $1`, b.consumer).Scan(&rows); err != nil {
		b.t.Fatal(err)
	}
	if rows != want {
		b.t.Errorf("%d inbox rows, want %d", rows, want)
	}
}

// queued is the messages in the consumer's shard queues, ready or not
// acknowledged: read after the worker closed its channels, it is what was
// never acknowledged.
func (b *rbundle) queued() int {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	n := 0
	for s := range b.rcfg.withDefaults().Shards {
		q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(b.topic, s, b.consumer), true, false, false, false, nil)
		if err != nil {
			b.t.Fatal(err)
		}
		n += q.Messages
	}
	return n
}

// deadLetters reads the topic's .dlq stream.
func (b *rbundle) deadLetters(want int) []amqp.Delivery {
	b.t.Helper()
	var out []amqp.Delivery
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		out = out[:0]
		err := rabbitmq.ReadStream(b.ctx, b.conn, b.topic+rabbitmq.DeadLetterStreamSuffix, time.Second, func(d *amqp.Delivery) bool {
			out = append(out, *d)
			return true
		})
		if err != nil {
			b.t.Fatal(err)
		}
	}
	return out
}

// cutConnection closes the worker's consuming connection, as a broker
// restart or a network cut would.
func cutConnection(w *Worker) {
	for _, g := range *w.groups.Load() {
		s := g.src.(*rabbitSource)
		s.connMu.Lock()
		if c := s.conn; c != nil {
			_ = c.Close()
		}
		s.connMu.Unlock()
	}
}

func waitReady(t *testing.T, w *Worker) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := w.Ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
