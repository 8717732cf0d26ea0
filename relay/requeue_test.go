package relay_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/relay"
)

// Requeue and discard touch only quarantined events: the id of an ordinary
// outbox row, or of nothing at all, is an error naming it, and the outbox
// keeps its row.
func TestRequeueAndDiscardRefuseEventsNotQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ordinary := uuid.MustParse(b.write(t, evt("order", "a", 1))[0])
	unknown := uuid.New()
	ops := map[string]func([]uuid.UUID) (int64, error){
		"requeue": func(ids []uuid.UUID) (int64, error) { return relay.Requeue(b.ctx, b.db.Pool, ids) },
		"discard": func(ids []uuid.UUID) (int64, error) { return relay.Discard(b.ctx, b.db.Pool, ids) },
	}
	for name, op := range ops {
		for _, id := range []uuid.UUID{ordinary, unknown} {
			n, err := op([]uuid.UUID{id})
			if !errors.Is(err, relay.ErrNotQuarantined) || !strings.Contains(err.Error(), id.String()) || n != 0 {
				t.Errorf("%s %s: %d, %v; want ErrNotQuarantined naming the id", name, id, n, err)
			}
		}
		var rows int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE id = $1`, ordinary).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != 1 {
			t.Fatalf("after %s of an ordinary event's id, the outbox has %d rows of it, want 1", name, rows)
		}
	}
}
