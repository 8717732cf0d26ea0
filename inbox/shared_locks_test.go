package inbox

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// sharedRows is how many rows the shared-lock tests' messages share.
const sharedRows = 4

// sharedRow is the row of the shared table a test message's effect locks:
// its payload's number, modulo sharedRows.
func sharedRow(m *Message) (int, error) {
	seq, err := strconv.Atoi(string(m.Payload))
	if err != nil {
		return 0, Undecodable(fmt.Errorf("payload %q is not a number", m.Payload))
	}
	return seq%sharedRows + 1, nil
}

// lockSharedRow is a handler that locks a row other messages' effects lock
// too, in the order its messages come, as a stock reservation does.
func lockSharedRow(ctx context.Context, tx pgx.Tx, m *Message) error {
	row, err := sharedRow(m)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE shared SET n = n + 1 WHERE id = $1`, row); err != nil {
		return fmt.Errorf("lock shared row %d: %w", row, err)
	}
	return effectHandler(ctx, tx, m)
}

// Batches on several partitions at once whose handlers lock the rows they
// share in the order of their messages never deadlock when the handler
// names the rows (HandleOpts.Locks): every message takes effect once and
// no transaction is aborted by the database.
func TestLocksKeepBatchesThatShareRowsFromDeadlocking(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 4, 64
	b := setup(t, partitions)
	if _, err := b.db.Pool.Exec(b.ctx, fmt.Sprintf(`CREATE TABLE shared (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO shared SELECT g, 0 FROM generate_series(1, %d) g`, sharedRows)); err != nil {
		t.Fatal(err)
	}
	// Partition p's messages lock the rows in turn starting from row p, so
	// that any two batches take the rows they share in other orders.
	for p := range int32(partitions) {
		for i := range perPartition {
			b.produce(b.record(fmt.Sprintf("m-%d-%d", p, i), fmt.Sprintf("k-%d-%d", p, i), p, int(p)+i))
		}
	}
	cfg := b.config()
	cfg.BatchSize = 16
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.HandleWith(b.consumer, b.topic, lockSharedRow, &HandleOpts{Locks: func(m *Message) []string {
		row, err := sharedRow(m)
		if err != nil {
			return nil
		}
		return []string{"shared:" + strconv.Itoa(row)}
	}})
	b.start(w)
	for p := range int32(partitions) {
		b.waitCommitted(b.consumer, p, perPartition)
	}
	if n := b.count(`SELECT count(DISTINCT message_id) FROM effects`); n != partitions*perPartition {
		t.Errorf("%d messages took effect, want %d", n, partitions*perPartition)
	}
	if n := b.count(`SELECT count(*) FROM effects`); n != partitions*perPartition {
		t.Errorf("%d effects, want one per message (%d)", n, partitions*perPartition)
	}
	if n := b.count(`SELECT sum(n)::int FROM shared`); n != partitions*perPartition {
		t.Errorf("the shared rows were updated %d times, want %d", n, partitions*perPartition)
	}
	if st := w.Stats(); st.DatabaseErrors != 0 {
		t.Errorf("%d transactions aborted by the database (deadlocks), want 0: %+v", st.DatabaseErrors, st)
	}
}

// A Locks function that panics fails the message's attempt as its
// handler's panic would: retried, then dead-lettered as retries_exhausted,
// without an effect; the other messages apply.
func TestLocksThatPanicFailTheAttempt(t *testing.T) {
	t.Parallel()
	for _, mode := range modes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.produce(b.record("m-0", "k0", 0, 0), b.record("m-bad", "k1", 0, 1), b.record("m-2", "k2", 0, 2))
			cfg := b.config()
			cfg.MaxAttempts = 2
			mode.set(cfg)
			w, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			w.HandleWith(b.consumer, b.topic, effectHandler, &HandleOpts{Locks: func(m *Message) []string {
				if m.ID == "m-bad" {
					panic("no locks for this one")
				}
				return []string{"row:" + m.ID}
			}})
			b.start(w)
			b.waitCommitted(b.consumer, 0, 3)
			for id, want := range map[string]int{"m-0": 1, "m-bad": 0, "m-2": 1} {
				if n := b.effects(id); n != want {
					t.Errorf("%s has %d effects, want %d", id, n, want)
				}
			}
			dls := b.deadLetters()
			if len(dls) != 1 || dls[0].ID != "m-bad" || dls[0].Reason != ReasonRetriesExhausted {
				t.Fatalf("dead letters %+v, want m-bad alone, %s", dls, ReasonRetriesExhausted)
			}
		})
	}
}
