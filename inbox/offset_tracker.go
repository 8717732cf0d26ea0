package inbox

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// offsetTracker knows which fetched offsets of one partition are finished
// (applied, skipped as duplicates or dead-lettered) and gives the offset that
// is safe to commit: one past the end of the contiguous finished prefix.
// Messages may finish out of order (per-key concurrency, a batch whose failed
// message is retried later); the commit point never passes an unfinished
// one. It is not safe for concurrent use.
type offsetTracker struct {
	entries []trackedOffset // in fetch (offset) order, from head on
	head    int
	commit  kgo.EpochOffset // Offset -1: nothing finished yet
}

type trackedOffset struct {
	offset int64
	epoch  int32
	done   bool
}

func newOffsetTracker() offsetTracker {
	return offsetTracker{commit: kgo.EpochOffset{Epoch: -1, Offset: -1}}
}

// add records a fetched offset; offsets arrive in increasing order.
func (t *offsetTracker) add(offset int64, epoch int32) {
	t.entries = append(t.entries, trackedOffset{offset: offset, epoch: epoch})
}

// finish marks offset as finished and moves the commit point over the
// finished prefix.
func (t *offsetTracker) finish(offset int64) {
	live := t.entries[t.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].offset >= offset })
	if i == len(live) || live[i].offset != offset {
		return
	}
	live[i].done = true
	for t.head < len(t.entries) && t.entries[t.head].done {
		e := t.entries[t.head]
		t.commit = kgo.EpochOffset{Epoch: e.epoch, Offset: e.offset + 1}
		t.head++
	}
	if t.head == len(t.entries) {
		t.entries, t.head = t.entries[:0], 0
	} else if t.head > 1024 && t.head > len(t.entries)/2 {
		n := copy(t.entries, t.entries[t.head:])
		t.entries, t.head = t.entries[:n], 0
	}
}

// commitPoint returns the offset to commit and whether anything finished.
func (t *offsetTracker) commitPoint() (kgo.EpochOffset, bool) {
	return t.commit, t.commit.Offset >= 0
}

// pending is how many tracked offsets are not finished or behind one that
// is not.
func (t *offsetTracker) pending() int { return len(t.entries) - t.head }

// nextUnfinished returns the lowest unfinished offset, if any.
func (t *offsetTracker) nextUnfinished() (int64, bool) {
	if t.head < len(t.entries) {
		return t.entries[t.head].offset, true
	}
	return 0, false
}
