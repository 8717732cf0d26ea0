package commitpoint

import (
	"math/rand/v2"
	"testing"
)

// The commit point moves only over the finished prefix, whatever order
// messages finish in, and skips offset gaps (compaction, transaction
// markers).
func TestTrackerCommitsTheFinishedPrefix(t *testing.T) {
	t.Parallel()
	tr := New()
	if _, ok := tr.Point(); ok {
		t.Fatal("commit point before anything finished")
	}
	for _, o := range []int64{10, 11, 13, 14, 20} {
		tr.Add(o, 3)
	}
	steps := []struct {
		finish int64
		want   int64 // -1: nothing to commit yet
	}{
		{13, -1}, {14, -1}, {11, -1}, {10, 15}, {99, 15}, {20, 21},
	}
	for _, s := range steps {
		tr.Finish(s.finish)
		at, ok := tr.Point()
		switch {
		case s.want < 0 && ok:
			t.Fatalf("after finishing %d: commit point %d, want none", s.finish, at.Offset)
		case s.want >= 0 && (!ok || at.Offset != s.want || at.Epoch != 3):
			t.Fatalf("after finishing %d: commit point %+v (ok %v), want offset %d epoch 3", s.finish, at, ok, s.want)
		}
	}
	if n := tr.Pending(); n != 0 {
		t.Fatalf("%d pending, want 0", n)
	}
	if _, ok := tr.NextUnfinished(); ok {
		t.Fatal("an unfinished offset remains")
	}
}

func TestTrackerCompacts(t *testing.T) {
	t.Parallel()
	tr := New()
	for o := range int64(5000) {
		tr.Add(o, 0)
	}
	for o := range int64(4999) {
		tr.Finish(o)
	}
	if at, _ := tr.Point(); at.Offset != 4999 {
		t.Fatalf("commit point %d, want 4999", at.Offset)
	}
	if next, ok := tr.NextUnfinished(); !ok || next != 4999 {
		t.Fatalf("next unfinished %d %v, want 4999", next, ok)
	}
	if len(tr.entries) > 2500 {
		t.Fatalf("%d entries kept for 1 pending offset", len(tr.entries))
	}
}

// Against a model: with offsets finished in random order (a bridge's
// acknowledgements from several new partitions), the commit point is always
// one past the longest finished prefix.
func TestTrackerMatchesModel(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		tr := New()
		n := 1 + rng.IntN(3000)
		offsets := make([]int64, n)
		next := int64(rng.IntN(100))
		for i := range offsets {
			offsets[i] = next
			tr.Add(next, 0)
			next += 1 + int64(rng.IntN(2))
		}
		finished := make([]bool, n)
		for _, i := range rng.Perm(n) {
			tr.Finish(offsets[i])
			finished[i] = true
			want := int64(-1)
			for j := 0; j < n && finished[j]; j++ {
				want = offsets[j] + 1
			}
			at, ok := tr.Point()
			if got := map[bool]int64{true: at.Offset, false: -1}[ok]; got != want {
				t.Fatalf("round %d: commit point %d, want %d", round, got, want)
			}
		}
		if tr.Pending() != 0 {
			t.Fatalf("round %d: pending %d after every offset finished", round, tr.Pending())
		}
	}
}
