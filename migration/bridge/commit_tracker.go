package bridge

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// commitTracker guards the bridge's one rule on the old side: an offset of
// an old partition is committed only once the new cluster acknowledged the
// copy of that record and of every earlier record of the partition. The
// copies of one old partition go to several new partitions (by key), whose
// acknowledgements come back in any order; the commit point moves over
// the contiguous acknowledged prefix only. It is not safe for concurrent
// use.
type commitTracker struct {
	entries    []trackedOffset // in offset order, from head on
	head       int
	point      kgo.EpochOffset // next offset to consume; Offset -1: nothing acknowledged yet
	committed  int64           // the last point committed, -1 if none
	unanswered int             // sent, neither acknowledged nor refused
}

type trackedOffset struct {
	offset int64
	epoch  int32
	acked  bool
}

func newCommitTracker() *commitTracker {
	return &commitTracker{point: kgo.EpochOffset{Epoch: -1, Offset: -1}, committed: -1}
}

// add records an offset sent to the new cluster; offsets come in
// increasing order.
func (t *commitTracker) add(offset int64, epoch int32) {
	t.entries = append(t.entries, trackedOffset{offset: offset, epoch: epoch})
	t.unanswered++
}

// refuse records that the new cluster refused offset: the commit point
// never passes it.
func (t *commitTracker) refuse() { t.unanswered-- }

// ack marks offset acknowledged and moves the commit point over the
// acknowledged prefix.
func (t *commitTracker) ack(offset int64) {
	t.unanswered--
	live := t.entries[t.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].offset >= offset })
	if i == len(live) || live[i].offset != offset {
		return
	}
	live[i].acked = true
	for t.head < len(t.entries) && t.entries[t.head].acked {
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

// uncommitted returns the commit point when it moved since the last commit.
func (t *commitTracker) uncommitted() (kgo.EpochOffset, bool) {
	return t.point, t.point.Offset > t.committed
}

// markCommitted records a commit of point.
func (t *commitTracker) markCommitted(point kgo.EpochOffset) {
	t.committed = max(t.committed, point.Offset)
}

// pending is how many offsets sent are not acknowledged or wait behind one
// that is not.
func (t *commitTracker) pending() int { return len(t.entries) - t.head }

// waiting is how many offsets sent have no answer from the new cluster
// yet.
func (t *commitTracker) waiting() int { return t.unanswered }
