package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// runUntilStopped runs a relay whose end the test decides; stop returns
// Run's error.
func runUntilStopped(t *testing.T, cfg relay.Config) (r *relay.Relay, stop func() error) {
	t.Helper()
	r, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return r, stop
}

func (b *bundle) slotExists(t *testing.T) bool {
	t.Helper()
	var exists bool
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, b.slot).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// dropSlot drops the slot once its walsender has let go of it.
func (b *bundle) dropSlot(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := b.db.Pool.Exec(b.ctx, `SELECT pg_drop_replication_slot($1)`, b.slot)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("drop slot %s: %v", b.slot, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A slot dropped while the application keeps writing is never silently
// replaced: the relay stops with ErrSlotGone and creates nothing. `relay
// recover` then republishes the gap from the outbox, the relay streams on
// from the new slot, and every event reaches Kafka, each aggregate's in
// order of first arrival.
func TestRecoverAfterTheSlotIsDroppedUnderLoad(t *testing.T) {
	t.Parallel()
	// Transactions of this test take milliseconds: a second covers one that
	// began before the last confirmed commit and committed after it.
	const margin = time.Second
	b := setup(t)
	topic := b.topic(t, "order", 4)
	// The slot first, as `relay migrate` makes it: it keeps every
	// transaction that commits after it exists.
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	l := b.startLoad(t, "order", 5, 2*time.Millisecond)
	finished := false
	t.Cleanup(func() {
		if !finished { // the test failed before the load's end
			l.finish()
		}
	})

	loadStart := time.Now()
	r1, stop1 := runUntilStopped(t, b.cfg)
	deadline := time.Now().Add(time.Minute)
	// Past the margin, so that the outbox holds rows older than the window.
	for r1.Stats().Published < 100 || time.Since(loadStart) < 2*margin {
		if time.Now().After(deadline) {
			t.Fatalf("the relay published %d events in a minute", r1.Stats().Published)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	b.dropSlot(t)
	l.waitCount(t, l.count()+50) // events committed while no slot exists

	// The relay refuses to start over from "now".
	r2, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	err = r2.Run(runCtx) // returns at once; the old relay streamed on from a new slot
	cancel()
	if !isFatal(err, relay.ErrSlotGone) {
		t.Fatalf("Run after the slot was dropped = %v, want ErrSlotGone", err)
	}
	if b.slotExists(t) {
		t.Fatal("the relay created a new slot by itself, skipping the events committed meanwhile")
	}

	res, err := r2.Recover(b.ctx, &relay.RecoverOpts{Margin: margin})
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if res.Republished == 0 || res.Replaced != "missing" || res.SlotLSN == "" {
		t.Fatalf("Recover = %+v, want republished events, a missing slot replaced and a new slot", res)
	}
	b.checkFailoverSlot(t, b.db.Pool) // the replication protocol's CREATE_REPLICATION_SLOT too
	if _, err := r2.Recover(b.ctx, nil); !errors.Is(err, relay.ErrNothingToRecover) {
		t.Fatalf("a second Recover = %v, want ErrNothingToRecover", err)
	}

	b.start(t, b.cfg)
	l.waitCount(t, l.count()+50) // and events after the recovery
	ids := l.finish()
	finished = true
	got := consume(t, []string{topic}, ids, 2*time.Minute, time.Second)
	// Each aggregate's events arrive, at their first arrival, in the order
	// they were written.
	got.checkFirstArrivalOrder(t)
	t.Logf("%d events, %d republished by the recovery, %d duplicates in Kafka", len(ids), res.Republished, got.duplicates())
}

// Recover refuses what it must not do: a window the outbox may no longer
// hold in full, unless forced; and a relay refuses to stream from the slot
// of a recovery that did not finish.
func TestRecoverRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Recover(b.ctx, nil); !errors.Is(err, relay.ErrNothingToRecover) {
		t.Fatalf("Recover of a healthy slot = %v, want ErrNothingToRecover", err)
	}
	b.write(t, evt("order", "a", 1))
	b.dropSlot(t)

	// Nothing in an outbox Ferry has served for two hours is older than
	// the window's start: rows of the window may have been deleted. (On a
	// younger one, TestRecoverOnAYoungDatabase, nothing before the first
	// slot can be missing.)
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE ferry_relay_slot SET first_created_at = now() - interval '2 hours' WHERE slot_name = $1`, b.slot); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	if _, err := r.Recover(b.ctx, &relay.RecoverOpts{Since: since}); !errors.Is(err, relay.ErrGapNotRetained) {
		t.Fatalf("Recover with nothing older than the window = %v, want ErrGapNotRetained", err)
	}
	if b.slotExists(t) {
		t.Fatal("a refused recovery created a slot")
	}

	// A recovery marked but not finished (as if Recover died half-way)
	// keeps every relay off the new slot.
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE ferry_relay_slot SET recovering_since = $2 WHERE slot_name = $1`, b.slot, since); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, b.slot); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(b.ctx); !isFatal(err, relay.ErrSlotGone) {
		t.Fatalf("Run on the slot of an unfinished recovery = %v, want ErrSlotGone", err)
	}
	res, err := r.Recover(b.ctx, &relay.RecoverOpts{Force: true})
	if err != nil || res.Replaced != "dropped (of an unfinished recovery)" || !res.Since.Equal(since) || res.Republished != 1 {
		t.Fatalf("Recover --force after an unfinished one = %+v, %v; want the same window again, 1 event republished", res, err)
	}
}

// Recovery republishes an aggregate's events in commit order even when a
// later commit began first: transaction B starts (its created_at is
// earlier), waits for the aggregate's lock that A holds, and writes its
// event after A committed. Ordering by created_at published B's event first
// (seen: [2 1]); the order in which the transactions got their ids, which
// for writers that lock the aggregate first is the lock order, keeps A's
// first.
func TestRecoverKeepsCommitOrderOfLockedWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE agg (id text PRIMARY KEY, version int); INSERT INTO agg VALUES ('x', 0)`); err != nil {
		t.Fatal(err)
	}
	old := b.write(t, evt("order", "x", 0)) // older than the window
	b.dropSlot(t)

	txB, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txB.Rollback(context.Background())
	if _, err := txB.Exec(b.ctx, `SELECT now()`); err != nil { // B's transaction starts first
		t.Fatal(err)
	}
	txA, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txA.Exec(b.ctx, `UPDATE agg SET version = 1 WHERE id = 'x'`); err != nil {
		t.Fatal(err)
	}
	first, err := outbox.Write(b.ctx, txA, evt("order", "x", 1))
	if err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() { // B waits for A's lock
		_, err := txB.Exec(b.ctx, `UPDATE agg SET version = 2 WHERE id = 'x'`)
		locked <- err
	}()
	if err := txA.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	second, err := outbox.Write(b.ctx, txB, evt("order", "x", 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := txB.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}

	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cutoff time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT created_at FROM outbox WHERE id = $1`, old[0]).Scan(&cutoff); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Recover(b.ctx, &relay.RecoverOpts{Since: cutoff.Add(time.Microsecond)}); err != nil {
		t.Fatal(err)
	}
	got := consume(t, []string{topic}, []string{first[0].String(), second[0].String()}, time.Minute, 0)
	if len(got.records) != 2 || header(got.records[0], "seq") != "1" || header(got.records[1], "seq") != "2" {
		var seqs []string
		for _, rec := range got.records {
			seqs = append(seqs, header(rec, "seq"))
		}
		t.Fatalf("republished seqs %v, want [1 2]: commit order", seqs)
	}
}

// refusal is a statement that fails on the server as CREATE_REPLICATION_SLOT
// can: with code and message.
func refusal(code, message string) string {
	return fmt.Sprintf(`DO $$BEGIN RAISE EXCEPTION '%s' USING ERRCODE = '%s'; END$$`, message, code)
}

// A recovery's slot creation that the server refuses for now (the fault
// suite saw "initial slot snapshot too large", a serialization failure,
// under load) is tried again on a new connection, and the recovery
// finishes; a refusal a retry cannot change fails at once, naming it; and
// one that lasts fails after the retries, saying so. A refused recovery
// stays marked unfinished and creates no slot.
func TestRecoverRetriesATransientSlotRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	old := b.write(t, evt("order", "a", 1)) // older than the window
	var since time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT created_at + interval '1 microsecond' FROM outbox WHERE id = $1`, old[0]).Scan(&since); err != nil {
		t.Fatal(err)
	}
	recoverWith := func(fault func(attempt int) string) (attempts int, res *relay.RecoverResult, err error) {
		t.Helper()
		if b.slotExists(t) {
			b.dropSlot(t)
		}
		cfg := b.cfg
		relay.InjectSlotFault(&cfg, func(attempt int) string {
			attempts = attempt
			return fault(attempt)
		})
		r, err := relay.New(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err = r.Recover(b.ctx, &relay.RecoverOpts{Since: since})
		return attempts, res, err
	}
	tooLarge := refusal("40001", "initial slot snapshot too large")

	gap := b.write(t, evt("order", "a", 2))
	attempts, res, err := recoverWith(func(attempt int) string {
		if attempt < 3 {
			return tooLarge
		}
		return ""
	})
	if err != nil || attempts != 3 || res.Republished != 1 {
		t.Fatalf("Recover refused twice for now = %+v, %v after %d attempts; want the slot made at the third, 1 event republished", res, err, attempts)
	}
	consume(t, []string{topic}, gap, time.Minute, 0)

	unfinished := func() {
		t.Helper()
		if b.slotExists(t) {
			t.Fatal("a refused recovery left a slot")
		}
		var marked bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT recovering_since IS NOT NULL FROM ferry_relay_slot WHERE slot_name = $1`, b.slot).Scan(&marked); err != nil || !marked {
			t.Fatalf("the refused recovery is not marked unfinished: %v, %v", marked, err)
		}
	}
	attempts, _, err = recoverWith(func(int) string {
		return refusal("53400", "all replication slots are in use")
	})
	if err == nil || attempts != 1 || !strings.Contains(err.Error(), "all replication slots are in use") || !strings.Contains(err.Error(), "create slot") {
		t.Fatalf("Recover refused for good = %v after %d attempts; want it to fail at once, naming the refusal", err, attempts)
	}
	unfinished()
	t.Logf("refused for good: %v", err)

	attempts, _, err = recoverWith(func(int) string { return tooLarge })
	if err == nil || attempts < 2 || !strings.Contains(err.Error(), "initial slot snapshot too large") ||
		!strings.Contains(err.Error(), fmt.Sprintf("%d attempts", attempts)) {
		t.Fatalf("Recover refused for now every time = %v after %d attempts; want it to give up, saying it tried that often", err, attempts)
	}
	unfinished()
	t.Logf("refused for now every time: %v", err)
}

// On a database younger than the recovery margin (a fresh install, a new
// service) no outbox row is older than the window's start, an hour before
// the last confirmed commit: the window reaches back before Ferry first
// created the slot, and nothing created before then can be missing, so
// recover needs no --force. A row the slot confirmed still there shows that
// the outbox was not cut past what was published: recover still refuses
// when those rows are gone (deleted by hand), and, as before, on a
// database Ferry has served for longer than the window with no row older
// than it.
func TestRecoverOnAYoungDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	_, stop := runUntilStopped(t, b.cfg)
	var ids []string
	for i := range 3 {
		ids = append(ids, b.write(t, evt("order", "a", i))...)
	}
	consume(t, []string{topic}, ids, time.Minute, 0)
	if err := stop(); err != nil { // records what it confirmed on the way out
		t.Fatal(err)
	}
	b.dropSlot(t)
	for i := 3; i < 5; i++ {
		ids = append(ids, b.write(t, evt("order", "a", i))...) // the gap
	}

	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Recover(b.ctx, nil)
	if err != nil || res.Republished < 2 {
		t.Fatalf("Recover on a young database = %+v, %v; want the gap republished without --force", res, err)
	}
	_, stop = runUntilStopped(t, b.cfg)
	ids = append(ids, b.write(t, evt("order", "a", 5))...)
	consume(t, []string{topic}, ids, time.Minute, 0).checkFirstArrivalOrder(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.dropSlot(t)

	// Ferry has served this outbox for longer than the window: no row
	// older than its start means rows of it may have been deleted.
	var first time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `UPDATE ferry_relay_slot SET first_created_at = first_created_at - interval '2 hours'
		WHERE slot_name = $1 RETURNING first_created_at + interval '2 hours'`, b.slot).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Recover(b.ctx, nil); !errors.Is(err, relay.ErrGapNotRetained) || !strings.Contains(err.Error(), "the start of the window") {
		t.Fatalf("Recover on an outbox served for 2 hours with no row older than the window = %v, want ErrGapNotRetained", err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE ferry_relay_slot SET first_created_at = $2 WHERE slot_name = $1`, b.slot, first); err != nil {
		t.Fatal(err)
	}

	// Young, but every row the slot confirmed is gone.
	if _, err := b.db.Pool.Exec(b.ctx, `DELETE FROM outbox WHERE created_at < (SELECT confirmed_commit_at FROM ferry_relay_slot WHERE slot_name = $1)`, b.slot); err != nil {
		t.Fatal(err)
	}
	_, err = r.Recover(b.ctx, nil)
	if !errors.Is(err, relay.ErrGapNotRetained) || !strings.Contains(err.Error(), "confirmed") {
		t.Fatalf("Recover on a young database whose confirmed rows were deleted = %v, want ErrGapNotRetained", err)
	}
	t.Logf("refused: %v", err)
	if b.slotExists(t) {
		t.Fatal("a refused recovery created a slot")
	}
}
