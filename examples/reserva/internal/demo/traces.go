package demo

import (
	"context"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/internal/otlprecv"
)

// serveTraces starts the demo's OTLP/HTTP receiver on a free loopback port
// and returns its address for OTEL_EXPORTER_OTLP_ENDPOINT. It stops with
// the demo's process.
func (d *demo) serveTraces() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: &d.traces, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// orderTrace draws the trace of the median order (by its placed -> decided
// latency) among those decided: its OrderPlaced
// event carries the API request's trace context, which the workers
// continued. The workers export a span when its message is settled, a few
// hundred milliseconds later at most: it waits up to 5 s for the three.
func (d *demo) orderTrace(ctx context.Context) string {
	var headers map[string]string
	if err := d.pool.QueryRow(ctx, `
		SELECT e.headers FROM outbox e JOIN orders o ON e.aggregate_id = o.id::text
		WHERE e.event_type = 'OrderPlaced' AND o.status <> 'placed'
		ORDER BY o.decided_at - o.created_at
		OFFSET (SELECT count(*) / 2 FROM orders WHERE status <> 'placed') LIMIT 1`).Scan(&headers); err != nil {
		return ""
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(headers)))
	if !sc.IsValid() {
		return ""
	}
	var spans []otlprecv.Span
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if spans = d.traces.Trace(sc.TraceID().String()); len(spans) >= 3 {
			break
		}
	}
	return otlprecv.Tree(spans, "    ")
}
