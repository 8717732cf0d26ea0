package inbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// Each message's handler calls run in one consumer span, a child of the
// span whose context the record's traceparent header carries, with the
// messaging attributes; a failed call that is retried is a span event, as
// is the dead-letter decision, whose span ends in error. The dead letter
// keeps the trace headers, and so does the record a redrive publishes. An
// event the handler writes with outbox.Write and the handler's context
// carries the consumer span as its parent: the trace goes on.
func TestHandlerCallsRunInAConsumerSpanOfTheProducersTrace(t *testing.T) {
	t.Parallel()
	for _, mode := range modes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			tp, prop := sdktrace.NewTracerProvider(), propagation.TraceContext{}
			exp := tracetest.NewInMemoryExporter()
			tp.RegisterSpanProcessor(sdktrace.NewSimpleSpanProcessor(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			// The producer's span, as outbox.Write records it.
			_, producer := tp.Tracer("app").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
			producer.End()
			traced := func(r *kgo.Record) *kgo.Record {
				c := propagation.MapCarrier{}
				prop.Inject(trace.ContextWithSpan(context.Background(), producer), c)
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte(c.Get("traceparent"))})
				return r
			}
			b.produce(traced(b.record("m-ok", "k1", 0, 1)), traced(b.record("m-flaky", "k2", 0, 2)), traced(b.record("m-poison", "k3", 0, 3)))

			var mu sync.Mutex
			calls := map[string]int{}
			var written []string
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				mu.Lock()
				calls[m.ID]++
				n := calls[m.ID]
				mu.Unlock()
				switch {
				case m.ID == "m-poison":
					return Permanent(errors.New("cannot decode"))
				case m.ID == "m-flaky" && n < 3:
					return errors.New("try again")
				}
				w, err := outbox.NewWriter(&outbox.Config{Propagator: prop})
				if err != nil {
					return err
				}
				ids, err := w.Write(ctx, tx, outbox.Event{AggregateType: "next", AggregateID: m.ID, EventType: "Followed", Payload: []byte("{}")})
				if err != nil {
					return err
				}
				mu.Lock()
				written = append(written, ids[0].String())
				mu.Unlock()
				return nil
			}
			cfg := b.config()
			cfg.TracerProvider, cfg.Propagator = tp, prop
			mode.set(cfg)
			w := b.newWorker(cfg, h)
			b.start(w)
			b.waitCommitted(b.consumer, 0, 3)

			spans := map[string]tracetest.SpanStub{}
			for _, s := range exp.GetSpans() {
				if s.SpanKind == trace.SpanKindConsumer {
					spans[attr(s.Attributes, "messaging.message.id")] = s
				}
			}
			for _, id := range []string{"m-ok", "m-flaky", "m-poison"} {
				s, ok := spans[id]
				if !ok {
					t.Fatalf("no consumer span for %s; spans %v", id, exp.GetSpans())
				}
				if s.Parent.SpanID() != producer.SpanContext().SpanID() || s.SpanContext.TraceID() != producer.SpanContext().TraceID() {
					t.Errorf("%s: span parent %s in trace %s, want the producer's span %s in %s", id,
						s.Parent.SpanID(), s.SpanContext.TraceID(), producer.SpanContext().SpanID(), producer.SpanContext().TraceID())
				}
				for k, v := range map[string]string{"messaging.system": "kafka", "messaging.destination.name": b.topic,
					"messaging.destination.partition.id": "0", "messaging.consumer.group.name": b.consumer, "messaging.operation.type": "process"} {
					if got := attr(s.Attributes, k); got != v {
						t.Errorf("%s: %s = %q, want %q", id, k, got, v)
					}
				}
			}
			if evs := eventNames(spans["m-flaky"]); countOf(evs, spanEventRetry) != 2 {
				t.Errorf("m-flaky's span events %v: want two %s", evs, spanEventRetry)
			}
			if s := spans["m-flaky"]; s.Status.Code == codes.Error || attr(s.Attributes, attrOutcome) != outcomeAppliedName {
				t.Errorf("m-flaky's span: status %v, outcome %q; want applied, not an error", s.Status, attr(s.Attributes, attrOutcome))
			}
			if s := spans["m-poison"]; !slices.Contains(eventNames(s), spanEventDeadLetter) || s.Status.Code != codes.Error {
				t.Errorf("m-poison's span: events %v, status %v; want %s and an error", eventNames(s), s.Status, spanEventDeadLetter)
			}

			// What the handler wrote continues the trace, under the consumer span.
			for _, id := range written {
				var hs map[string]string
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT headers FROM outbox WHERE id = $1`, id).Scan(&hs); err != nil {
					t.Fatal(err)
				}
				sc := trace.SpanContextFromContext(prop.Extract(context.Background(), propagation.MapCarrier(hs)))
				if sc.TraceID() != producer.SpanContext().TraceID() || (sc.SpanID() != spans["m-ok"].SpanContext.SpanID() && sc.SpanID() != spans["m-flaky"].SpanContext.SpanID()) {
					t.Errorf("event %s written by a handler carries %v, want a consumer span of trace %s", id, hs, producer.SpanContext().TraceID())
				}
			}

			// The dead letter keeps the trace headers; so does a redrive.
			dls := b.deadLetters()
			if len(dls) != 1 || headerValue(dls[0].Headers, "traceparent") == "" {
				t.Fatalf("dead letters %+v: want m-poison with its traceparent", dls)
			}
			want := headerValue(dls[0].Headers, "traceparent")
			if _, err := Redrive(b.ctx, b.kopts, b.dlq, nil); err != nil {
				t.Fatal(err)
			}
			cons := ferrytest.Client(t, kgo.ConsumeTopics(b.topic), kgo.ConsumeResetOffset(kgo.NewOffset().At(3)))
			fs := cons.PollFetches(b.ctx)
			if recs := fs.Records(); len(recs) == 0 || headerValue(recs[0].Headers, "traceparent") != want {
				t.Errorf("the redriven record: %v, want traceparent %q", recs, want)
			}
		})
	}
}

func attr(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func eventNames(s tracetest.SpanStub) []string {
	var out []string
	for _, e := range s.Events {
		out = append(out, e.Name)
	}
	return out
}

func countOf(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

func headerValue(hs []kgo.RecordHeader, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
