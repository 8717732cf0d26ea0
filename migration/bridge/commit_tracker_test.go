package bridge

import "testing"

// The commit point moves over the contiguous acknowledged prefix only:
// acknowledgements out of order (copies in different new partitions)
// never let it pass an offset still waiting, and a refused offset holds it
// for good.
func TestCommitTrackerCommitsBehindAcksOnly(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	if _, ok := tr.uncommitted(); ok {
		t.Fatal("a commit point before anything was acknowledged")
	}
	for _, off := range []int64{10, 11, 12, 14, 15} { // 13 was compacted away
		tr.add(off, 3)
	}
	tr.ack(12)
	tr.ack(11)
	if _, ok := tr.uncommitted(); ok {
		t.Fatal("commit point moved while offset 10 has no ack")
	}
	tr.ack(10)
	at, ok := tr.uncommitted()
	if !ok || at.Offset != 13 || at.Epoch != 3 {
		t.Fatalf("commit point %+v %t, want 13 (past 10, 11, 12)", at, ok)
	}
	tr.markCommitted(at)
	if _, ok := tr.uncommitted(); ok {
		t.Fatal("the same point is uncommitted again after its commit")
	}
	tr.refuse() // 14
	tr.ack(15)
	if at, ok := tr.uncommitted(); ok {
		t.Fatalf("commit point %d passed a refused offset", at.Offset)
	}
	if tr.waiting() != 0 || tr.pending() != 2 {
		t.Fatalf("waiting %d pending %d, want 0 and 2", tr.waiting(), tr.pending())
	}
}
