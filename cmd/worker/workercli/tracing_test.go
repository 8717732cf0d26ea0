package workercli_test

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/otlprecv"
)

// With the standard OTEL_* variables set, `run` exports the consumer span
// of each message with OTLP over HTTP, in the trace the record's
// traceparent names, under the service name the variables give. Without
// them, nothing is exported (TestRunHostsRegisteredHandlers runs so). A
// variable asking for what Ferry does not do is refused by name.
func TestRunExportsTracesWhenTheEnvironmentAsksForThem(t *testing.T) {
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	var recv otlprecv.Receiver
	srv := httptest.NewServer(&recv)
	t.Cleanup(srv.Close)

	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("traced", topic, func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if code, _, stderr := run(ctx, app, "run", "--database-url", db.URL, "--kafka-brokers", brokers, "--http-addr", "off"); code != 2 || !strings.Contains(stderr, "OTEL_TRACES_EXPORTER") {
		t.Errorf("OTEL_TRACES_EXPORTER=zipkin: exit %d, %q; want 2 naming the variable", code, stderr)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "billing-worker")

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- workercli.Main(runCtx, []string{"run", "--database-url", db.URL, "--kafka-brokers", brokers, "--http-addr", "off",
			"--prune-interval", "0", "--log-format", "json"}, io.Discard, &stderr, app)
	}()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	producer := ferrytest.Client(t)
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x"), Headers: []kgo.RecordHeader{
		{Key: "id", Value: []byte("m-traced")}, {Key: "traceparent", Value: []byte("00-" + traceID + "-00f067aa0ba902b7-01")},
	}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for applied := 0; applied == 0; time.Sleep(20 * time.Millisecond) {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE consumer = 'traced' AND message_id = 'm-traced'`).Scan(&applied); err != nil {
			t.Fatalf("waiting for the message to be applied: %v; logs: %s", err, stderr.String())
		}
	}
	stop() // run flushes its spans as it exits
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	var found []otlprecv.Span
	for _, sp := range recv.Trace(traceID) {
		if sp.Kind == tracepb.Span_SPAN_KIND_CONSUMER && sp.Name == "process "+topic {
			found = append(found, sp)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d consumer spans of the record's trace %s exported, want 1; all: %+v; logs: %s", len(found), traceID, recv.Spans(), stderr.String())
	}
	if sp := found[0]; sp.Service != "billing-worker" || sp.ParentID != "00f067aa0ba902b7" || sp.Attributes["messaging.message.id"] != "m-traced" {
		t.Errorf("the consumer span %+v: want service billing-worker (OTEL_SERVICE_NAME), parent 00f067aa0ba902b7, message id m-traced", sp)
	}
}
