package inbox

import "testing"

// The commit point moves only over the finished prefix, whatever order
// messages finish in, and skips offset gaps (compaction, transaction
// markers).
func TestOffsetTrackerCommitsTheFinishedPrefix(t *testing.T) {
	t.Parallel()
	tr := newOffsetTracker()
	if _, ok := tr.commitPoint(); ok {
		t.Fatal("commit point before anything finished")
	}
	for _, o := range []int64{10, 11, 13, 14, 20} {
		tr.add(o, 3)
	}
	steps := []struct {
		finish int64
		want   int64 // -1: nothing to commit yet
	}{
		{13, -1}, {14, -1}, {11, -1}, {10, 15}, {99, 15}, {20, 21},
	}
	for _, s := range steps {
		tr.finish(s.finish)
		at, ok := tr.commitPoint()
		switch {
		case s.want < 0 && ok:
			t.Fatalf("after finishing %d: commit point %d, want none", s.finish, at.Offset)
		case s.want >= 0 && (!ok || at.Offset != s.want || at.Epoch != 3):
			t.Fatalf("after finishing %d: commit point %+v (ok %v), want offset %d epoch 3", s.finish, at, ok, s.want)
		}
	}
	if n := tr.pending(); n != 0 {
		t.Fatalf("%d pending, want 0", n)
	}
	if _, ok := tr.nextUnfinished(); ok {
		t.Fatal("an unfinished offset remains")
	}
}

func TestOffsetTrackerCompacts(t *testing.T) {
	t.Parallel()
	tr := newOffsetTracker()
	for o := range int64(5000) {
		tr.add(o, 0)
	}
	for o := range int64(4999) {
		tr.finish(o)
	}
	if at, _ := tr.commitPoint(); at.Offset != 4999 {
		t.Fatalf("commit point %d, want 4999", at.Offset)
	}
	if next, ok := tr.nextUnfinished(); !ok || next != 4999 {
		t.Fatalf("next unfinished %d %v, want 4999", next, ok)
	}
	if len(tr.entries) > 2500 {
		t.Fatalf("%d entries kept for 1 pending offset", len(tr.entries))
	}
}
