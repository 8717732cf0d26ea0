package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// What the consumer span costs a message: with the global providers
// (tracing off, as for a user without OpenTelemetry) and with an SDK
// provider recording every span.
func BenchmarkConsumerSpan(b *testing.B) {
	headers := []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}
	m := &Message{ID: "0193a4f2-7c1e-7b7a-9a55-3f0f6a1c2d3e", Topic: "orders", Partition: 3, Offset: 12345,
		Consumer: "reserva", Key: []byte("order-42"), Headers: headers, ReceivedAt: time.Now(), Attempt: 1}
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"off", Config{}},
		{"sdk", Config{
			TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter())),
			Propagator:     propagation.TraceContext{},
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := &partition{w: &Worker{tracing: newTracing(&c.cfg)}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				d := &delivery{m: m}
				p.span(ctx, d)
				d.endSpan(outcomeAppliedName, nil)
			}
		})
	}
}
