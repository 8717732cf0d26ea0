// Package commitpoint guards the rule both Kafka consumers of Ferry share:
// a partition's offset is committed only once the record at it and every
// earlier record of the partition are done. The inbox worker's records are
// done when their database transaction committed (or they were skipped or
// dead-lettered); the migration bridge's when the new cluster acknowledged
// their copy. Both finish records out of order, so the commit point moves
// over the contiguous finished prefix only.
package commitpoint

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Tracker knows which fetched offsets of one partition are finished and
// gives the offset that is safe to commit: one past the end of the
// contiguous finished prefix. Offsets may have gaps (compaction,
// transaction markers); the commit point never passes an unfinished one.
// The zero value is not ready: use New. It is not safe for concurrent use.
type Tracker struct {
	entries []entry // in fetch (offset) order, from head on
	head    int
	point   kgo.EpochOffset // Offset -1: nothing finished yet
}

type entry struct {
	offset int64
	epoch  int32
	done   bool
}

// New returns a tracker with nothing fetched.
func New() Tracker {
	return Tracker{point: kgo.EpochOffset{Epoch: -1, Offset: -1}}
}

// Add records a fetched offset; offsets arrive in increasing order.
func (t *Tracker) Add(offset int64, epoch int32) {
	t.entries = append(t.entries, entry{offset: offset, epoch: epoch})
}

// Finish marks offset as finished and moves the commit point over the
// finished prefix. An offset never added, or finished before, changes
// nothing.
func (t *Tracker) Finish(offset int64) {
	live := t.entries[t.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].offset >= offset })
	if i == len(live) || live[i].offset != offset {
		return
	}
	live[i].done = true
	for t.head < len(t.entries) && t.entries[t.head].done {
		e := t.entries[t.head]
		t.point = kgo.EpochOffset{Epoch: e.epoch, Offset: e.offset + 1}
		t.head++
	}
	if t.head == len(t.entries) {
		t.entries, t.head = t.entries[:0], 0
	} else if t.head > 1024 && t.head > len(t.entries)/2 {
		n := copy(t.entries, t.entries[t.head:])
		t.entries, t.head = t.entries[:n], 0
	}
}

// Point returns the offset to commit and whether anything finished.
func (t *Tracker) Point() (kgo.EpochOffset, bool) {
	return t.point, t.point.Offset >= 0
}

// Pending is how many tracked offsets are not finished or wait behind one
// that is not.
func (t *Tracker) Pending() int { return len(t.entries) - t.head }

// NextUnfinished returns the lowest unfinished offset, if any.
func (t *Tracker) NextUnfinished() (int64, bool) {
	if t.head < len(t.entries) {
		return t.entries[t.head].offset, true
	}
	return 0, false
}
