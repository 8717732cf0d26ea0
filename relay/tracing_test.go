package relay_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/outbox"
)

// The relay carries the writer's trace context to Kafka unchanged. With
// TraceEvents it makes a producer span per event, a child of the writer's
// span, ended when Kafka acknowledged the record (partition and offset
// then known), and the record carries that span's context instead, so the
// consumer's span descends from the relay's.
func TestTraceContextReachesKafka(t *testing.T) {
	t.Parallel()
	prop := propagation.TraceContext{}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	writer, err := outbox.NewWriter(&outbox.Config{Propagator: prop})
	if err != nil {
		t.Fatal(err)
	}
	for _, traced := range []bool{false, true} {
		name := "carried unchanged"
		if traced {
			name = "a span per event"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			topic := b.topic(t, "order", 1)
			exp := tracetest.NewInMemoryExporter()
			rtp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			cfg := b.cfg
			cfg.TraceEvents, cfg.TracerProvider, cfg.Propagator = traced, rtp, prop
			b.start(t, cfg)

			ctx, request := tp.Tracer("app").Start(b.ctx, "POST /orders")
			ids, err := writer.Write(ctx, b.db.Pool, outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "OrderPlaced", Payload: []byte("{}")})
			request.End()
			if err != nil {
				t.Fatal(err)
			}
			got := consume(t, []string{topic}, []string{ids[0].String()}, time.Minute, 0)
			carried := trace.SpanContextFromContext(prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": header(got.records[0], "traceparent")}))
			if carried.TraceID() != request.SpanContext().TraceID() {
				t.Fatalf("the record carries trace %s, want the writer's %s", carried.TraceID(), request.SpanContext().TraceID())
			}
			spans := exp.GetSpans()
			if !traced {
				if carried.SpanID() != request.SpanContext().SpanID() || len(spans) != 0 {
					t.Errorf("without TraceEvents: the record carries span %s (want the writer's %s) and the relay made %d spans (want 0)",
						carried.SpanID(), request.SpanContext().SpanID(), len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("the relay made %d spans, want 1: %v", len(spans), spans)
			}
			s := spans[0]
			if s.SpanKind != trace.SpanKindProducer || s.Parent.SpanID() != request.SpanContext().SpanID() || carried.SpanID() != s.SpanContext.SpanID() {
				t.Errorf("relay span kind %s parent %s id %s; record carries %s; want a producer span under the writer's %s, carried by the record",
					s.SpanKind, s.Parent.SpanID(), s.SpanContext.SpanID(), carried.SpanID(), request.SpanContext().SpanID())
			}
			want := map[string]string{"messaging.system": "kafka", "messaging.destination.name": topic, "messaging.message.id": ids[0].String(),
				"messaging.destination.partition.id": "0", "messaging.kafka.offset": "0"}
			for k, v := range want {
				if got := attrValue(s, k); got != v {
					t.Errorf("relay span %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func attrValue(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}
