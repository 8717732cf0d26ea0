package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/outbox"
)

// ErrNotQuarantined means a requeue or discard named an event that is not
// in quarantine: an ordinary outbox row, or no event at all. Nothing was
// changed.
var ErrNotQuarantined = errors.New("relay: not a quarantined event")

// Requeue moves quarantined events back into the outbox, once their cause
// is fixed (say, the topic's max.message.bytes raised). The relay publishes
// them again with their original ids, so consumers that somehow saw one
// still apply it once. ids nil requeues every quarantined event. An event
// brings along the events quarantined behind it (ReasonBehindQuarantined,
// Config.QuarantineOrder keep), so that an aggregate's held events go back
// together. They go back in the order they were quarantined, which is each
// aggregate's commit order. It returns how many moved.
//
// With Config.QuarantineOrder skip (the default) the later events of an
// aggregate were published meanwhile: a requeued event reaches consumers
// after them. With keep, the relay publishes the requeued events in order,
// ahead of the aggregate's new ones.
//
// The move is one transaction begun on db: a *pgxpool.Pool or *pgx.Conn
// begins its own, a pgx.Tx makes it a savepoint of the caller's transaction.
func Requeue(ctx context.Context, db outbox.Beginner, ids []uuid.UUID) (int64, error) {
	q := dbsqlc.New()
	var moved int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if ids, err = selection(ctx, q, tx, ids, true); err != nil {
			return err
		}
		// The original rows are still in the outbox (unless retention took
		// them): delete them, unpublished, so the ids can be inserted again.
		if _, err := q.OutboxDeleteByIDs(ctx, tx, ids); err != nil {
			return err
		}
		moved, err = q.OutboxQuarantineRequeue(ctx, tx, ids)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("requeue quarantined events: %w", err)
	}
	return moved, nil
}

// Discard deletes quarantined events for good, with their original outbox
// rows: they are never published. ids nil discards every quarantined event.
// Unlike Requeue it deletes exactly the events named: those quarantined
// behind one of them stay, for Requeue. With Config.QuarantineOrder keep a
// discard releases the aggregate the events held (within a second). It
// returns how many were discarded.
func Discard(ctx context.Context, db outbox.Beginner, ids []uuid.UUID) (int64, error) {
	q := dbsqlc.New()
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if ids, err = selection(ctx, q, tx, ids, false); err != nil {
			return err
		}
		if ids, err = q.OutboxQuarantineDiscard(ctx, tx, ids); err != nil {
			return err
		}
		n = int64(len(ids))
		// The relay, which sees no delete, tells a discarded event from a
		// requeued one by its absence from the outbox.
		_, err = q.OutboxDeleteByIDs(ctx, tx, ids)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("discard quarantined events: %w", err)
	}
	return n, nil
}

// selection is the quarantined events an operation on ids touches: every
// one for nil, else ids plus, if withBehind, the events quarantined behind
// them.
// An id that is not quarantined is an error (ErrNotQuarantined): the
// caller named the wrong event, and acting on the others would hide it.
func selection(ctx context.Context, q *dbsqlc.Queries, tx pgx.Tx, ids []uuid.UUID, withBehind bool) ([]uuid.UUID, error) {
	if ids == nil {
		return q.OutboxQuarantineIDs(ctx, tx)
	}
	found, err := q.OutboxQuarantineWithBehind(ctx, tx, dbsqlc.OutboxQuarantineWithBehindParams{Ids: ids, BehindReason: string(ReasonBehindQuarantined)})
	if err != nil {
		return nil, err
	}
	in := make(map[uuid.UUID]bool, len(found))
	for _, id := range found {
		in[id] = true
	}
	for _, id := range ids {
		if !in[id] {
			return nil, fmt.Errorf("%w: %s is not in outbox_quarantine (an ordinary outbox event, or none; `relay quarantine list` shows the quarantined ones)", ErrNotQuarantined, id)
		}
	}
	if withBehind {
		return found, nil
	}
	return ids, nil
}
