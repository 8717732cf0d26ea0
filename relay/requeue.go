package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// Beginner begins a transaction, as pgx.BeginFunc needs: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx (whose Begin makes a savepoint) all have it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Requeue moves quarantined events back into the outbox, once their cause
// is fixed (say, the topic's max.message.bytes raised). The relay publishes
// them again with their original ids, so consumers that somehow saw one
// still apply it once. ids nil requeues every quarantined event. It returns
// how many moved.
//
// The move is one transaction begun on db: a *pgxpool.Pool or *pgx.Conn
// begins its own, a pgx.Tx makes it a savepoint of the caller's transaction.
func Requeue(ctx context.Context, db Beginner, ids []uuid.UUID) (int64, error) {
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
