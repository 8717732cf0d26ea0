package inbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/pgerr"
)

// repeatableRead begins every transaction at REPEATABLE READ, where
// PostgreSQL reports a write to a row changed since the snapshot as a
// serialization failure.
type repeatableRead struct{ pool *pgxpool.Pool }

func (r repeatableRead) Begin(ctx context.Context) (pgx.Tx, error) {
	return r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
}

// serializationFailure makes tx fail the way concurrent writers do: another
// transaction updates row 1 and commits after tx's snapshot was taken (the
// inbox claim took it), so tx's own update of row 1 fails with 40001.
func serializationFailure(ctx context.Context, tx pgx.Tx, pool *pgxpool.Pool, _ *sync.WaitGroup) error {
	if _, err := pool.Exec(ctx, `UPDATE contended SET n = n + 1 WHERE id = 1`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE contended SET n = n + 1 WHERE id = 1`)
	return err
}

// deadlock makes tx the victim of a real deadlock: tx holds row 1; another
// transaction holds row 2 and waits for row 1; then tx asks for row 2. The
// cycle is closed before tx starts waiting, and tx's deadlock_timeout is the
// shorter one, so tx is the one PostgreSQL aborts with 40P01. The other
// transaction gets row 1 once tx rolls back, and rolls back too.
//
// PostgreSQL looks for a deadlock once per wait, when deadlock_timeout
// ends: tx may ask for row 2 only once the other transaction waits for tx
// itself (pg_blocking_pids), not merely for some lock, or a check that
// finds no cycle yet leaves tx waiting until the handler times out.
//
// The previous call's other transaction must be gone first. Woken by the
// previous tx's abort, it may still be about to take row 1, holding row 2:
// if this tx took row 1 first, the previous one would wait for this tx, and
// this call's other transaction for row 2; this tx waits on that one in the
// handler, a cycle through the client that PostgreSQL cannot see.
func deadlock(ctx context.Context, tx pgx.Tx, pool *pgxpool.Pool, wg *sync.WaitGroup) error {
	wg.Wait()
	var txPID int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&txPID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '10ms'; UPDATE contended SET n = n + 1 WHERE id = 1`); err != nil {
		return err
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	var otherPID int
	if _, err = other.Exec(ctx, `SET LOCAL deadlock_timeout = '10min'`); err == nil {
		err = other.QueryRow(ctx, `UPDATE contended SET n = n + 1 WHERE id = 2 RETURNING pg_backend_pid()`).Scan(&otherPID)
	}
	if err != nil {
		_ = other.Rollback(context.WithoutCancel(ctx))
		return err
	}
	wg.Go(func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = other.Exec(ctx, `UPDATE contended SET n = n + 1 WHERE id = 1`) // waits for tx
		_ = other.Rollback(ctx)
	})
	for {
		var blocked bool
		if err := pool.QueryRow(ctx, `SELECT $2::int = ANY(pg_blocking_pids($1))`, otherPID, txPID).Scan(&blocked); err != nil {
			return err
		}
		if blocked {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	_, err = tx.Exec(ctx, `UPDATE contended SET n = n + 1 WHERE id = 2`)
	return err
}

// A deadlock or a serialization failure is the database's doing, not the
// message's: raised by the server in the handler's transaction more times
// than MaxAttempts allows, it is retried without counting, and the message
// takes effect once and is never dead-lettered, one message per transaction
// and in batches.
func TestDeadlocksAndSerializationFailuresNeverDeadLetter(t *testing.T) {
	t.Parallel()
	for _, conflict := range []struct {
		name    string
		code    string
		provoke func(context.Context, pgx.Tx, *pgxpool.Pool, *sync.WaitGroup) error
	}{
		{"serialization_failure", pgerrcode.SerializationFailure, serializationFailure},
		{"deadlock", pgerrcode.DeadlockDetected, deadlock},
	} {
		for _, mode := range modes[:2] {
			t.Run(conflict.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 1)
				if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE contended (id int PRIMARY KEY, n int NOT NULL);
					INSERT INTO contended VALUES (1, 0), (2, 0)`); err != nil {
					t.Fatal(err)
				}
				b.produce(b.record("m-0", "k0", 0, 0), b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))
				const maxAttempts, conflicts = 2, 4
				var (
					mu    sync.Mutex
					codes []string
					wg    sync.WaitGroup
				)
				h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
					mu.Lock()
					provoke := m.ID == "m-1" && len(codes) < conflicts
					mu.Unlock()
					if provoke {
						err := conflict.provoke(ctx, tx, b.db.Pool, &wg)
						mu.Lock()
						codes = append(codes, pgerr.Code(err))
						mu.Unlock()
						if err != nil {
							return fmt.Errorf("reserve: %w", err)
						}
					}
					return effectHandler(ctx, tx, m)
				}
				cfg := b.config()
				cfg.DB = repeatableRead{b.db.Pool}
				cfg.MaxAttempts = maxAttempts
				mode.set(cfg)
				w := b.newWorker(cfg, h)
				b.start(w)
				b.waitCommitted(b.consumer, 0, 3)
				defer wg.Wait()

				mu.Lock()
				got := codes
				mu.Unlock()
				if len(got) != conflicts {
					t.Errorf("the handler met %d conflicts, want %d: %q", len(got), conflicts, got)
				}
				for _, c := range got {
					if c != conflict.code {
						t.Fatalf("the server answered %q, want %s every time: %q", c, conflict.code, got)
					}
				}
				for _, id := range []string{"m-0", "m-1", "m-2"} {
					if n := b.effects(id); n != 1 {
						t.Errorf("%s has %d effects, want 1", id, n)
					}
				}
				var attempt int
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT attempt FROM effects WHERE message_id = 'm-1'`).Scan(&attempt); err == nil && attempt != conflicts+1 {
					t.Errorf("m-1 took effect on call %d, want %d", attempt, conflicts+1)
				}
				if n := b.count(`SELECT count(*) FROM effects a JOIN effects b ON a.key = b.key AND a.seq < b.seq AND a.n > b.n`); n != 0 {
					t.Errorf("%d effects out of key order", n)
				}
				if dls := b.deadLetters(); len(dls) != 0 {
					t.Errorf("dead letters %+v, want none", dls)
				}
				if st := w.Stats(); st.DeadLettered != 0 || st.Retries != 0 || st.DatabaseErrors != conflicts {
					t.Errorf("stats %+v: want nothing dead-lettered, no handler retry counted, %d database errors", st, conflicts)
				}
			})
		}
	}
}
