//go:build ferryfault

package inbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The negative controls must cause what the checks catch: acking before the
// database loses the message the connection died under; retrying by
// requeue reorders its aggregate.
func TestRabbitNegativeControls(t *testing.T) {
	t.Parallel()
	t.Run("ack before db loses", func(t *testing.T) {
		t.Parallel()
		b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
		want := b.events(3, 10)
		cfg := b.config()
		UnsafeAckBeforeDB(cfg)
		w, _ := New(cfg)
		var cut atomic.Bool
		w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
			if cut.CompareAndSwap(false, true) {
				cutConnection(w)
				return errors.New("the connection went away under the handler")
			}
			return effectHandler(ctx, tx, m)
		})
		stop := b.start(w)
		// Quiet for 2s: whatever was acked early and not applied is gone.
		for last, quiet := -1, 0; quiet < 20; quiet++ {
			if n := b.effects(); n != last {
				last, quiet = n, 0
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		n := b.effects()
		if n >= want {
			t.Fatalf("%d effects of %d messages: the negative control lost nothing", n, want)
		}
		t.Logf("%d of %d messages lost", want-n, want)
	})
	t.Run("requeue retries reorder", func(t *testing.T) {
		t.Parallel()
		b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
		want := b.events(4, 20)
		cfg := b.config()
		UnsafeRequeueRetries(cfg)
		w, _ := New(cfg)
		var mu sync.Mutex
		failed := map[string]int{}
		w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
			if strings.HasSuffix(m.ID, "-3") {
				mu.Lock()
				failed[m.ID]++
				n := failed[m.ID]
				mu.Unlock()
				if n <= 1 {
					return errors.New("transient")
				}
			}
			return effectHandler(ctx, tx, m)
		})
		stop := b.start(w)
		b.waitEffects(want)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		var inversions int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (
			SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY n) AS inv FROM effects) x WHERE inv`).Scan(&inversions); err != nil {
			t.Fatal(err)
		}
		if inversions == 0 {
			t.Fatal("no order inversion: the negative control reordered nothing")
		}
		if n := b.queued(); n != 0 {
			t.Errorf("%d messages left in the queue", n)
		}
		t.Logf("%d order inversions", inversions)
	})
}
