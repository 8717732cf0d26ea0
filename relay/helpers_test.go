package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// bundle is what a relay test needs: its own database, slot and topics.
type bundle struct {
	ctx    context.Context
	db     *ferrytest.DB
	prefix string // topic prefix: topics are <prefix>.<aggregate_type>
	slot   string
	cfg    relay.Config
}

func setup(t testing.TB) *bundle {
	t.Helper()
	return setupDB(t, ferrytest.NewMigratedDB(t))
}

// setupDB is setup on a database of the test's choosing.
func setupDB(t testing.TB, db *ferrytest.DB) *bundle {
	t.Helper()
	suffix := ferrytest.Suffix()
	b := &bundle{
		ctx:    ferrytest.Context(t, 5*time.Minute),
		db:     db,
		prefix: "relay." + suffix,
		slot:   "ferry_" + suffix,
	}
	b.cfg = relay.Config{
		DatabaseURL:   b.db.URL,
		Slot:          b.slot,
		Publication:   "ferry",
		TopicTemplate: b.prefix + ".{aggregate_type}",
		KafkaOpts:     []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(t)...)},
		Logger:        testLogger(t),
	}
	return b
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("FERRY_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// topic creates the topic of an aggregate type.
func (b *bundle) topic(t testing.TB, aggregateType string, partitions int32) string {
	name := b.prefix + "." + aggregateType
	ferrytest.CreateTopic(t, name, partitions)
	return name
}

// start runs a relay until the test ends and returns it once it streams:
// the slot only sees transactions that commit after it exists.
func (b *bundle) start(t testing.TB, cfg relay.Config) *relay.Relay {
	t.Helper()
	r, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		if err := <-done; err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for r.State() != relay.StateStreaming {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("relay stopped before streaming: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay did not start streaming; state %s", r.State())
		}
	}
	return r
}

// startStandby runs a second relay on the slot until the test ends and
// returns it once it stands by, waiting for the first to let the slot go.
func (b *bundle) startStandby(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	r, _ := runUntilStopped(t, cfg)
	waitState(t, r, relay.StateStandby)
	return r
}

// waitState waits up to a minute for r to reach want.
func waitState(t testing.TB, r *relay.Relay, want relay.State) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("relay is %s, want %s", r.State(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// write commits events in one transaction.
func (b *bundle) write(t testing.TB, events ...outbox.Event) []string {
	t.Helper()
	ids, err := outbox.Write(b.ctx, b.db.Pool, events...)
	if err != nil {
		t.Fatalf("write events: %v", err)
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// consumed is everything read from a set of topics, by outbox id.
type consumed struct {
	records []*kgo.Record
	byID    map[string]int // how often each id arrived
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// consume reads topics from the start until every id in want arrived, or
// fails the test after timeout. It keeps reading for settle afterwards to
// catch duplicates.
func consume(t *testing.T, topics []string, want []string, timeout, settle time.Duration) *consumed {
	t.Helper()
	cl := ferrytest.Client(t, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	c := &consumed{byID: map[string]int{}}
	missing := make(map[string]bool, len(want))
	for _, id := range want {
		missing[id] = true
	}
	deadline := time.Now().Add(timeout)
	var settleAt time.Time
	for {
		now := time.Now()
		if len(missing) == 0 && settleAt.IsZero() {
			settleAt = now.Add(settle)
		}
		if !settleAt.IsZero() && now.After(settleAt) {
			return c
		}
		if now.After(deadline) {
			t.Fatalf("after %s, %d of %d events never reached Kafka (e.g. %v)", timeout, len(missing), len(want), firstKeys(missing, 3))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fetches := cl.PollFetches(ctx)
		cancel()
		fetches.EachRecord(func(r *kgo.Record) {
			id := header(r, outbox.HeaderID)
			c.records = append(c.records, r)
			c.byID[id]++
			delete(missing, id)
		})
	}
}

func firstKeys(m map[string]bool, n int) []string {
	var out []string
	for k := range m {
		if len(out) == n {
			break
		}
		out = append(out, k)
	}
	return out
}

func (c *consumed) duplicates() int {
	n := 0
	for _, k := range c.byID {
		n += k - 1
	}
	return n
}

func evt(aggType, aggID string, seq int) outbox.Event {
	return outbox.Event{
		AggregateType: aggType,
		AggregateID:   aggID,
		EventType:     "Changed",
		Payload:       fmt.Appendf(nil, `{"seq":%d}`, seq),
		Headers:       map[string]string{"seq": fmt.Sprint(seq)},
	}
}

func isFatal(err, target error) bool {
	return errors.Is(err, target) && errors.Is(err, relay.ErrFatal)
}

// checkFirstArrivalOrder fails the test unless each aggregate's events
// (the record key) first arrived in the order of their "seq" header:
// duplicates may come later, an event never before an older one.
func (c *consumed) checkFirstArrivalOrder(t *testing.T) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, rec := range c.records {
		id := header(rec, outbox.HeaderID)
		if seen[id] {
			continue
		}
		seen[id] = true
		seq, _ := strconv.Atoi(header(rec, "seq"))
		agg := string(rec.Key)
		if prev, ok := last[agg]; ok && seq < prev {
			t.Errorf("aggregate %s: event %d first arrived after event %d", agg, seq, prev)
		}
		last[agg] = seq
	}
}

// serverVersionNum is the server's server_version_num (150018, 170010).
func serverVersionNum(t *testing.T, pool *pgxpool.Pool, b *bundle) int {
	t.Helper()
	var s string
	if err := pool.QueryRow(b.ctx, `SHOW server_version_num`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkFailoverSlot fails the test unless the relay's slot on pool is a
// failover slot, on PostgreSQL 17 and later (before, slots have no such
// property).
func (b *bundle) checkFailoverSlot(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if serverVersionNum(t, pool, b) < 170000 {
		return
	}
	var failover bool
	if err := pool.QueryRow(b.ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&failover); err != nil {
		t.Fatalf("read pg_replication_slots.failover of slot %s: %v", b.slot, err)
	}
	if !failover {
		t.Fatalf("slot %s has failover = false on PostgreSQL 17: a promoted standby would not carry it", b.slot)
	}
}
