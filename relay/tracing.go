package relay

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/ferryhq/ferry/relay"

// eventTracing makes a producer span per event when Config.TraceEvents is
// set; nil otherwise, and then the relay carries the row's trace headers to
// Kafka unchanged.
type eventTracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func newEventTracing(c *Config) *eventTracing {
	if !c.TraceEvents {
		return nil
	}
	tp, prop := c.TracerProvider, c.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return &eventTracing{tracer: tp.Tracer(tracerName), prop: prop}
}

// start begins p's span, a child of the trace context the row's headers
// carry (the writer's span), and puts the span's own context in the
// record's headers in place of the row's, so that the consumer's span
// descends from it. It runs after fill and before the record's size is
// counted.
func (t *eventTracing) start(p *inflight) {
	if t == nil {
		return
	}
	parent := t.prop.Extract(context.Background(), rowCarrier(p.row.Headers))
	ctx, span := t.tracer.Start(parent, "send "+p.rec.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(p.rec.Topic),
			semconv.MessagingMessageID(string(p.id[:])),
			semconv.MessagingKafkaMessageKey(string(p.rec.Key)),
		))
	p.span = span
	t.prop.Inject(ctx, (*recordCarrier)(&p.rec))
	p.size = recordSize(&p.rec)
}

// endSpan ends p's span: acknowledged by Kafka (err nil), or refused for
// good (quarantined) or lost with its session (published again by the
// next one, in a span of its own).
func (p *inflight) endSpan(err error) {
	if p.span == nil {
		return
	}
	if err != nil {
		p.span.RecordError(err)
		p.span.SetStatus(codes.Error, err.Error())
	} else {
		p.span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(int(p.rec.Partition))), semconv.MessagingKafkaOffset(int(p.rec.Offset)))
	}
	p.span.End()
	p.span = nil
}

// rowCarrier reads a row's own headers for a propagator.
type rowCarrier []header

func (c rowCarrier) Get(key string) string {
	for _, h := range c {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c rowCarrier) Set(string, string) {}

func (c rowCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = string(h.Key)
	}
	return keys
}

// recordCarrier writes a record's headers for a propagator, replacing a
// header of the same name.
type recordCarrier kgo.Record

func (c *recordCarrier) Get(key string) string {
	for _, h := range c.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c *recordCarrier) Set(key, value string) {
	for i, h := range c.Headers {
		if h.Key == key {
			c.Headers[i].Value = []byte(value)
			return
		}
	}
	c.Headers = append(c.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c *recordCarrier) Keys() []string {
	keys := make([]string, len(c.Headers))
	for i, h := range c.Headers {
		keys[i] = h.Key
	}
	return keys
}
