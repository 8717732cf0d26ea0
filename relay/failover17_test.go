//go:build faults

package relay_test

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

// A failover on PostgreSQL 17: the relay's slot is a failover slot, the
// standby synchronizes it (sync_replication_slots), and the primary sends no
// change the standby has not confirmed (synchronized_standby_slots). The
// standby is promoted while the application writes and the relay publishes;
// a relay pointed at the new primary streams on from the synchronized slot,
// without ErrSlotGone and without Recover, and every event in the new
// primary's outbox reaches Kafka, each aggregate's events in order of first
// arrival.
//
// scripts/test runs it on a PostgreSQL 17 stack of its own (and checks it
// ran): the default stack is PostgreSQL 15, where it skips.
func TestPostgreSQL17FailoverKeepsTheSlot(t *testing.T) {
	began := time.Now()
	b := setup(t)
	if v := serverVersionNum(t, b.db.Pool, b); v < 170000 {
		t.Skipf("PostgreSQL %d has no failover slots; scripts/test runs this test on PostgreSQL 17 and 18 stacks", v)
	}
	topic := b.topic(t, "order", 4)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	b.checkFailoverSlot(t, b.db.Pool)

	sb := ferrytest.NewStandby(t)
	if sb.Slot == "" {
		t.Fatal("scripts/stack pg-standby named no physical slot (FERRY_TEST_STANDBY_SLOT) on PostgreSQL 17")
	}
	// The primary holds logical changes back until the standby has them:
	// the synchronized slot never confirms what the standby lacks. Reset
	// before the standby (and its slot) goes: registered after it, runs
	// before.
	setSynchronizedStandbySlots(t, b, sb.Slot)
	t.Cleanup(func() { setSynchronizedStandbySlots(t, b, "") })

	old := startLoadOn(b.ctx, t, b.db.Pool, "order", 0)
	oldFinished := false
	t.Cleanup(func() {
		if !oldFinished {
			old.finish()
		}
	})
	r1, stop1 := runUntilStopped(t, b.cfg)
	old.waitCount(t, 300)

	// The standby's copy of the slot catches up with what the relay
	// confirmed on the primary: from then on a promotion loses nothing the
	// copy would have to resend.
	var primaryFlush string
	waitUntil(t, time.Minute, "the relay confirms a position on the primary", func() bool {
		err := b.db.Pool.QueryRow(b.ctx, `SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&primaryFlush)
		return err == nil && primaryFlush != "" && r1.Stats().Published > 0
	})
	sbPool, err := pgxpool.New(b.ctx, sb.DatabaseURL(b.db.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sbPool.Close)
	waitUntil(t, 2*time.Minute, "the standby synchronizes the relay's slot up to "+primaryFlush, func() bool {
		var ok bool
		err := sbPool.QueryRow(b.ctx, `SELECT synced AND NOT temporary AND failover AND confirmed_flush_lsn >= $2::pg_lsn
			FROM pg_replication_slots WHERE slot_name = $1`, b.slot, primaryFlush).Scan(&ok)
		return err == nil && ok
	})
	if st, err := relay.Status(b.ctx, sbPool, b.slot); err != nil || st.Failover != "yes" || !st.Synced {
		t.Fatalf("relay status on the standby: %+v, %v; want a synced failover slot", st, err)
	}

	// The failover, under load: the relay publishes and the application
	// writes while the standby is promoted. The old primary is dead from
	// then on (here it serves on, so the application and its relay just
	// stop).
	sb.Promote(t)
	oldIDs := old.finish()
	oldFinished = true
	if err := stop1(); err != nil {
		t.Fatalf("the relay on the old primary: %v", err)
	}
	oldPublished := r1.Stats().Published

	nb := *b
	nb.db = &ferrytest.DB{Name: b.db.Name, URL: sb.DatabaseURL(b.db.Name), Pool: sbPool}
	nb.cfg.DatabaseURL = nb.db.URL
	if !nb.slotExists(t) {
		t.Fatalf("slot %s is missing on the promoted standby: PostgreSQL 17 did not carry it", b.slot)
	}
	app := startLoadOn(b.ctx, t, sbPool, "order", 1_000_000)
	appFinished := false
	t.Cleanup(func() {
		if !appFinished {
			app.finish()
		}
	})
	// The relay streams on from the synchronized slot: start fails the test
	// if Run stops (ErrSlotGone, anything) before or while it streams.
	r2 := nb.start(t, nb.cfg)
	app.waitCount(t, app.count()+300)
	appIDs := app.finish()
	appFinished = true

	truth := outboxIDs(b.ctx, t, sbPool)
	inTruth := make(map[string]bool, len(truth))
	for _, id := range truth {
		inTruth[id] = true
	}
	for _, id := range appIDs {
		if !inTruth[id] {
			t.Fatalf("event %s committed on the new primary is not in its outbox", id)
		}
	}
	written := make(map[string]bool, len(oldIDs)+len(appIDs))
	for _, id := range slices.Concat(oldIDs, appIDs) {
		written[id] = true
	}
	for _, id := range truth {
		if !written[id] {
			t.Fatalf("outbox row %s on the new primary was written by neither load", id)
		}
	}
	got := consume(t, []string{topic}, truth, 2*time.Minute, time.Second)
	got.checkFirstArrivalOrder(t)
	replicated := len(truth) - len(appIDs)
	t.Logf("%d events in the new primary's outbox: %d replicated from the old primary (whose relay published %d), "+
		"%d written on the new one; 0 missing from Kafka, %d duplicates; the new relay published %d from the "+
		"synchronized slot, no recovery. %d events the old primary committed after the standby's last replayed point "+
		"are lost by asynchronous replication. %s in all",
		len(truth), replicated, oldPublished, len(appIDs), got.duplicates(), r2.Stats().Published,
		len(oldIDs)-replicated, time.Since(began).Round(time.Second))
}

// A slot made without failover on PostgreSQL 17 (by hand, or before an
// upgrade) would be lost in a failover: the relay says so with the command
// that fixes it, and `relay status` shows it.
func TestPostgreSQL17WarnsOfASlotWithoutFailover(t *testing.T) {
	b := setup(t)
	if v := serverVersionNum(t, b.db.Pool, b); v < 170000 {
		t.Skipf("PostgreSQL %d has no failover slots; scripts/test runs this test on PostgreSQL 17 and 18 stacks", v)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, b.slot); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, logger); err != nil {
		t.Fatal(err)
	}
	got := logs.String()
	if !strings.Contains(got, "not a failover slot") || !strings.Contains(got, "ALTER_REPLICATION_SLOT "+b.slot+" (FAILOVER true)") {
		t.Fatalf("no warning naming the fix for a slot without failover; logs:\n%s", got)
	}
	st, err := relay.Status(b.ctx, b.db.Pool, b.slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.Failover != "no" || st.Synced {
		t.Fatalf("Status of a slot without failover: failover %q, synced %t", st.Failover, st.Synced)
	}
}

// setSynchronizedStandbySlots sets the primary's synchronized_standby_slots
// (empty: resets it) and waits until the server uses it.
func setSynchronizedStandbySlots(t *testing.T, b *bundle, slots string) {
	t.Helper()
	stmt := `ALTER SYSTEM RESET synchronized_standby_slots`
	if slots != "" {
		stmt = `ALTER SYSTEM SET synchronized_standby_slots = '` + slots + `'` // a name scripts/stack made: [a-z0-9_]
	}
	if _, err := b.db.Pool.Exec(b.ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "synchronized_standby_slots = '"+slots+"'", func() bool {
		var v string
		err := b.db.Pool.QueryRow(b.ctx, `SHOW synchronized_standby_slots`).Scan(&v)
		return err == nil && v == slots
	})
}
