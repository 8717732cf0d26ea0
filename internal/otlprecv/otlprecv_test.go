package otlprecv

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Spans exported by OpenTelemetry's own OTLP/HTTP exporter arrive whole
// (ids, parent, name, service, kind, attributes), and Tree puts each child
// under its parent.
func TestReceivesWhatTheExporterSendsAndDrawsTheTree(t *testing.T) {
	t.Parallel()
	var r Receiver
	srv := httptest.NewServer(&r)
	defer srv.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("api"))))
	tr := tp.Tracer("test")
	ctx, root := tr.Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	cctx, child := tr.Start(ctx, "process orders", trace.WithSpanKind(trace.SpanKindConsumer))
	_, grandchild := tr.Start(cctx, "process stock", trace.WithSpanKind(trace.SpanKindConsumer))
	grandchild.End()
	child.End()
	root.End()
	_, other := tr.Start(context.Background(), "unrelated")
	other.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	spans := r.Trace(root.SpanContext().TraceID().String())
	if len(spans) != 3 {
		t.Fatalf("%d spans in the trace, want 3: %+v", len(spans), r.Spans())
	}
	if s := spans[0]; s.Name != "POST /orders" || s.Service != "api" || s.ParentID != "" || s.SpanID != root.SpanContext().SpanID().String() {
		t.Errorf("root %+v", s)
	}
	if s := spans[1]; s.ParentID != root.SpanContext().SpanID().String() {
		t.Errorf("child's parent %s, want the root", s.ParentID)
	}
	tree := Tree(spans, "")
	lines := strings.Split(strings.TrimSpace(tree), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "POST /orders") || !strings.HasPrefix(lines[1], "  process orders") || !strings.HasPrefix(lines[2], "    process stock") {
		t.Errorf("tree:\n%s", tree)
	}
}
