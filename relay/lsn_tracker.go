package relay

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// txn is one decoded transaction whose records are in flight.
type txn struct {
	end          pglogrepl.LSN // end of the commit record; set when Commit arrives
	at           time.Time     // commit time; set when Commit arrives
	committed    bool          // Commit has been decoded
	step         bool          // a migration step in it has not applied yet (holdStep)
	pending      int           // records produced and not yet acknowledged
	pendingBytes int64         // their size
	// pendingRecords are those of pending the window counts: all but the
	// further copies of an event (produceCopy).
	pendingRecords int
	records        int   // records produced that the window counts
	bytes          int64 // the size of every record produced
}

// lsnTracker decides which WAL position is safe to confirm: the end of the
// newest transaction such that it and every transaction before it were fully
// decoded and every one of their records was acknowledged by Kafka (or
// quarantined). Kafka acknowledges out of order across partitions, so a
// transaction that finished early waits for the older ones before it.
//
// It also measures the window a crash would publish again, which the
// session bounds: every record of a committed transaction that is not yet
// confirmed (acknowledged or not: one partition that stops acknowledging
// pins the position while the others flow) or confirmed but not yet told
// to PostgreSQL (reported), plus the unacknowledged records
// of the transaction still being decoded (a large transaction streams
// through; a crash republishes it whole anyway).
//
// Decoding calls begin, produce and commit from one goroutine; acks arrive
// from franz-go's goroutines.
type lsnTracker struct {
	mu        sync.Mutex
	queue     []*txn // oldest first; queue[0] is the oldest unconfirmed
	confirmed pglogrepl.LSN
	// confirmedAt is the commit time of the newest confirmed transaction
	// (zero before the first): how far back a recovery must republish.
	confirmedAt time.Time
	inFlight    int   // records produced, not yet acknowledged
	held        int   // records of committed, unconfirmed transactions
	heldBytes   int64 // their size
	open        int   // unacknowledged records of transactions not yet committed
	openBytes   int64 // their size
	// unreported are the confirmed transactions whose end PostgreSQL has
	// not been told yet (reported): a crash publishes them again too, so
	// they count in the window until a status update carries them.
	unreported      []reportable
	unreportedN     int
	unreportedBytes int64
	space           chan struct{}
}

// reportable is a confirmed transaction not yet reported: its end and size.
type reportable struct {
	end     pglogrepl.LSN
	records int
	bytes   int64
}

func newLSNTracker(confirmed pglogrepl.LSN) *lsnTracker {
	return &lsnTracker{confirmed: confirmed, space: make(chan struct{}, 1)}
}

// begin opens a transaction at the end of the queue.
func (t *lsnTracker) begin() *txn {
	x := &txn{}
	t.mu.Lock()
	t.queue = append(t.queue, x)
	t.mu.Unlock()
	return x
}

// produce counts one record of x as in flight. A record of a transaction
// already committed (a migration step's fences) joins the committed
// window.
func (t *lsnTracker) produce(x *txn, size int) { t.add(x, size, true) }

// produceCopy counts a further copy of an event produce counted (a live
// migration writes an event to both channels): in flight, holding x's
// confirmation, and in the window's bytes, not in its records, which
// bound the events (not the copies) a crash would publish again.
func (t *lsnTracker) produceCopy(x *txn, size int) { t.add(x, size, false) }

func (t *lsnTracker) add(x *txn, size int, counted bool) {
	t.mu.Lock()
	x.pending++
	x.pendingBytes += int64(size)
	x.bytes += int64(size)
	t.inFlight++
	n := 0
	if counted {
		n = 1
		x.pendingRecords++
		x.records++
	}
	if x.committed {
		t.held += n
		t.heldBytes += int64(size)
	} else {
		t.open += n
		t.openBytes += int64(size)
	}
	t.mu.Unlock()
}

// holdStep keeps x unconfirmed until releaseStep: a migration step
// decoded in x applies only once x committed and everything before it was
// acknowledged (route.go). The hold is no record: it counts in no window,
// since the commit it waits for is further on in the stream, which the
// session stops reading while the window is full.
func (t *lsnTracker) holdStep(x *txn) {
	t.mu.Lock()
	x.step = true
	t.mu.Unlock()
}

// releaseStep lets x be confirmed once its records are acknowledged: its
// step applied.
func (t *lsnTracker) releaseStep(x *txn) {
	t.mu.Lock()
	x.step = false
	t.advanceLocked()
	t.mu.Unlock()
	t.signal()
}

// commit marks x fully decoded, ending at end, committed at at.
func (t *lsnTracker) commit(x *txn, end pglogrepl.LSN, at time.Time) {
	t.mu.Lock()
	x.end, x.at = end, at
	x.committed = true
	t.open -= x.pendingRecords
	t.openBytes -= x.pendingBytes
	t.held += x.records
	t.heldBytes += x.bytes
	t.advanceLocked()
	t.mu.Unlock()
}

// ack marks one record of x acknowledged.
func (t *lsnTracker) ack(x *txn, size int) { t.ackOne(x, size, false) }

// ackOne marks one record of x acknowledged: a further copy of an event
// (produceCopy) when copy is true.
func (t *lsnTracker) ackOne(x *txn, size int, copy bool) {
	t.mu.Lock()
	x.pending--
	x.pendingBytes -= int64(size)
	t.inFlight--
	if !copy {
		x.pendingRecords--
	}
	if !x.committed {
		if !copy {
			t.open--
		}
		t.openBytes -= int64(size)
	}
	t.advanceLocked()
	t.mu.Unlock()
	t.signal()
}

// signal wakes the session if it waits for space in the window.
func (t *lsnTracker) signal() {
	select {
	case t.space <- struct{}{}:
	default:
	}
}

func (t *lsnTracker) advanceLocked() {
	n := 0
	for n < len(t.queue) && t.queue[n].committed && t.queue[n].pending == 0 && !t.queue[n].step {
		if t.queue[n].end > t.confirmed {
			t.confirmed = t.queue[n].end
		}
		if t.queue[n].at.After(t.confirmedAt) {
			t.confirmedAt = t.queue[n].at
		}
		t.held -= t.queue[n].records
		t.heldBytes -= t.queue[n].bytes
		if r := t.queue[n].records; r > 0 {
			t.unreported = append(t.unreported, reportable{t.queue[n].end, r, t.queue[n].bytes})
			t.unreportedN += r
			t.unreportedBytes += t.queue[n].bytes
		}
		t.queue[n] = nil
		n++
	}
	if n > 0 {
		t.queue = t.queue[n:]
	}
}

// reported leaves out of the window the confirmed transactions that end at
// or before flush, the position a status update just told PostgreSQL.
func (t *lsnTracker) reported(flush pglogrepl.LSN) {
	t.mu.Lock()
	n := 0
	for n < len(t.unreported) && t.unreported[n].end <= flush {
		t.unreportedN -= t.unreported[n].records
		t.unreportedBytes -= t.unreported[n].bytes
		n++
	}
	if n > 0 {
		t.unreported = append(t.unreported[:0], t.unreported[n:]...)
	}
	t.mu.Unlock()
	if n > 0 {
		t.signal()
	}
}

// idle moves the confirmed position to walEnd, the server's position in a
// keepalive, when no transaction is open or unacknowledged: every change
// before walEnd was then sent to us and is safe in Kafka, and a transaction
// that commits later is still sent after a restart.
func (t *lsnTracker) idle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	if len(t.queue) == 0 && walEnd > t.confirmed {
		t.confirmed = walEnd
	}
	t.mu.Unlock()
}

// confirmedCommit returns the confirmable LSN and the commit time of the
// newest confirmed transaction.
func (t *lsnTracker) confirmedCommit() (pglogrepl.LSN, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed, t.confirmedAt
}

// position returns the confirmable LSN, the records and bytes of the
// window a crash would publish again (see lsnTracker), and whether any
// transaction is open or unconfirmed.
func (t *lsnTracker) position() (confirmed pglogrepl.LSN, window int, windowBytes int64, busy bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed, t.held + t.open + t.unreportedN, t.heldBytes + t.openBytes + t.unreportedBytes, len(t.queue) > 0
}

// onlyHolds reports whether x is the oldest unconfirmed transaction and
// waits for nothing but its migration step (holdStep).
func (t *lsnTracker) onlyHolds(x *txn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue) > 0 && t.queue[0] == x && x.committed && x.pending == 0 && x.step
}

// unacknowledged returns the records sent and not yet acknowledged.
func (t *lsnTracker) unacknowledged() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}
