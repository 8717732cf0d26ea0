package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// effectsTable is what the test handlers change. It has no unique
// constraint on purpose: a double effect shows as two rows.
const effectsTable = `CREATE TABLE effects (
    n          bigserial PRIMARY KEY,
    consumer   text NOT NULL,
    message_id text NOT NULL,
    key        text NOT NULL,
    seq        int  NOT NULL,
    attempt    int  NOT NULL,
    worker     text NOT NULL DEFAULT ''
)`

// bundle is what a worker test needs: its own database, topic, dead-letter
// topic, consumer name and a producer that picks partitions explicitly.
type bundle struct {
	t        *testing.T
	ctx      context.Context
	db       *ferrytest.DB
	topic    string
	dlq      string
	consumer string
	producer *kgo.Client
	kopts    []kgo.Opt
}

func setup(t *testing.T, partitions int32) *bundle {
	t.Helper()
	return setupDB(t, partitions, ferrytest.NewMigratedDB(t))
}

// setupDB is setup on a database of the test's choosing.
func setupDB(t *testing.T, partitions int32, db *ferrytest.DB) *bundle {
	t.Helper()
	ctx := ferrytest.Context(t, 3*time.Minute)
	if _, err := db.Pool.Exec(ctx, effectsTable); err != nil {
		t.Fatal(err)
	}
	topic := ferrytest.Topic(t, partitions)
	dlq := topic + DeadLetterSuffixDefault
	ferrytest.CreateTopic(t, dlq, 1)
	return &bundle{
		t:        t,
		ctx:      ctx,
		db:       db,
		topic:    topic,
		dlq:      dlq,
		consumer: ferrytest.Name(t, "c"),
		producer: ferrytest.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner())),
		kopts:    []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(t)...)},
	}
}

// record is a record as Ferry's relay publishes it; seq goes in the payload.
func (b *bundle) record(id, key string, partition int32, seq int) *kgo.Record {
	return &kgo.Record{
		Topic:     b.topic,
		Partition: partition,
		Key:       []byte(key),
		Value:     []byte(strconv.Itoa(seq)),
		Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte(id)},
			{Key: outbox.HeaderEventType, Value: []byte("Tested")},
			{Key: outbox.HeaderAggregateType, Value: []byte("test")},
			{Key: outbox.HeaderAggregateID, Value: []byte(key)},
			{Key: "content-type", Value: []byte("text/plain")},
		},
	}
}

func (b *bundle) produce(recs ...*kgo.Record) {
	b.t.Helper()
	if err := b.producer.ProduceSync(b.ctx, recs...).FirstErr(); err != nil {
		b.t.Fatalf("produce: %v", err)
	}
}

// config is a worker configuration with short waits, for tests.
func (b *bundle) config() *Config {
	return &Config{
		DB:              b.db.Pool,
		KafkaOpts:       append(b.kopts, kgo.FetchMaxWait(250*time.Millisecond)),
		RetryBackoff:    10 * time.Millisecond,
		RetryBackoffMax: 50 * time.Millisecond,
		CommitInterval:  50 * time.Millisecond,
		DrainTimeout:    10 * time.Second,
		Logger:          testLogger(b.t),
	}
}

// insertEffect is the test handlers' effect: one row per application.
func insertEffect(ctx context.Context, tx pgx.Tx, m *Message, worker string) error {
	seq, err := strconv.Atoi(string(m.Payload))
	if err != nil {
		return Undecodable(fmt.Errorf("payload %q is not a number", m.Payload))
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (consumer, message_id, key, seq, attempt, worker) VALUES ($1, $2, $3, $4, $5, $6)`,
		m.Consumer, m.ID, string(m.Key), seq, m.Attempt, worker)
	return err
}

func effectHandler(ctx context.Context, tx pgx.Tx, m *Message) error {
	return insertEffect(ctx, tx, m, "")
}

// start runs w until the test ends; the returned stop cancels it and
// returns Run's error.
func (b *bundle) start(w *Worker) (stop func() error) {
	b.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				err = errors.New("Run did not return within a minute of its context ending")
			}
		})
		return err
	}
	b.t.Cleanup(func() {
		if err := stop(); err != nil {
			b.t.Errorf("worker: %v", err)
		}
	})
	return stop
}

func (b *bundle) newWorker(cfg *Config, h Handler) *Worker {
	b.t.Helper()
	w, err := New(cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	w.Handle(b.consumer, b.topic, h)
	return w
}

// waitFor polls cond until it holds; the test fails when its context ends
// first.
func (b *bundle) waitFor(what string, cond func() (bool, error)) {
	b.t.Helper()
	for {
		ok, err := cond()
		if err != nil {
			b.t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("gave up waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *bundle) count(query string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, query, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (b *bundle) effects(id string) int {
	b.t.Helper()
	return b.count(`SELECT count(*) FROM effects WHERE message_id = $1`, id)
}

// committed returns the group's committed offset of a partition, -1 when
// none.
func (b *bundle) committed(group string, partition int32) int64 {
	b.t.Helper()
	offs, err := ferrytest.Admin(b.t).FetchOffsets(b.ctx, group)
	if err != nil {
		b.t.Logf("fetch offsets of %s: %v", group, err)
		return -1
	}
	o, ok := offs.Lookup(b.topic, partition)
	if !ok || o.Err != nil {
		return -1
	}
	return o.At
}

// waitCommitted waits until the group committed at least offset on a
// partition.
func (b *bundle) waitCommitted(group string, partition int32, offset int64) {
	b.t.Helper()
	b.waitFor(fmt.Sprintf("%s to commit %s/%d at %d", group, b.topic, partition, offset), func() (bool, error) {
		return b.committed(group, partition) >= offset, nil
	})
}

func (b *bundle) deadLetters() []DeadLetter {
	b.t.Helper()
	dls, err := ListDeadLetters(b.ctx, b.kopts, b.dlq, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return dls
}

// testLogger writes the worker's warnings and errors to the test log, until
// the test ends.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.done.Store(true) })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	t    *testing.T
	done atomic.Bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(string(p))
	}
	return len(p), nil
}
