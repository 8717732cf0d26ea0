package bridge

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/commitpoint"
)

// commitTracker guards the bridge's one rule on the old side: an offset of
// an old partition is committed only once the new cluster acknowledged the
// copy of that record and of every earlier record of the partition. The
// copies of one old partition go to several new partitions (by key), whose
// acknowledgements come back in any order; the commit point moves over
// the contiguous acknowledged prefix only (commitpoint.Tracker, the
// inbox worker's rule too). It is not safe for concurrent use.
type commitTracker struct {
	offsets    commitpoint.Tracker // an offset is finished when its copy is acknowledged
	committed  int64               // the last point committed, -1 if none
	unanswered int                 // sent, neither acknowledged nor refused
}

func newCommitTracker() *commitTracker {
	return &commitTracker{offsets: commitpoint.New(), committed: -1}
}

// add records an offset sent to the new cluster; offsets come in
// increasing order.
func (t *commitTracker) add(offset int64, epoch int32) {
	t.offsets.Add(offset, epoch)
	t.unanswered++
}

// refuse records that the new cluster refused offset: the commit point
// never passes it.
func (t *commitTracker) refuse() { t.unanswered-- }

// ack marks offset acknowledged and moves the commit point over the
// acknowledged prefix.
func (t *commitTracker) ack(offset int64) {
	t.unanswered--
	t.offsets.Finish(offset)
}

// uncommitted returns the commit point when it moved since the last commit.
func (t *commitTracker) uncommitted() (kgo.EpochOffset, bool) {
	point, _ := t.offsets.Point()
	return point, point.Offset > t.committed
}

// markCommitted records a commit of point.
func (t *commitTracker) markCommitted(point kgo.EpochOffset) {
	t.committed = max(t.committed, point.Offset)
}

// pending is how many offsets sent are not acknowledged or wait behind one
// that is not.
func (t *commitTracker) pending() int { return t.offsets.Pending() }

// waiting is how many offsets sent have no answer from the new cluster
// yet.
func (t *commitTracker) waiting() int { return t.unanswered }
