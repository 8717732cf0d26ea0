package inbox

import (
	"context"
	"fmt"
	"time"

	tablepart "github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/outbox"
)

// prunePartitioned is retention for a partitioned inbox: it creates the
// partitions of the days ahead and drops a day's partition once its whole
// range is older than the window, never the default partition. Consumers
// share the partitions, so the window is the longest any of them needs:
// InboxRetention, or the dedupe window of a consumer whose live migration
// requires more (refusals), whose rows the row-wise prune would keep whole.
// A partition holds no row newer than its range's end (processed_at is the
// claim's time), so a dropped row is older than the window, as with the
// row-wise prune.
func prunePartitioned(ctx context.Context, db outbox.DBTX, c *PruneConfig, m *metrics, refusals []*DedupeWindowError, now time.Time) (*PruneResult, error) {
	res := &PruneResult{Partitioned: true, Retention: c.InboxRetention}
	for _, r := range refusals {
		res.Retention = max(res.Retention, r.Window)
	}
	round, err := tablepart.StartRound(ctx, db, tablepart.Inbox, now)
	if round != nil {
		res.PartitionsCreated, res.DefaultHasRows = round.Created, round.DefaultHasRows
	}
	if err != nil {
		return res, fmt.Errorf("inbox: prune: %w", err)
	}
	expired, err := tablepart.Expired(ctx, db, tablepart.Inbox, now.Add(-res.Retention))
	if err != nil {
		return res, fmt.Errorf("inbox: prune: %w", err)
	}
	for _, p := range expired {
		if err := tablepart.Drop(ctx, round.DB, p); err != nil {
			return res, fmt.Errorf("inbox: prune: %w", err)
		}
		res.PartitionsDropped++
		if m != nil {
			m.droppedParts.WithLabelValues("inbox").Inc()
		}
	}
	return res, nil
}
