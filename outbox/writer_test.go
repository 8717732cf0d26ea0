package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

type bundle struct {
	ctx context.Context
	db  *ferrytest.DB
	// aggregate is unique to the test, so tests share one database.
	aggregate string
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{
		ctx:       ferrytest.Context(t, time.Minute),
		db:        ferrytest.NewMigratedDB(t),
		aggregate: ferrytest.Name(t, "agg"),
	}
}

func (b bundle) event(i int) outbox.Event {
	return outbox.Event{
		AggregateType: "order",
		AggregateID:   fmt.Sprintf("%s-%d", b.aggregate, i%7),
		EventType:     "OrderPlaced",
		Payload:       fmt.Appendf(nil, `{"n":%d}`, i),
		Headers:       map[string]string{"trace": fmt.Sprint(i)},
	}
}

func (b bundle) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type row struct {
	AggregateType, AggregateID, EventType string
	Payload                               []byte
	Headers                               map[string]string
	CreatedAt                             time.Time
}

func (b bundle) get(t *testing.T, id uuid.UUID) row {
	t.Helper()
	var r row
	err := b.db.Pool.QueryRow(b.ctx,
		`SELECT aggregate_type, aggregate_id, event_type, payload, headers, created_at FROM outbox WHERE id = $1`, id).
		Scan(&r.AggregateType, &r.AggregateID, &r.EventType, &r.Payload, &r.Headers, &r.CreatedAt)
	if err != nil {
		t.Fatalf("read event %s: %v", id, err)
	}
	return r
}

// tricky holds every byte value and text that array literals and JSON must
// carry unchanged.
func tricky() outbox.Event {
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte(i)
	}
	return outbox.Event{
		AggregateType: `a "quoted", {braced} \ back`,
		AggregateID:   "NULL",
		EventType:     "été ✓",
		Payload:       payload,
		Headers:       map[string]string{"k,\"}": `v\"{`, "empty": ""},
	}
}

func checkSame(t *testing.T, got row, want outbox.Event) {
	t.Helper()
	if got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID || got.EventType != want.EventType {
		t.Fatalf("stored (%q, %q, %q), want (%q, %q, %q)", got.AggregateType, got.AggregateID, got.EventType,
			want.AggregateType, want.AggregateID, want.EventType)
	}
	if !bytes.Equal(got.Payload, want.Payload) && !(len(got.Payload) == 0 && len(want.Payload) == 0) {
		t.Fatalf("stored payload %x, want %x", got.Payload, want.Payload)
	}
	if len(got.Headers) != len(want.Headers) {
		t.Fatalf("stored headers %v, want %v", got.Headers, want.Headers)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			t.Fatalf("stored header %q = %q, want %q", k, got.Headers[k], v)
		}
	}
}

// writers runs a test once through pgx and once through database/sql.
type writeFunc func(ctx context.Context, b bundle, tx any, events ...outbox.Event) ([]uuid.UUID, error)

type path struct {
	name  string
	begin func(t *testing.T, b bundle) (tx any, commit, rollback func())
	write writeFunc
}

func paths(t *testing.T) []path {
	return []path{
		{
			name: "pgx",
			begin: func(t *testing.T, b bundle) (any, func(), func()) {
				tx, err := b.db.Pool.Begin(b.ctx)
				if err != nil {
					t.Fatal(err)
				}
				return tx, func() { must(t, tx.Commit(b.ctx)) }, func() { must(t, tx.Rollback(b.ctx)) }
			},
			write: func(ctx context.Context, b bundle, tx any, events ...outbox.Event) ([]uuid.UUID, error) {
				return outbox.Write(ctx, tx.(pgx.Tx), events...)
			},
		},
		{
			name: "database/sql",
			begin: func(t *testing.T, b bundle) (any, func(), func()) {
				tx, err := b.db.SQL(t).BeginTx(b.ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				return tx, func() { must(t, tx.Commit()) }, func() { must(t, tx.Rollback()) }
			},
			write: func(ctx context.Context, b bundle, tx any, events ...outbox.Event) ([]uuid.UUID, error) {
				return outbox.WriteSQL(ctx, tx.(*sql.Tx), events...)
			},
		},
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCommittedTransactionKeepsEvents(t *testing.T) {
	t.Parallel()
	for _, p := range paths(t) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tx, commit, _ := p.begin(t, b)
			want := []outbox.Event{b.event(1), tricky(), {AggregateType: "x", AggregateID: "y", EventType: "z"}}
			ids, err := p.write(b.ctx, b, tx, want...)
			must(t, err)
			commit()
			if len(ids) != len(want) {
				t.Fatalf("got %d ids for %d events", len(ids), len(want))
			}
			for i, id := range ids {
				if id.Version() != 7 {
					t.Fatalf("id %s is UUID version %d, want 7", id, id.Version())
				}
				checkSame(t, b.get(t, id), want[i])
			}
			if n := b.count(t); n != len(want) {
				t.Fatalf("outbox holds %d rows, want %d", n, len(want))
			}
		})
	}
}

func TestRolledBackTransactionLeavesNoEvent(t *testing.T) {
	t.Parallel()
	for _, p := range paths(t) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tx, _, rollback := p.begin(t, b)
			_, err := p.write(b.ctx, b, tx, b.event(1), b.event(2))
			must(t, err)
			rollback()
			if n := b.count(t); n != 0 {
				t.Fatalf("outbox holds %d rows after rollback, want 0", n)
			}
		})
	}
}

// countingTx counts the statements that reach PostgreSQL.
type countingTx struct {
	pgx.Tx
	execs int
}

func (c *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.execs++
	return c.Tx.Exec(ctx, sql, args...)
}

func TestThousandEventsInOneStatement(t *testing.T) {
	t.Parallel()
	for _, p := range paths(t) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			events := make([]outbox.Event, 1000)
			for i := range events {
				events[i] = b.event(i)
			}
			tx, commit, _ := p.begin(t, b)
			var counter *countingTx
			if ptx, ok := tx.(pgx.Tx); ok {
				counter = &countingTx{Tx: ptx}
				tx = counter
			}
			ids, err := p.write(b.ctx, b, tx, events...)
			must(t, err)
			commit()
			if counter != nil && counter.execs != 1 {
				t.Fatalf("1000 events took %d statements, want 1", counter.execs)
			}
			if n := b.count(t); n != 1000 || len(ids) != 1000 {
				t.Fatalf("outbox holds %d rows and %d ids came back, want 1000", n, len(ids))
			}
			seen := map[uuid.UUID]bool{}
			for i, id := range ids {
				if seen[id] {
					t.Fatalf("id %s returned twice", id)
				}
				seen[id] = true
				if i > 0 && bytes.Compare(ids[i-1][:], id[:]) >= 0 {
					t.Fatalf("ids %d and %d are not increasing: %s, %s", i-1, i, ids[i-1], id)
				}
			}
			checkSame(t, b.get(t, ids[999]), events[999])
		})
	}
}

func TestCallerChosenIDIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := b.event(1)
	ev.ID = uuid.New()
	ids, err := outbox.Write(b.ctx, b.db.Pool, ev)
	must(t, err)
	if ids[0] != ev.ID {
		t.Fatalf("returned id %s, want the caller's %s", ids[0], ev.ID)
	}
	b.get(t, ev.ID)
}

func TestInvalidEventWritesNothing(t *testing.T) {
	t.Parallel()
	w, err := outbox.NewWriter(&outbox.Config{MaxPayloadBytes: 10})
	must(t, err)
	valid := func() outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "Placed", Payload: []byte("ok")}
	}
	cases := []struct {
		name   string
		mutate func(*outbox.Event)
		field  string
		want   error
	}{
		{"empty aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "aggregate_type", outbox.ErrEmptyAggregateType},
		{"empty aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "aggregate_id", outbox.ErrEmptyAggregateID},
		{"empty event type", func(e *outbox.Event) { e.EventType = "" }, "event_type", outbox.ErrEmptyEventType},
		{"payload over limit", func(e *outbox.Event) { e.Payload = make([]byte, 11) }, "payload", outbox.ErrPayloadTooLarge},
		{"record over limit", func(e *outbox.Event) {
			e.Headers = map[string]string{"big": strings.Repeat("x", outbox.RecordReserveBytes)}
		}, "record", outbox.ErrRecordTooLarge},
		{"NUL in aggregate id", func(e *outbox.Event) { e.AggregateID = "a\x00b" }, "aggregate_id", outbox.ErrInvalidText},
		{"invalid UTF-8 event type", func(e *outbox.Event) { e.EventType = "\xff" }, "event_type", outbox.ErrInvalidText},
		{"empty header name", func(e *outbox.Event) { e.Headers = map[string]string{"": "v"} }, "headers", outbox.ErrInvalidHeader},
		{"reserved header", func(e *outbox.Event) { e.Headers = map[string]string{"id": "x"} }, "headers", outbox.ErrInvalidHeader},
		{"header in Ferry's namespace", func(e *outbox.Event) { e.Headers = map[string]string{"ferry.dlq.original_topic": "x"} }, "headers", outbox.ErrInvalidHeader},
		{"NUL in header value", func(e *outbox.Event) { e.Headers = map[string]string{"k": "\x00"} }, "headers", outbox.ErrInvalidHeader},
		{"invalid UTF-8 header name", func(e *outbox.Event) { e.Headers = map[string]string{"\xfe": "v"} }, "headers", outbox.ErrInvalidHeader},
	}
	for _, p := range paths(t) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, c := range cases {
				bad := valid()
				c.mutate(&bad)
				tx, commit, _ := p.begin(t, b)
				var ids []uuid.UUID
				var err error
				// The bad event comes last: the valid ones before it must not be written either.
				events := []outbox.Event{valid(), valid(), bad}
				switch tx := tx.(type) {
				case pgx.Tx:
					ids, err = w.Write(b.ctx, tx, events...)
				case *sql.Tx:
					ids, err = w.WriteSQL(b.ctx, tx, events...)
				}
				commit()
				if !errors.Is(err, c.want) {
					t.Fatalf("%s: error %v, want %v", c.name, err, c.want)
				}
				var ee *outbox.EventError
				if !errors.As(err, &ee) || ee.Index != 2 || ee.Field != c.field {
					t.Fatalf("%s: error %#v, want *EventError at index 2, field %s", c.name, err, c.field)
				}
				if !strings.Contains(err.Error(), c.field) {
					t.Fatalf("%s: message %q does not name the field %s", c.name, err, c.field)
				}
				if ids != nil {
					t.Fatalf("%s: ids %v returned with an error", c.name, ids)
				}
				if n := b.count(t); n != 0 {
					t.Fatalf("%s: outbox holds %d rows after a refused write, want 0", c.name, n)
				}
			}
		})
	}
}

func TestPayloadAtLimitIsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := b.event(1)
	ev.Payload = bytes.Repeat([]byte{0xAB}, outbox.MaxPayloadBytesDefault)
	if _, err := outbox.Write(b.ctx, b.db.Pool, ev); err != nil {
		t.Fatalf("payload of exactly the default limit refused: %v", err)
	}
	ev.Payload = append(ev.Payload, 0)
	if _, err := outbox.Write(b.ctx, b.db.Pool, ev); !errors.Is(err, outbox.ErrPayloadTooLarge) {
		t.Fatalf("payload one byte over the default limit: error %v, want ErrPayloadTooLarge", err)
	}
}

func TestNewWriterRejectsNegativeLimit(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(&outbox.Config{MaxPayloadBytes: -1})
	if err == nil || !strings.Contains(err.Error(), "MaxPayloadBytes") {
		t.Fatalf("error %v, want one naming MaxPayloadBytes", err)
	}
}

func TestNoEventsIsANoOp(t *testing.T) {
	t.Parallel()
	ids, err := outbox.Write(context.Background(), nil)
	if err != nil || ids != nil {
		t.Fatalf("Write with no events = %v, %v; want nil, nil", ids, err)
	}
}
