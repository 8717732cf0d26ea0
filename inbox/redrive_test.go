package inbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A dead letter redriven after the bug is fixed takes effect once; redriving
// it again is skipped by the inbox.
func TestRedriveAfterFixHasOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(b.record("m-bug", "k", 1, 1), b.record("m-ok", "k2", 0, 2))
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-bug" && !fixed.Load() {
			return Permanent(errors.New("bug #12: cannot handle this order"))
		}
		return effectHandler(ctx, tx, m)
	}
	w := b.newWorker(b.config(), h)
	b.start(w)
	b.waitCommitted(b.consumer, 1, 1)
	if n := b.effects("m-bug"); n != 0 {
		t.Fatalf("m-bug has %d effects before the fix", n)
	}

	before := time.Now().Add(-time.Hour)
	listed, err := ListDeadLetters(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{IDs: []string{"m-bug"}, Since: before})
	if err != nil || len(listed) != 1 || listed[0].Reason != ReasonPermanent || listed[0].OriginalPartition != 1 {
		t.Fatalf("listed %+v, %v: want m-bug's dead letter from partition 1", listed, err)
	}
	if none, _ := ListDeadLetters(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{Until: before}); len(none) != 0 {
		t.Fatalf("filter by time: %+v, want none", none)
	}

	fixed.Store(true)
	res, err := Redrive(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{IDs: []string{"m-bug"}})
	if err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive: %+v, %v", res, err)
	}
	b.waitFor("the redriven message's effect", func() (bool, error) { return b.effects("m-bug") == 1, nil })
	b.waitCommitted(b.consumer, 1, 2)

	dupsBefore := w.Stats().Duplicates
	if _, err := Redrive(b.ctx, b.kopts, b.dlq, nil); err != nil {
		t.Fatal(err)
	}
	b.waitCommitted(b.consumer, 1, 3)
	if got := w.Stats().Duplicates; got != dupsBefore+1 {
		t.Errorf("second redrive: %d duplicates skipped, want %d", got, dupsBefore+1)
	}
	if n := b.effects("m-bug"); n != 1 {
		t.Errorf("m-bug has %d effects after two redrives, want 1", n)
	}
	if n := b.effects("m-ok"); n != 1 {
		t.Errorf("m-ok has %d effects, want 1", n)
	}
}
