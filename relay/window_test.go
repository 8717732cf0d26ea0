package relay_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// stuckSink is the real Kafka client, except that the acknowledgements of
// one topic are held back until release: a partition that stops
// acknowledging.
type stuckSink struct {
	cl       *kgo.Client
	topic    string
	produced atomic.Int64
	mu       sync.Mutex
	released bool
	held     []func()
}

func (s *stuckSink) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	s.produced.Add(1)
	if r.Topic != s.topic {
		s.cl.Produce(ctx, r, promise)
		return
	}
	s.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		s.mu.Lock()
		if !s.released {
			s.held = append(s.held, func() { promise(r, err) })
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		promise(r, err)
	})
}

func (s *stuckSink) AbortBufferedRecords(ctx context.Context) error {
	return s.cl.AbortBufferedRecords(ctx)
}

func (s *stuckSink) release() {
	s.mu.Lock()
	s.released = true
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for _, f := range held {
		f()
	}
}

// One partition that stops acknowledging holds the confirmed position;
// what flows past it on other partitions counts against --max-in-flight
// too, so the relay stops reading at the bound instead of letting the
// window a crash republishes (and the retained WAL) grow without limit.
// Once the partition answers, everything is delivered and confirmed.
func TestStuckPartitionBoundsTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stuckTopic := b.topic(t, "stuck", 1)
	topic := b.topic(t, "order", 4)
	sink := &stuckSink{cl: ferrytest.Client(t), topic: stuckTopic}
	const bound = 100
	cfg := b.cfg
	cfg.Sink = sink
	cfg.MaxInFlightRecords = bound
	cfg.ServerTimeout = 3 * time.Second // not ready after 9 s without an answer
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	stuckIDs := b.write(t, evt("stuck", "s", 0))
	// The stuck event's commit ends at or before this position; a keepalive
	// may rightly confirm up to where its transaction begins, never past.
	var lsn string
	if err := b.db.Pool.QueryRow(b.ctx, "select pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	afterStuck, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 100 {
		events := make([]outbox.Event, 10)
		for j := range events {
			events[j] = evt("order", "agg-"+string(rune('a'+j)), i)
		}
		ids = append(ids, b.write(t, events...)...)
	}

	r := b.start(t, cfg)
	deadline := time.Now().Add(time.Minute)
	for sink.produced.Load() < bound {
		if time.Now().After(deadline) {
			t.Fatalf("the relay produced %d records in a minute, want %d", sink.produced.Load(), bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Give it every chance to read on and to report what it confirmed
	// (the figure is published with each status update).
	time.Sleep(time.Second)
	// The transaction being read may finish past the bound (a crash
	// republishes it whole anyway): one transaction is 10 records.
	if n := sink.produced.Load(); n > bound+10 {
		t.Fatalf("the relay produced %d records behind a partition that stopped acknowledging, more than --max-in-flight %d plus one transaction", n, bound)
	}
	if now := pglogrepl.LSN(r.Stats().ConfirmedLSN); now >= afterStuck {
		t.Fatalf("the confirmed position %s is past %s, the end of a record Kafka has not acknowledged", now, afterStuck)
	}

	// Stalled: records wait for Kafka's answer, and the relay says so.
	waitReady(t, r, "answered none")

	sink.release()
	consume(t, []string{stuckTopic, topic}, append(stuckIDs, ids...), 2*time.Minute, 0)
	waitReady(t, r, "")
	deadline = time.Now().Add(time.Minute)
	for pglogrepl.LSN(r.Stats().ConfirmedLSN) < afterStuck {
		if time.Now().After(deadline) {
			t.Fatal("the confirmed position did not pass the stuck record once its partition answered")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outstandingSink is the real Kafka client that keeps the most records it
// ever had produced and not yet answered.
type outstandingSink struct {
	cl        *kgo.Client
	mu        sync.Mutex
	out, most int
}

func (s *outstandingSink) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	s.mu.Lock()
	s.out++
	s.most = max(s.most, s.out)
	s.mu.Unlock()
	s.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		s.mu.Lock()
		s.out-- // before the relay hears of it, and may produce the next
		s.mu.Unlock()
		promise(r, err)
	})
}

func (s *outstandingSink) AbortBufferedRecords(ctx context.Context) error {
	return s.cl.AbortBufferedRecords(ctx)
}

// A transaction of far more records than --max-in-flight streams through
// it: only its unacknowledged records count while it is read, and nothing
// but Kafka's answers is needed to free them, so the relay reads on to its
// commit one record at a time, delivers it whole and confirms past it.
func TestLargeTransactionStreamsThroughAnInFlightBudgetOfOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 4)
	sink := &outstandingSink{cl: ferrytest.Client(t)}
	cfg := b.cfg
	cfg.Sink = sink
	cfg.MaxInFlightRecords = 1
	b.start(t, cfg)

	events := make([]outbox.Event, 200)
	for i := range events {
		events[i] = evt("order", fmt.Sprintf("agg-%d", i%16), i)
	}
	ids := b.write(t, events...)
	var end string
	if err := b.db.Pool.QueryRow(b.ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	consume(t, []string{topic}, ids, time.Minute, 0).checkFirstArrivalOrder(t)
	waitFor(t, "the slot to confirm past the large transaction", func() bool {
		var past bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			b.slot, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	sink.mu.Lock()
	most := sink.most
	sink.mu.Unlock()
	if most != 1 {
		t.Fatalf("at most %d records were out at a time, want 1 (--max-in-flight 1)", most)
	}
}
