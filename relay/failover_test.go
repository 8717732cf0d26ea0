//go:build faults

package relay_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// A real failover: a PostgreSQL 15 (or 16) streaming standby, promoted while the
// application writes, does not carry the relay's logical slot. The old
// primary's relay stopped shortly before (lagging behind, as every relay
// does when its server dies), so the standby holds events that never
// reached Kafka. The test proves that
//
//   - a relay pointed at the new primary never silently resumes: Run stops
//     with ErrSlotGone and creates no slot there, although the application
//     already writes to it;
//   - Recover, from what the standby replayed of ferry_relay_slot, creates
//     a new slot and republishes the gap, and the relay streams on from it;
//   - then every event the new primary's outbox holds (the truth after the
//     failover: written on the old primary and replayed, the unpublished
//     ones included, or written on the new one before, during or after the
//     recovery) reached Kafka, each aggregate's events in order of first
//     arrival.
//
// Events the old primary committed after the standby's last replayed point
// are lost by asynchronous replication, not by Ferry: they are not in the
// new primary's outbox, and the test only counts them.
func TestFaultFailoverToAPromotedStandby(t *testing.T) {
	began := time.Now()
	// The load's transactions take milliseconds: a second covers one that
	// began before the last confirmed commit and committed after it.
	const margin = time.Second
	b := setup(t)
	if v := serverVersionNum(t, b.db.Pool, b); v >= 170000 {
		t.Skipf("PostgreSQL %d carries the relay's failover slot to the standby: TestPostgreSQL17FailoverKeepsTheSlot is its test", v)
	}
	topic := b.topic(t, "order", 4)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	loadStart := time.Now()
	old := startLoadOn(b.ctx, t, b.db.Pool, "order", 0)
	oldFinished := false
	t.Cleanup(func() {
		if !oldFinished { // the test failed before the failover
			old.finish()
		}
	})
	r1, stop1 := runUntilStopped(t, b.cfg)

	// The standby must inherit a record of a confirmed commit past the
	// margin, so that the outbox holds rows older than the recovery's
	// window: otherwise Recover rightly refuses (ErrGapNotRetained).
	waitUntil(t, time.Minute, "the relay records a confirmed commit in ferry_relay_slot", func() bool {
		at := confirmedCommitAt(b.ctx, t, b.db.Pool, b.slot)
		return at != nil && at.After(loadStart.Add(2*margin))
	})
	sb := ferrytest.NewStandby(t)

	// The old primary's relay stops first, as one that lags behind its
	// server when the server dies: what the application commits from now on
	// reaches the standby but not Kafka, and only the recovery can publish
	// it.
	if err := stop1(); err != nil {
		t.Fatalf("the relay on the old primary: %v", err)
	}
	oldPublished := r1.Stats().Published
	unpublishedFrom := old.count()
	old.waitCount(t, unpublishedFrom+200)
	var mark string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	sb.WaitReplayed(t, mark, time.Minute)

	// The failover, under load. The old primary is dead from the promotion
	// on: in a real failover what it commits now is lost. Here it keeps
	// serving the other tests, so the application just stops writing to it.
	sb.Promote(t)
	oldIDs := old.finish()
	oldFinished = true

	newURL := sb.DatabaseURL(b.db.Name)
	pool, err := pgxpool.New(b.ctx, newURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nb := *b
	nb.db = &ferrytest.DB{Name: b.db.Name, URL: newURL, Pool: pool}
	nb.cfg.DatabaseURL = newURL
	if nb.slotExists(t) {
		t.Fatalf("slot %s exists on the promoted standby: this PostgreSQL carried it, the failover proves nothing", b.slot)
	}
	// The application fails over at once and writes to the new primary
	// before anyone recovers the relay; its numbers go on above the old.
	app := startLoadOn(b.ctx, t, pool, "order", 1_000_000)
	appFinished := false
	t.Cleanup(func() {
		if !appFinished {
			app.finish()
		}
	})
	app.waitCount(t, 50)

	// The relay refuses to start over from "now" on the new primary.
	r2, err := relay.New(&nb.cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	err = r2.Run(runCtx)
	cancel()
	if !isFatal(err, relay.ErrSlotGone) {
		t.Fatalf("Run on the promoted standby = %v, want ErrSlotGone", err)
	}
	if nb.slotExists(t) {
		t.Fatal("the relay created a new slot on the promoted standby by itself, skipping the events committed since the failover")
	}

	res, err := r2.Recover(b.ctx, &relay.RecoverOpts{Margin: margin})
	if err != nil {
		t.Fatalf("Recover on the promoted standby: %v", err)
	}
	if res.Republished == 0 || res.Replaced != "missing" || res.SlotLSN == "" {
		t.Fatalf("Recover = %+v, want republished events, a missing slot replaced and a new slot", res)
	}

	nb.start(t, nb.cfg)
	app.waitCount(t, app.count()+200) // and events after the recovery
	appIDs := app.finish()
	appFinished = true

	truth := outboxIDs(b.ctx, t, pool)
	written := make(map[string]bool, len(oldIDs)+len(appIDs))
	for _, id := range slices.Concat(oldIDs, appIDs) {
		written[id] = true
	}
	inTruth := make(map[string]bool, len(truth))
	for _, id := range truth {
		inTruth[id] = true
		if !written[id] {
			t.Fatalf("outbox row %s on the new primary was written by neither load", id)
		}
	}
	for _, id := range appIDs {
		if !inTruth[id] {
			t.Fatalf("event %s committed on the new primary is not in its outbox", id)
		}
	}
	replicated := len(truth) - len(appIDs)
	unpublished := 0 // replicated, committed after the old relay stopped
	for _, id := range oldIDs[unpublishedFrom:] {
		if inTruth[id] {
			unpublished++
		}
	}
	if unpublished == 0 {
		t.Fatal("the standby replayed nothing the old relay had not published: the recovery would have nothing to prove")
	}

	got := consume(t, []string{topic}, truth, 2*time.Minute, time.Second)
	// Each aggregate's events arrive, at their first arrival, in the order
	// they were written: the gap the recovery republished before anything
	// the new slot streams.
	got.checkFirstArrivalOrder(t)
	lost := len(oldIDs) - replicated
	t.Logf("%d events in the new primary's outbox: %d replicated from the old primary (%d of them after the old relay "+
		"stopped, having published %d), %d written on the new one; 0 missing from Kafka. The recovery replaced a %s slot "+
		"and republished %d events created since %s after the load began; %d duplicates in Kafka. %d events the old "+
		"primary committed after the standby's last replayed point are lost by asynchronous replication. %s in all",
		len(truth), replicated, unpublished, oldPublished, len(appIDs), res.Replaced, res.Republished,
		res.Since.Sub(loadStart).Round(time.Millisecond), got.duplicates(), lost, time.Since(began).Round(time.Second))
}

// startLoadOn is startLoad on any pool: one writer, transactions of 1 to 5
// events on 50 aggregates, each transaction's events numbered (header seq)
// from first on in commit order.
func startLoadOn(ctx context.Context, t *testing.T, pool *pgxpool.Pool, aggType string, first int) *load {
	l := &load{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		rng := rand.New(rand.NewPCG(uint64(first), 2))
		for i := first; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			events := make([]outbox.Event, 1+rng.IntN(5))
			for j := range events {
				events[j] = evt(aggType, "agg-"+strconv.Itoa(rng.IntN(50)), i)
			}
			ids, err := outbox.Write(ctx, pool, events...)
			if err != nil {
				t.Errorf("load: %v", err)
				return
			}
			l.mu.Lock()
			for _, id := range ids {
				l.ids = append(l.ids, id.String())
			}
			l.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return l
}

// waitUntil polls cond until it holds, or fails the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// confirmedCommitAt is the commit time ferry_relay_slot records as the
// newest the relay confirmed, nil before any.
func confirmedCommitAt(ctx context.Context, t *testing.T, pool *pgxpool.Pool, slot string) *time.Time {
	t.Helper()
	var at *time.Time
	err := pool.QueryRow(ctx, `SELECT confirmed_commit_at FROM ferry_relay_slot WHERE slot_name = $1`, slot).Scan(&at)
	if err != nil {
		t.Fatalf("read ferry_relay_slot: %v", err)
	}
	return at
}

// outboxIDs returns the id of every outbox row.
func outboxIDs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	return ids
}
