package relay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// at is a commit time that grows with the commit's LSN.
func at(lsn int) time.Time { return time.Unix(int64(lsn), 0) }

func confirmed(t *lsnTracker) pglogrepl.LSN {
	c, _, _, _ := t.position()
	return c
}

func TestTrackerConfirmsOnlyFullyAckedPrefix(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(100)
	a, b := tr.begin(), tr.begin()
	tr.produce(a, 10)
	tr.produce(a, 10)
	tr.commit(a, 200, at(200))
	tr.produce(b, 10)
	tr.commit(b, 300, at(300))

	// b's only record is acked first (another partition answered sooner).
	tr.ack(b, 10)
	if got := confirmed(tr); got != 100 {
		t.Fatalf("after acking only the newer transaction: confirmed %d, want 100", got)
	}
	tr.ack(a, 10)
	if got := confirmed(tr); got != 100 {
		t.Fatalf("with one record of the older transaction unacked: confirmed %d, want 100", got)
	}
	if _, when := tr.confirmedCommit(); !when.IsZero() {
		t.Fatalf("commit time %s confirmed before any transaction was", when)
	}
	tr.ack(a, 10)
	if got := confirmed(tr); got != 300 {
		t.Fatalf("after every record acked: confirmed %d, want 300", got)
	}
	// The commit time recovery starts from is the newest confirmed one.
	if _, when := tr.confirmedCommit(); !when.Equal(at(300)) {
		t.Fatalf("confirmed commit time %s, want %s", when, at(300))
	}
	tr.reported(confirmed(tr)) // PostgreSQL was told
	_, inFlight, bytes, busy := tr.position()
	if inFlight != 0 || bytes != 0 || busy {
		t.Fatalf("in flight %d records, %d bytes, busy %v; want 0, 0, false", inFlight, bytes, busy)
	}
}

func TestTrackerWaitsForCommitOfAckedTransaction(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(100)
	a := tr.begin()
	tr.produce(a, 1)
	tr.ack(a, 1) // acked while the transaction is still being decoded
	if got := confirmed(tr); got != 100 {
		t.Fatalf("acked but uncommitted transaction confirmed %d, want 100", got)
	}
	tr.idle(500)
	if got := confirmed(tr); got != 100 {
		t.Fatalf("keepalive during an open transaction moved confirmed to %d, want 100", got)
	}
	tr.commit(a, 150, at(150))
	if got := confirmed(tr); got != 150 {
		t.Fatalf("confirmed %d, want 150", got)
	}
}

func TestTrackerIdleAdvancesOnlyWhenNothingPending(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(100)
	tr.idle(400)
	if got := confirmed(tr); got != 400 {
		t.Fatalf("idle keepalive: confirmed %d, want 400", got)
	}
	tr.idle(300) // never backwards
	if got := confirmed(tr); got != 400 {
		t.Fatalf("older keepalive moved confirmed back to %d", got)
	}
	a := tr.begin()
	tr.produce(a, 1)
	tr.commit(a, 450, at(450))
	tr.idle(900)
	if got := confirmed(tr); got != 400 {
		t.Fatalf("keepalive with a record in flight: confirmed %d, want 400", got)
	}
}

func TestTrackerEmptyTransactionConfirmsAtCommit(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(10)
	a := tr.begin()
	tr.commit(a, 20, at(20))
	if got := confirmed(tr); got != 20 {
		t.Fatalf("confirmed %d, want 20", got)
	}
}

// The window a crash would publish again counts every record of committed,
// unconfirmed transactions, acknowledged or not: one stuck record keeps
// everything behind it in the window. Of the transaction still being read,
// only unacknowledged records count, so a large one streams through.
func TestTrackerWindowCountsWhatACrashWouldRepublish(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(100)
	window := func() (int, int64) { _, n, b, _ := tr.position(); return n, b }

	stuck := tr.begin()
	tr.produce(stuck, 10) // its partition never answers
	tr.commit(stuck, 200, at(200))
	for i := range 5 {
		x := tr.begin()
		tr.produce(x, 10)
		tr.produce(x, 10)
		tr.commit(x, pglogrepl.LSN(300+i), at(300+i))
		tr.ack(x, 10)
		tr.ack(x, 10)
	}
	if n, b := window(); n != 11 || b != 110 {
		t.Fatalf("window %d records, %d bytes behind one stuck record; want 11, 110 (acknowledged ones count)", n, b)
	}
	if n := tr.unacknowledged(); n != 1 {
		t.Fatalf("%d unacknowledged, want 1", n)
	}

	big := tr.begin() // still being decoded: acknowledged records leave the window
	for range 100 {
		tr.produce(big, 1)
		tr.ack(big, 1)
	}
	tr.produce(big, 1)
	if n, b := window(); n != 12 || b != 111 {
		t.Fatalf("window %d records, %d bytes with an open transaction; want 12, 111", n, b)
	}
	tr.commit(big, 900, at(900)) // committed: all 101 of its records count
	if n, _ := window(); n != 112 {
		t.Fatalf("window %d records once the large transaction committed, want 112", n)
	}

	tr.ack(stuck, 10)
	tr.ack(big, 1)
	// Confirmed, but PostgreSQL has not been told: a crash now publishes
	// every one of them again, so they stay in the window until a status
	// update reports them.
	if n, b := window(); n != 112 || b != 211 || confirmed(tr) != 900 {
		t.Fatalf("confirmed, not reported: window %d, %d bytes, confirmed %d; want 112, 211, 900", n, b, confirmed(tr))
	}
	tr.reported(300) // a status update carried the two oldest transactions only
	if n, _ := window(); n != 112-1-2 {
		t.Fatalf("window %d records with 200 and 300 reported, want %d", n, 112-1-2)
	}
	tr.reported(900)
	if n, b := window(); n != 0 || b != 0 {
		t.Fatalf("after the report of 900: window %d, %d bytes; want 0, 0", n, b)
	}
}

// Records produced for a transaction already committed (a migration step's
// fences) join the committed window and leave it when it is confirmed: the
// window is back to 0, not below, and the step is confirmed only once they
// are acknowledged.
func TestTrackerRecordsOfACommittedTransactionCountOnce(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(10)
	step := tr.begin()
	tr.holdStep(step)
	tr.commit(step, 20, at(20))
	tr.produce(step, 30) // fences
	tr.produce(step, 30)
	tr.releaseStep(step)
	if got := confirmed(tr); got != 10 {
		t.Fatalf("confirmed %d with the fences unacknowledged, want 10", got)
	}
	if _, n, b, _ := tr.position(); n != 2 || b != 60 {
		t.Fatalf("window %d records, %d bytes; want 2, 60", n, b)
	}
	tr.ack(step, 30)
	tr.ack(step, 30)
	if got := confirmed(tr); got != 20 {
		t.Fatalf("confirmed %d, want 20", got)
	}
	tr.reported(confirmed(tr))
	if _, n, b, busy := tr.position(); n != 0 || b != 0 || busy {
		t.Fatalf("window %d records, %d bytes, busy %t after the step was confirmed; want 0, 0, false", n, b, busy)
	}
}

// A live migration's second copy of an event holds its transaction's
// confirmation like any record and counts in the window's bytes, but not
// in its records: the window bounds the events a crash would publish
// again, and an event's two copies are one event. Acknowledged in either
// order, committed before or after, the window comes back to 0.
func TestTrackerCountsAnEventsCopiesOnceInTheWindow(t *testing.T) {
	t.Parallel()
	for _, ackFirst := range []bool{false, true} {
		tr := newLSNTracker(10)
		x := tr.begin()
		for range 3 {
			tr.produce(x, 100)     // the old channel's copy
			tr.produceCopy(x, 100) // the new channel's
		}
		if _, n, b, _ := tr.position(); n != 3 || b != 600 {
			t.Fatalf("open transaction: window %d records, %d bytes; want 3 events, 600 bytes", n, b)
		}
		if ackFirst {
			tr.ackOne(x, 100, false)
			tr.ackOne(x, 100, true)
		}
		tr.commit(x, 20, at(20))
		if _, n, b, _ := tr.position(); n != 3 || b != 600 {
			t.Fatalf("committed (acknowledged first: %t): window %d records, %d bytes; want 3, 600", ackFirst, n, b)
		}
		for i := range 3 {
			if ackFirst && i == 0 {
				continue
			}
			tr.ack(x, 100)
			if got := confirmed(tr); got != 10 {
				t.Fatalf("confirmed %d with a copy unacknowledged, want 10", got)
			}
			tr.ackOne(x, 100, true)
		}
		if got := confirmed(tr); got != 20 {
			t.Fatalf("confirmed %d once every copy was acknowledged, want 20", got)
		}
		tr.reported(20)
		if _, n, b, busy := tr.position(); n != 0 || b != 0 || busy {
			t.Fatalf("window %d records, %d bytes, busy %t after the transaction was reported; want 0, 0, false", n, b, busy)
		}
	}
}

// A migration step's hold keeps its transaction unconfirmed until the step
// applies, and counts in no window: with --max-in-flight 1 the hold of a
// step decoded in an open transaction spent the whole budget, and the
// session never read on to the commit the step waited for.
func TestTrackerStepHoldCountsInNoWindow(t *testing.T) {
	t.Parallel()
	tr := newLSNTracker(10)
	before, step := tr.begin(), tr.begin()
	tr.produce(before, 5)
	tr.commit(before, 15, at(15))
	tr.holdStep(step)
	if _, n, b, _ := tr.position(); n != 1 || b != 5 {
		t.Fatalf("window %d records, %d bytes with the step's transaction open; want 1, 5 (the record before it only)", n, b)
	}
	if got := tr.unacknowledged(); got != 1 {
		t.Fatalf("%d records unacknowledged, want 1: the hold is no record", got)
	}
	tr.commit(step, 20, at(20))
	if tr.onlyHolds(step) {
		t.Fatal("the step may apply while a record before it is unacknowledged")
	}
	tr.ack(before, 5)
	if got := confirmed(tr); got != 15 {
		t.Fatalf("confirmed %d, want 15: the transaction before the step, not the step's", got)
	}
	if !tr.onlyHolds(step) {
		t.Fatal("the step may not apply with everything before it confirmed")
	}
	tr.reported(confirmed(tr))
	if _, n, b, busy := tr.position(); n != 0 || b != 0 || !busy {
		t.Fatalf("window %d records, %d bytes, busy %t while the step waits to apply; want 0, 0, true", n, b, busy)
	}
	tr.idle(100)
	if got := confirmed(tr); got != 15 {
		t.Fatalf("a keepalive moved confirmed to %d past the unapplied step, want 15", got)
	}
	tr.releaseStep(step)
	if got := confirmed(tr); got != 20 {
		t.Fatalf("confirmed %d once the step applied, want 20", got)
	}
}
