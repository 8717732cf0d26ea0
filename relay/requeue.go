package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// Quarantined lists the events in outbox_quarantine, oldest first, at most
// limit of them.
func Quarantined(ctx context.Context, db *pgxpool.Pool, limit int) ([]*dbsqlc.OutboxQuarantine, error) {
	rows, err := dbsqlc.New().OutboxQuarantineList(ctx, db, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("list quarantined events: %w", err)
	}
	return rows, nil
}

// Requeue moves quarantined events back into the outbox, once their cause
// is fixed (say, the topic's max.message.bytes raised). The relay publishes
// them again with their original ids, so consumers that somehow saw one
// still apply it once. ids nil requeues every quarantined event. It returns
// how many moved.
func Requeue(ctx context.Context, db *pgxpool.Pool, ids []uuid.UUID) (int64, error) {
	q := dbsqlc.New()
	var moved int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if ids == nil {
			var err error
			if ids, err = q.OutboxQuarantineIDs(ctx, tx); err != nil {
				return err
			}
		}
		// The original rows are still in the outbox (unless retention took
		// them): delete them, unpublished, so the ids can be inserted again.
		if _, err := q.OutboxDeleteByIDs(ctx, tx, ids); err != nil {
			return err
		}
		n, err := q.OutboxQuarantineRequeue(ctx, tx, ids)
		moved = n
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("requeue quarantined events: %w", err)
	}
	return moved, nil
}
