package outbox_test

import (
	"context"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/outbox"
)

// The caller's span context travels in each event's headers, through pgx and
// database/sql, as W3C traceparent from the configured propagator; a header
// the event sets itself is kept. Without a propagator (OpenTelemetry's
// global one is a no-op until the application sets one) or without a span,
// the headers are exactly the event's own.
func TestWriteRecordsTheCallersTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(b.ctx, "request")
	defer span.End()
	traced, err := outbox.NewWriter(&outbox.Config{Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, p := range []struct {
		name  string
		write func(ctx context.Context, events ...outbox.Event) error
	}{
		{"pgx", func(ctx context.Context, events ...outbox.Event) error {
			ids, err := traced.Write(ctx, b.db.Pool, events...)
			if err == nil {
				for i := range events {
					events[i].ID = ids[i]
				}
			}
			return err
		}},
		{"database/sql", func(ctx context.Context, events ...outbox.Event) error {
			ids, err := traced.WriteSQL(ctx, b.db.SQL(t), events...)
			if err == nil {
				for i := range events {
					events[i].ID = ids[i]
				}
			}
			return err
		}},
	} {
		t.Run(p.name, func(t *testing.T) {
			events := []outbox.Event{b.event(1), b.event(2)}
			events[1].Headers = map[string]string{"traceparent": own}
			before := maps.Clone(events[1].Headers)
			if err := p.write(ctx, events...); err != nil {
				t.Fatal(err)
			}
			var carrier propagation.MapCarrier = b.get(t, events[0].ID).Headers
			got := propagation.TraceContext{}.Extract(context.Background(), carrier)
			if sc, gc := span.SpanContext(), trace.SpanContextFromContext(got); gc.TraceID() != sc.TraceID() || gc.SpanID() != sc.SpanID() {
				t.Errorf("stored trace context %v, want the caller's span %s/%s", carrier, sc.TraceID(), sc.SpanID())
			}
			if h := b.get(t, events[1].ID).Headers; h["traceparent"] != own {
				t.Errorf("the event's own traceparent became %q", h["traceparent"])
			}
			if !maps.Equal(events[1].Headers, before) {
				t.Errorf("Write changed the caller's header map: %v", events[1].Headers)
			}
		})
	}

	// The global propagator, unset: nothing added, even with a span.
	ev := b.event(3)
	ids, err := outbox.Write(ctx, b.db.Pool, ev)
	if err != nil {
		t.Fatal(err)
	}
	if h := b.get(t, ids[0]).Headers; !maps.Equal(h, ev.Headers) {
		t.Errorf("with no propagator set the headers became %v, want the event's own %v", h, ev.Headers)
	}
	// A propagator but no span: nothing added.
	ids, err = traced.Write(b.ctx, b.db.Pool, ev)
	if err != nil {
		t.Fatal(err)
	}
	if h := b.get(t, ids[0]).Headers; !maps.Equal(h, ev.Headers) {
		t.Errorf("with no span the headers became %v, want the event's own %v", h, ev.Headers)
	}
}
