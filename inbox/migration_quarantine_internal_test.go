package inbox

import (
	"testing"
	"time"
)

// A partition's position counts for the quarantine at a time when the
// group had consumed everything it held then, and only once the worker
// read its cluster for the quarantine delay without a failure: a copy held
// back while its cluster was down reaches it once the cluster is back, so
// an end read right then does not yet hold it.
func TestAPositionCountsOnlyOnceItsClusterAnsweredForTheDelay(t *testing.T) {
	t.Parallel()
	w := &Worker{marks: map[positionKey]positionMark{}, channelUp: map[channelKey]time.Time{}, unwatched: map[followKey]int64{}}
	w.cfg.MigrationQuarantineAfter = time.Minute
	ch := channelKey{"c", "move", "old"}
	k := positionKey{"c", "move", "old", "t", 0}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	note := func(now time.Duration, pos, end int64) (time.Time, bool) {
		valid := w.channelUpSince(ch, at(now)).Add(w.cfg.MigrationQuarantineAfter)
		return w.notePosition(k, pos, positionMark{end, at(now)}, valid)
	}
	// The cluster answers from t0: a group at the end counts from t0+1m.
	if _, ok := note(0, 10, 10); ok {
		t.Fatal("a position counted as soon as the cluster answered")
	}
	if r, ok := note(time.Minute, 10, 10); !ok || !r.Equal(at(time.Minute)) {
		t.Fatalf("a group at the end a minute after the cluster answered: %v %v, want it counted at once", r, ok)
	}
	// A busy partition: behind its end, the group counts from the last end
	// it passed, read at an earlier pass.
	if r, ok := note(2*time.Minute, 11, 20); !ok || !r.Equal(at(time.Minute)) {
		t.Fatalf("a group behind the end, past the one read at 1m: %v %v, want it counted at 1m", r, ok)
	}
	if _, ok := note(3*time.Minute, 15, 30); ok {
		t.Fatal("a group behind every end read counted")
	}
	if r, ok := note(4*time.Minute, 25, 40); !ok || !r.Equal(at(2*time.Minute)) {
		t.Fatalf("a group past the end read at 2m: %v %v, want it counted at 2m", r, ok)
	}
	// The cluster fails: its marks go, and a position counts again only a
	// minute after it answers anew.
	w.channelDown(ch)
	if len(w.marks) != 0 {
		t.Fatalf("marks kept across a failure: %v", w.marks)
	}
	if _, ok := note(10*time.Minute, 40, 40); ok {
		t.Fatal("a position counted as soon as the cluster was back")
	}
	if r, ok := note(11*time.Minute, 40, 40); !ok || !r.Equal(at(11*time.Minute)) {
		t.Fatalf("a minute after the cluster was back: %v %v, want it counted", r, ok)
	}
}
