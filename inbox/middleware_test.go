package inbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Middleware given to Use wraps every handler, whether Use comes before or
// after Handle, the first outermost, and runs inside the message's
// transaction: what it writes commits with the effect, or rolls back with a
// failed attempt.
func TestUseWrapsEveryHandlerInItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))

	var mu sync.Mutex
	trail := map[string][]string{} // consumer/id -> what ran, in order
	note := func(m *Message, what string) {
		mu.Lock()
		defer mu.Unlock()
		trail[m.Consumer+"/"+m.ID] = append(trail[m.Consumer+"/"+m.ID], what)
	}
	mark := func(name string) Middleware {
		return func(next Handler) Handler {
			return func(ctx context.Context, tx pgx.Tx, m *Message) error {
				note(m, name)
				if err := insertEffect(ctx, tx, m, name); err != nil {
					return err
				}
				return next(ctx, tx, m)
			}
		}
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		note(m, "handler")
		if err := insertEffect(ctx, tx, m, "handler"); err != nil {
			return err
		}
		if m.ID == "m-2" && m.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}

	cfg := b.config()
	cfg.BatchSize = 1
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second := b.consumer + "_b"
	w.Use(mark("outer"))
	w.Handle(b.consumer, b.topic, handler)
	w.Use(mark("inner"))
	w.Handle(second, b.topic, handler)
	b.start(w)
	b.waitCommitted(b.consumer, 0, 2)
	b.waitCommitted(second, 0, 2)

	mu.Lock()
	defer mu.Unlock()
	once := []string{"outer", "inner", "handler"}
	for _, c := range []string{b.consumer, second} {
		if got := trail[c+"/m-1"]; !slices.Equal(got, once) {
			t.Errorf("%s m-1 ran %v, want %v", c, got, once)
		}
		if got, want := trail[c+"/m-2"], append(slices.Clone(once), once...); !slices.Equal(got, want) {
			t.Errorf("%s m-2 ran %v, want %v (the first attempt fails)", c, got, want)
		}
		for _, id := range []string{"m-1", "m-2"} {
			// One row per layer: the failed attempt's rows rolled back.
			for _, layer := range once {
				if n := b.count(`SELECT count(*) FROM effects WHERE consumer = $1 AND message_id = $2 AND worker = $3`, c, id, layer); n != 1 {
					t.Errorf("%s %s: %d rows written by %s, want 1 (committed with the effect)", c, id, n, layer)
				}
			}
		}
	}
}
