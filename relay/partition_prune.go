package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/outbox"
)

// prunePartitions is retention for a partitioned outbox: it creates the
// partitions of the days ahead, and drops a partition only when its whole
// range is older than Retention and the slot confirmed every row in it.
//
// The proof of "confirmed" is the row-wise prune's, for a whole partition:
// each expired partition is first fenced (partition.Fence), which waits for
// every transaction writing into it to end and makes any later insert into
// it fail. From then on every row it will ever hold is committed, so each
// commit record lies below the WAL insert position read afterwards; once
// the slot confirmed that position the relay published them all. Until it
// does, the partitions stay, fenced but readable (relay recover still finds
// their rows), and Prune returns ErrUnconfirmed like the row-wise prune.
func prunePartitions(ctx context.Context, db outbox.DBTX, slot string, c *PruneConfig, m *metrics) (*PruneResult, error) {
	res := &PruneResult{Partitioned: true}
	now := time.Now()
	round, err := partition.StartRound(ctx, db, partition.Outbox, now)
	if round != nil {
		res.PartitionsCreated, res.DefaultHasRows = round.Created, round.DefaultHasRows
	}
	if err != nil {
		return res, fmt.Errorf("relay: prune: %w", err)
	}
	b := round.DB
	expired, err := partition.Expired(ctx, db, partition.Outbox, now.Add(-c.Retention))
	if err != nil || len(expired) == 0 {
		return res, err
	}
	for _, p := range expired {
		if !p.Fenced {
			if err := partition.Fence(ctx, b, p); err != nil {
				return res, fmt.Errorf("relay: prune: %w", err)
			}
		}
	}
	lsn, err := dbsqlc.New().WALInsertLSN(ctx, db)
	if err != nil {
		return res, fmt.Errorf("relay: prune: read the WAL insert position: %w", err)
	}
	if err := waitConfirmed(ctx, db, slot, lsn, c.ConfirmWait); err != nil {
		return res, err
	}
	for _, p := range expired {
		if err := partition.Drop(ctx, b, p); err != nil {
			return res, fmt.Errorf("relay: prune: %w", err)
		}
		res.PartitionsDropped++
		if m != nil {
			m.droppedParts.Inc()
		}
	}
	return res, nil
}

// logPartitions logs a round of partition retention.
func logPartitions(log *slog.Logger, res *PruneResult) {
	log.Info("outbox partitions pruned", slog.Int("dropped", res.PartitionsDropped), slog.Int("created", res.PartitionsCreated))
	if res.DefaultHasRows {
		log.Warn("the outbox's default partition holds rows (a created_at outside every day's partition), which retention never drops",
			slog.String("partition", partition.Outbox.DefaultName()))
	}
}
