package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
)

// Effects is the checker worker's handler: it records every effect in
// fault_effects, with the state it found, and moves the consumer's state of
// the aggregate to the event's version. It never refuses an event that comes
// out of order: it records it, so that the checker can count it.
type Effects struct {
	// Worker names the process in each effect row.
	Worker string
	// Delay is slept inside the transaction before the effect, to widen the
	// window between an offset commit and a database commit in the worker's
	// negative control. Zero in the suite proper.
	Delay time.Duration
	// FailEvery fails the first attempt of about one message in FailEvery
	// (chosen by its id) with a transient error: a safe worker retries it in
	// place; the requeue negative control sends it to the back of its
	// queue. Zero: never.
	FailEvery int

	failed sync.Map // consumer + id of the messages failed once
}

// Register returns the workercli registration of the handler for topic,
// under each consumer name.
func (e *Effects) Register(topic string, consumers ...string) workercli.Register {
	return func(w *inbox.Worker) error {
		if len(consumers) == 0 {
			return errors.New("faults: no consumer to register")
		}
		for _, c := range consumers {
			w.Handle(c, topic, e.Handle)
		}
		return nil
	}
}

// Handle applies one message inside the inbox's transaction.
func (e *Effects) Handle(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	b, err := decodeBody(m.Payload)
	if err != nil {
		return inbox.Undecodable(err)
	}
	id, err := uuid.Parse(m.ID)
	if err != nil {
		return inbox.Undecodable(fmt.Errorf("message id %q is not a uuid: %w", m.ID, err))
	}
	if e.FailEvery > 0 && b.Kind == KindVersioned && id[15]%byte(min(e.FailEvery, 255)) == 0 {
		if _, again := e.failed.LoadOrStore(m.Consumer+"/"+m.ID, true); !again {
			return fmt.Errorf("transient failure of %s v%d, on purpose (first attempt)", b.Aggregate, b.Version)
		}
	}
	if e.Delay > 0 {
		t := time.NewTimer(e.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	switch b.Kind {
	case KindPoison:
		return inbox.Permanent(fmt.Errorf("poison event of %s: refused on purpose", b.Aggregate))
	case KindVersioned:
		var prev int64
		err := tx.QueryRow(ctx, `SELECT version FROM fault_state WHERE consumer = $1 AND aggregate_id = $2 FOR UPDATE`,
			m.Consumer, b.Aggregate).Scan(&prev)
		if errors.Is(err, pgx.ErrNoRows) {
			return inbox.Permanent(fmt.Errorf("unknown aggregate %q", b.Aggregate))
		}
		if err != nil {
			return fmt.Errorf("lock state of %s: %w", b.Aggregate, err)
		}
		_, err = tx.Exec(ctx, `WITH s AS (
				UPDATE fault_state SET version = $4, applied = applied + 1 WHERE consumer = $1 AND aggregate_id = $3
			)
			INSERT INTO fault_effects (consumer, message_id, aggregate_id, version, prev_version, worker, partition, kafka_offset)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			m.Consumer, id, b.Aggregate, b.Version, prev, e.Worker, m.Partition, m.Offset)
		if err != nil {
			return fmt.Errorf("apply %s v%d: %w", b.Aggregate, b.Version, err)
		}
		return nil
	case KindHuge:
		// Kafka should never carry one (the relay quarantines it); if it
		// does, the effect is recorded like any other.
		_, err = tx.Exec(ctx, `INSERT INTO fault_effects (consumer, message_id, aggregate_id, version, worker, partition, kafka_offset)
			VALUES ($1, $2, $3, 0, $4, $5, $6)`, m.Consumer, id, b.Aggregate, e.Worker, m.Partition, m.Offset)
		return err
	default:
		return inbox.Undecodable(fmt.Errorf("unknown event kind %q", b.Kind))
	}
}
