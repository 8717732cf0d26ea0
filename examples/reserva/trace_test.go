package reserva_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/examples/reserva"
)

// globalTracing sets OpenTelemetry's global propagator and tracer provider
// once for the package's tests, as an application's main does; spans of
// other tests land in the same exporter, so a test looks at its own trace.
var globalTracing = sync.OnceValue(func() *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return exp
})

// One order forms one trace, through real PostgreSQL and Kafka: the order
// request's server span, the stock reservation's consumer span of
// OrderPlaced (its child), and the order status's consumer span of
// StockReserved (the reservation's child), each in the right parent and
// with the outbox id as its message id.
func TestOneOrderIsOneTraceFromTheRequestToItsStatus(t *testing.T) {
	t.Parallel()
	exp := globalTracing()
	b := setup(t)
	if err := reserva.SeedStock(b.ctx, b.db.Pool, map[string]int{"apple": 10}); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t)
	srv := httptest.NewServer(b.svc.Handler())
	t.Cleanup(srv.Close)
	answer := postOrder(t, srv.URL, "application/json", "", `{"customer":"ada","items":[{"sku":"apple","qty":2}]}`)
	if answer.status != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", answer.status, answer.raw)
	}
	order := answer.body["id"]
	b.waitFor(t, "the order decided", func() bool {
		return b.count(t, `SELECT count(*) FROM orders WHERE id = $1 AND status = 'reserved'`, order) == 1
	})

	// The trace OrderPlaced carries, from the request that wrote it.
	var headers map[string]string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT headers FROM outbox WHERE aggregate_id = $1 AND event_type = 'OrderPlaced'`, order).Scan(&headers); err != nil {
		t.Fatal(err)
	}
	placed := trace.SpanContextFromContext(otel.GetTextMapPropagator().Extract(context.Background(), propagation.MapCarrier(headers)))
	if !placed.IsValid() {
		t.Fatalf("OrderPlaced carries no trace context: headers %v", headers)
	}
	var request tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanContext.SpanID() == placed.SpanID() {
			request = s
		}
	}
	if request.SpanKind != trace.SpanKindServer || !strings.Contains(request.Name, "/orders") || request.Parent.IsValid() {
		t.Fatalf("OrderPlaced's span is %q (kind %s, parent %s), want the root server span of POST /orders", request.Name, request.SpanKind, request.Parent.SpanID())
	}
	// The consumer spans end when their message is settled, after the
	// status commits: wait for both.
	var reserve, status tracetest.SpanStub
	b.waitFor(t, "both consumer spans of the order's trace", func() bool {
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() != request.SpanContext.TraceID() || s.SpanKind != trace.SpanKindConsumer {
				continue
			}
			switch attrOf(s, "messaging.destination.name") {
			case b.names.OrdersTopic:
				reserve = s
			case b.names.StockTopic:
				status = s
			}
		}
		return reserve.SpanContext.IsValid() && status.SpanContext.IsValid()
	})
	if reserve.Parent.SpanID() != request.SpanContext.SpanID() {
		t.Errorf("the reservation's span has parent %s, want the request's span %s", reserve.Parent.SpanID(), request.SpanContext.SpanID())
	}
	if status.Parent.SpanID() != reserve.SpanContext.SpanID() {
		t.Errorf("the status's span has parent %s, want the reservation's span %s", status.Parent.SpanID(), reserve.SpanContext.SpanID())
	}
	for _, c := range []struct {
		span  tracetest.SpanStub
		group string
		event string
	}{{reserve, b.names.StockConsumer, "OrderPlaced"}, {status, b.names.StatusConsumer, "StockReserved"}} {
		var id string
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT id::text FROM outbox WHERE aggregate_id = $1 AND event_type = $2`, order, c.event).Scan(&id); err != nil {
			t.Fatalf("%s of order %s: %v", c.event, order, err)
		}
		if got := attrOf(c.span, "messaging.message.id"); got != id {
			t.Errorf("%s's consumer span has message id %q, want the outbox id %s", c.event, got, id)
		}
		if got := attrOf(c.span, "messaging.consumer.group.name"); got != c.group {
			t.Errorf("%s's consumer span has group %q, want %s", c.event, got, c.group)
		}
	}
	t.Logf("trace %s: %s -> %s -> %s", request.SpanContext.TraceID(), request.Name, reserve.Name, status.Name)
}

func attrOf(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}
