package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sqlc-dev/pqtype"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// KafkaMaxMessageBytesDefault is Kafka's default max.message.bytes (the
// broker's message.max.bytes): the largest record batch a topic accepts
// unless it is configured otherwise, counted as Kafka counts it, 61 bytes of
// batch header plus the records. The writer's default limit is derived from
// it, and the relay produces up to it until it has read a topic's own limit.
const KafkaMaxMessageBytesDefault = 1_048_588

// RecordReserveBytes is the part of a record limit kept for what a Kafka
// record carries beside its payload: the key (the aggregate id), the headers
// (Ferry's four and the event's own) and the framing.
const RecordReserveBytes = 16 << 10

// MaxPayloadBytesDefault is the default payload limit, 1,032,204 bytes:
// Kafka's default max.message.bytes less RecordReserveBytes, so that the
// relay publishes every event the default writer accepts to a topic with
// Kafka's default limit. (1 MiB would not fit: Kafka's default limit leaves
// a record 1,048,527 bytes, key and headers included.)
const MaxPayloadBytesDefault = KafkaMaxMessageBytesDefault - RecordReserveBytes

// DBTX runs statements: pgx.Tx, *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn
// all have it. It is Ferry's one database interface: Write takes it (pass
// the transaction that writes the business rows; a pool or a bare
// connection writes in a transaction of its own), and so do inbox.Prune,
// inbox.Status and the relay's admin functions.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner begins a transaction, as pgx.BeginFunc needs: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx (whose Begin makes a savepoint) all have it. It is
// DBTX's companion for what runs transactions of its own: the inbox
// worker (inbox.Config.DB), the relay's requeue and discard, and the
// migration controller and bridge.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// SQLExecer is what WriteSQL needs of database/sql: *sql.Tx, *sql.DB and
// *sql.Conn all have it.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Config tunes a Writer. The zero value is ready to use.
type Config struct {
	// MaxPayloadBytes refuses larger payloads before anything is written.
	// It also bounds the whole Kafka record the relay makes of an event
	// (payload, key, headers and framing, in a batch of its own) to
	// MaxPayloadBytes + RecordReserveBytes: with the default, exactly Kafka's
	// default max.message.bytes, so the relay can publish every event the
	// writer accepts. For topics whose max.message.bytes is raised, set it to
	// that limit less RecordReserveBytes; for topics with a smaller limit,
	// lower it likewise, or larger events end in the relay's quarantine.
	// Defaults to MaxPayloadBytesDefault (1,032,204 bytes).
	MaxPayloadBytes int

	// Propagator records the caller's trace context (the span in the
	// context given to Write) in each event's headers, W3C traceparent and
	// tracestate with OpenTelemetry's TraceContext, so that the relay
	// carries it to Kafka and the worker continues the trace. A header the
	// event already has is left as it is. Defaults to nil: OpenTelemetry's
	// global propagator, which writes nothing until the application sets
	// one (otel.SetTextMapPropagator), as OpenTelemetry libraries do.
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, MaxPayloadBytesDefault)
	return c
}

func (c Config) validate() error {
	if c.MaxPayloadBytes < 0 {
		return fmt.Errorf("outbox: Config.MaxPayloadBytes is %d: must be positive", c.MaxPayloadBytes)
	}
	return nil
}

// Writer inserts events into the outbox table. It holds no connection and is
// safe for concurrent use.
type Writer struct {
	cfg     Config
	queries *dbsqlc.Queries
}

// NewWriter returns a Writer configured by cfg, which may be nil.
func NewWriter(cfg *Config) (*Writer, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Writer{cfg: c.WithDefaults(), queries: dbsqlc.New()}, nil
}

var defaultWriter, _ = NewWriter(nil)

// Write inserts events with the default configuration. See Writer.Write.
func Write(ctx context.Context, tx DBTX, events ...Event) ([]uuid.UUID, error) {
	return defaultWriter.Write(ctx, tx, events...)
}

// WriteSQL inserts events with the default configuration. See Writer.WriteSQL.
func WriteSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]uuid.UUID, error) {
	return defaultWriter.WriteSQL(ctx, tx, events...)
}

// Write inserts events through pgx in one statement and returns their ids in
// the order given. When any event is invalid it returns an *EventError and
// writes nothing.
func (w *Writer) Write(ctx context.Context, tx DBTX, events ...Event) ([]uuid.UUID, error) {
	rows, err := w.prepare(ctx, events)
	if err != nil || len(events) == 0 {
		return nil, err
	}
	if err := w.queries.OutboxInsertMany(ctx, tx, rows); err != nil {
		return nil, fmt.Errorf("outbox: insert %d events: %w", len(events), err)
	}
	return rows.Ids, nil
}

// WriteSQL inserts events through database/sql in one statement and returns
// their ids in the order given. It works with any PostgreSQL driver: the
// columns travel as PostgreSQL array literals in text parameters and the
// headers as one JSON array. When any event is invalid it returns an
// *EventError and writes nothing.
func (w *Writer) WriteSQL(ctx context.Context, tx SQLExecer, events ...Event) ([]uuid.UUID, error) {
	rows, err := w.prepare(ctx, events)
	if err != nil || len(events) == 0 {
		return nil, err
	}
	ids := make([]string, len(rows.Ids))
	for i, id := range rows.Ids {
		ids[i] = id.String()
	}
	payloads := make([]string, len(rows.Payloads))
	for i, p := range rows.Payloads {
		payloads[i] = `\x` + hex.EncodeToString(p)
	}
	// The headers objects travel as one JSON array: jsonb is the natural
	// carrier for JSON, and pqtype hands raw JSON to any driver.
	headers := pqtype.NullRawMessage{RawMessage: jsonArray(rows.Headers), Valid: true}
	_, err = tx.ExecContext(ctx, insertManySQL,
		arrayLiteral(ids), arrayLiteral(rows.AggregateTypes), arrayLiteral(rows.AggregateIds),
		arrayLiteral(rows.EventTypes), arrayLiteral(payloads), headers)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d events: %w", len(events), err)
	}
	return rows.Ids, nil
}

// insertManySQL is OutboxInsertMany for database/sql: the columns travel as
// text array literals and the headers as a JSON array, so drivers need no
// array support.
const insertManySQL = `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, h.headers
FROM unnest($1::text::uuid[], $2::text::text[], $3::text::text[], $4::text::text[], $5::text::bytea[])
     WITH ORDINALITY AS e(id, aggregate_type, aggregate_id, event_type, payload, n)
JOIN jsonb_array_elements($6::jsonb) WITH ORDINALITY AS h(headers, n) USING (n)`

// jsonArray joins JSON objects into one JSON array.
func jsonArray(objects []json.RawMessage) json.RawMessage {
	n := 2
	for _, o := range objects {
		n += len(o) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, o := range objects {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, o...)
	}
	return append(b, ']')
}

// prepare validates every event, then makes ids and encodes headers with
// the trace context of ctx. It allocates the columns once for the whole
// call.
func (w *Writer) prepare(ctx context.Context, events []Event) (dbsqlc.OutboxInsertManyParams, error) {
	for i := range events {
		if err := validate(i, &events[i], w.cfg.MaxPayloadBytes); err != nil {
			return dbsqlc.OutboxInsertManyParams{}, err
		}
	}
	trace := w.traceHeaders(ctx)
	n := len(events)
	p := dbsqlc.OutboxInsertManyParams{
		Ids:            make([]uuid.UUID, n),
		AggregateTypes: make([]string, n),
		AggregateIds:   make([]string, n),
		EventTypes:     make([]string, n),
		Payloads:       make([][]byte, n),
		Headers:        make([]json.RawMessage, n),
	}
	for i := range events {
		ev := &events[i]
		id := ev.ID
		if id == uuid.Nil {
			var err error
			if id, err = uuid.NewV7(); err != nil {
				return dbsqlc.OutboxInsertManyParams{}, fmt.Errorf("outbox: make event id: %w", err)
			}
		}
		headers := []byte("{}")
		if hs := withTrace(ev.Headers, trace); len(hs) > 0 {
			var err error
			if headers, err = json.Marshal(hs); err != nil {
				return dbsqlc.OutboxInsertManyParams{}, &EventError{Index: i, Field: "headers", Err: errors.Join(ErrInvalidHeader, err)}
			}
		}
		p.Ids[i] = id
		p.AggregateTypes[i] = ev.AggregateType
		p.AggregateIds[i] = ev.AggregateID
		p.EventTypes[i] = ev.EventType
		p.Payloads[i] = ev.Payload
		if p.Payloads[i] == nil {
			p.Payloads[i] = []byte{} // the column is NOT NULL
		}
		p.Headers[i] = headers
	}
	return p, nil
}

// arrayLiteral renders a one-dimensional PostgreSQL array literal whose every
// element is quoted, so no element is read as NULL or split.
func arrayLiteral(elems []string) string {
	var b strings.Builder
	size := 2
	for _, e := range elems {
		size += len(e) + 3
	}
	b.Grow(size)
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(e); j++ {
			if e[j] == '"' || e[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(e[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// traceHeaders is what the propagator writes for the trace context of ctx;
// nil when it writes nothing (no propagator set, or no span in ctx).
func (w *Writer) traceHeaders(ctx context.Context) propagation.MapCarrier {
	prop := w.cfg.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	var c lazyCarrier
	prop.Inject(ctx, &c)
	return c.m
}

// withTrace adds the trace headers an event does not set itself; the
// event's own map is never modified.
func withTrace(headers map[string]string, trace propagation.MapCarrier) map[string]string {
	if len(trace) == 0 {
		return headers
	}
	out := make(map[string]string, len(headers)+len(trace))
	maps.Copy(out, trace)
	maps.Copy(out, headers)
	return out
}

// lazyCarrier is a propagation.TextMapCarrier that allocates only when the
// propagator writes.
type lazyCarrier struct{ m propagation.MapCarrier }

func (c *lazyCarrier) Get(key string) string { return c.m.Get(key) }

func (c *lazyCarrier) Set(key, value string) {
	if c.m == nil {
		c.m = propagation.MapCarrier{}
	}
	c.m.Set(key, value)
}

func (c *lazyCarrier) Keys() []string { return c.m.Keys() }
