//go:build faults

package relay_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// These tests stop services the whole stack shares; they run alone, with
// `go test -tags faults -run Fault`, after the parallel suite.

// faultLoad writes until stopped and tolerates PostgreSQL going away: ids
// whose commit failed are remembered apart, as they may or may not exist.
type faultLoad struct {
	mu     sync.Mutex
	ids    []string
	failed int
	stop   chan struct{}
	done   chan struct{}
}

func (b *bundle) startFaultLoad(aggType string) *faultLoad {
	l := &faultLoad{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			events := make([]outbox.Event, 1+i%10)
			for j := range events {
				events[j] = evt(aggType, "agg-"+strconv.Itoa((i+j)%40), i)
			}
			ids, err := outbox.Write(b.ctx, b.db.Pool, events...)
			l.mu.Lock()
			if err != nil {
				l.failed++
			}
			for _, id := range ids {
				l.ids = append(l.ids, id.String())
			}
			l.mu.Unlock()
			if err != nil {
				time.Sleep(100 * time.Millisecond)
			} else {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	return l
}

func (l *faultLoad) finish() ([]string, int) {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids, l.failed
}

func (b *bundle) confirmedLSN(t *testing.T) string {
	t.Helper()
	st, err := relay.Status(b.ctx, b.db.Pool, b.slot)
	if err != nil {
		t.Fatal(err)
	}
	return st.ConfirmedFlushLSN
}

// The broker stops for 20 s under load: the relay confirms nothing new while
// it is down, resumes by itself, delivers everything and quarantines nothing.
func TestFaultBrokerOutage(t *testing.T) {
	b := setup(t)
	topic := b.topic(t, "order", 4)
	r := b.start(t, b.cfg)
	l := b.startFaultLoad("order")
	time.Sleep(2 * time.Second)

	ferrytest.Stack(t, "kafka-stop")
	stopped := time.Now()
	time.Sleep(5 * time.Second) // what was in flight at the stop has failed or been acknowledged
	during := b.confirmedLSN(t)
	time.Sleep(20*time.Second - time.Since(stopped))
	if after := b.confirmedLSN(t); after != during {
		t.Errorf("confirmed LSN moved from %s to %s while the broker was down", during, after)
	}
	ferrytest.Stack(t, "kafka-start")
	time.Sleep(3 * time.Second)
	ids, _ := l.finish()

	consume(t, []string{topic}, ids, 3*time.Minute, 0)
	if st := r.Stats(); st.Quarantined != 0 {
		t.Fatalf("%d events quarantined by a broker outage, want 0", st.Quarantined)
	}
	if r.State() != relay.StateStreaming {
		t.Fatalf("relay is %s after the outage, want streaming", r.State())
	}
}

// PostgreSQL restarts (immediate, a crash) under load: the relay reconnects
// and resumes from the slot; every committed event reaches Kafka.
func TestFaultPostgresRestart(t *testing.T) {
	b := setup(t)
	topic := b.topic(t, "order", 4)
	r := b.start(t, b.cfg)
	l := b.startFaultLoad("order")
	time.Sleep(2 * time.Second)
	ferrytest.Stack(t, "pg-restart", "immediate")
	time.Sleep(3 * time.Second)
	ids, failed := l.finish()
	t.Logf("%d events committed, %d write transactions failed during the restart", len(ids), failed)

	consume(t, []string{topic}, ids, 3*time.Minute, 0)
	deadline := time.Now().Add(30 * time.Second)
	for r.State() != relay.StateStreaming || r.Stats().Sessions < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("relay %s after %d sessions; want streaming in a second session", r.State(), r.Stats().Sessions)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A slot PostgreSQL invalidated (wal_status = lost) stops the relay with an
// error that names the slot and the way out; the slot is not recreated.
func TestFaultLostSlotIsFatal(t *testing.T) {
	b := setup(t)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, "ferry", nil); err != nil {
		t.Fatal(err)
	}
	setKeep := func(v string) {
		t.Helper()
		for _, stmt := range []string{`ALTER SYSTEM SET max_slot_wal_keep_size = '` + v + `'`, `SELECT pg_reload_conf()`} {
			if _, err := b.db.Pool.Exec(b.ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
	}
	setKeep("1MB")
	t.Cleanup(func() { setKeep("-1") })
	time.Sleep(200 * time.Millisecond) // the reload reaches the checkpointer
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE filler (body text)`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		// Enough WAL beyond the limit, and a checkpoint that removes it.
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000); SELECT pg_switch_wal(); CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		st, err := relay.Status(b.ctx, b.db.Pool, b.slot)
		if err != nil {
			t.Fatal(err)
		}
		if st.WALStatus == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot not invalidated: wal_status %q", st.WALStatus)
		}
	}
	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(b.ctx)
	if !errors.Is(err, relay.ErrSlotLost) || !errors.Is(err, relay.ErrFatal) || !strings.Contains(err.Error(), b.slot) ||
		!strings.Contains(err.Error(), "relay recover") {
		t.Fatalf("Run = %v, want ErrSlotLost naming %s and how to recover", err, b.slot)
	}
	st, _ := relay.Status(b.ctx, b.db.Pool, b.slot)
	if !st.Exists || st.WALStatus != "lost" {
		t.Fatalf("slot after Run: %+v; it must be left as it was, not recreated", st)
	}

	// The way out: recover replaces the lost slot (the outbox is empty
	// and younger than the window, hence Force).
	setKeep("-1")
	res, err := r.Recover(b.ctx, &relay.RecoverOpts{Force: true})
	if err != nil || res.Replaced != "dropped (lost)" {
		t.Fatalf("Recover of a lost slot = %+v, %v; want the lost slot dropped and replaced", res, err)
	}
	if st, _ := relay.Status(b.ctx, b.db.Pool, b.slot); !st.Exists || st.WALStatus == "lost" {
		t.Fatalf("slot after Recover: %+v, want a new, healthy one", st)
	}
}
