package outbox_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Rows written with SQL, by any tool, cannot use a header name Ferry
// reserves: the table's check constraint refuses them, as the Go writer
// does. Other names pass.
func TestTableRefusesReservedHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert := func(headers string) error {
		_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES (gen_random_uuid(), 'order', '1', 'AuditNoteOnly', '\x00'::bytea, $1::jsonb)`, headers)
		return err
	}
	for _, h := range []string{`{"event_type": "OrderPlaced"}`, `{"id": "x"}`, `{"aggregate_id": "2"}`, `{"aggregate_type": "stock"}`,
		`{"ferry.dlq.original_topic": "orders"}`, `{"a": "1", "ferry.redrive.from": "x"}`} {
		err := insert(h)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.ConstraintName != "outbox_headers_not_reserved" {
			t.Errorf("insert with headers %s: %v, want a violation of outbox_headers_not_reserved", h, err)
		}
	}
	for _, h := range []string{`{}`, `{"traceparent": "00-x", "ferry": "not the namespace", "Event_Type": "case differs"}`} {
		if err := insert(h); err != nil {
			t.Errorf("insert with headers %s: %v, want it accepted", h, err)
		}
	}
}
