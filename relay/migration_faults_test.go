//go:build faults

package relay_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/relay"
)

// PostgreSQL keeps a logical slot's confirmed position in memory and
// writes it to disk only when the slot's restart_lsn or catalog_xmin
// moves (15 and 16 not even at a clean shutdown): a restart takes the slot
// back to the position saved then, past any number of steps the relay
// applied and recorded since. Here a transaction left open pins both,
// so the slot is saved before the steps and not after, and PostgreSQL
// restarts (immediate: a crash) once the relay confirmed both steps. The
// relay that resumes routes each event delivered again by the step in
// effect at its commit. Before, it took the step before the last recorded
// one as in effect from the rewound position: the events committed before
// that step went out under it.
func TestFaultMigrationStepsAfterPostgresRestart(t *testing.T) {
	m := setupMigration(t, 2, 2, nil)
	cfg := m.cfg
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, stop := runUntilStopped(t, cfg)
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 10)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the DUAL_WRITE step and 10 events")

	// The pin: an open transaction that wrote is the oldest running one in
	// every running-transactions record from now on. The checkpoint logs
	// one, which the next confirmation applies to the slot (saved once);
	// later ones change neither restart_lsn nor catalog_xmin.
	if _, err := m.db.Pool.Exec(m.ctx, `CREATE TABLE pin (n int)`); err != nil {
		t.Fatal(err)
	}
	pin, err := m.db.Pool.Acquire(m.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Release()
	if _, err := pin.Exec(m.ctx, `BEGIN; INSERT INTO pin VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Pool.Exec(m.ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	m.writeBatch(t, 10)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the events after the pin")

	firstStep := m.walPosition(t)
	m.request(t, migration.Cutover, 64)
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, migration.Slices)
	m.writeBatch(t, 10)
	m.waitConfirmedPast(t, r, m.walPosition(t), "both CUTOVER steps and the events after them")
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	ferrytest.Stack(t, "pg-restart", "immediate")
	pin.Conn().Close(m.ctx) // gone with the crash
	var rewound bool
	deadline := time.Now().Add(time.Minute)
	for {
		err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn < $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			m.slot, firstStep).Scan(&rewound)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL does not answer a minute after its restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !rewound {
		t.Fatalf("after the restart the slot's confirmed position %s is past %s, before the first CUTOVER step: "+
			"PostgreSQL saved the slot after the pin, and this test sets up nothing", m.confirmed(t), firstStep)
	}
	t.Logf("after the restart the slot resumes at %s, before the first CUTOVER step (%s)", m.confirmed(t), firstStep)

	r, stop = runUntilStopped(t, cfg)
	m.waitConfirmedPast(t, r, m.walPosition(t), "everything delivered again")
	m.writeBatch(t, 16) // after every copy delivered again, on every partition

	m.checkBothChannels(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
