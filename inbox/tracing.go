package inbox

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the worker's spans.
const tracerName = "github.com/ferryhq/ferry/inbox"

// Span events and attributes of the worker's own (the OpenTelemetry
// messaging conventions name the rest).
const (
	spanEventRetry         = "ferry.retry"          // a failed handler call will be retried
	spanEventDatabaseRetry = "ferry.database_retry" // the database failed; retried without counting an attempt
	spanEventDeadLetter    = "ferry.dead_letter"    // the message was dead-lettered
	attrAttempt            = "ferry.attempt"        // the handler call that failed
	attrRetryIn            = "ferry.retry_in"       // the backoff before the next call
	attrReason             = "ferry.dlq.reason"     // why the message was dead-lettered
	attrDeadLetterTopic    = "ferry.dlq.topic"      // where it went
	attrOutcome            = "ferry.outcome"        // applied or dead_lettered
	attrAttempts           = "ferry.handler_calls"  // handler calls in all
	outcomeAppliedName     = "applied"              // attrOutcome values
	outcomeDeadLetteredStr = "dead_lettered"        //
)

// headerCarrier reads a record's headers for a propagator.
type headerCarrier []kgo.RecordHeader

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {} // extraction only

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// tracing is the worker's tracer and propagator.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func newTracing(c *Config) tracing {
	tp, prop := c.TracerProvider, c.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return tracing{tracer: tp.Tracer(tracerName), prop: prop}
}

// span is the consumer span of d: started at its first handler call as a
// child of the trace context its headers carry (the span of the code that
// wrote the event, when the writer had a propagator), and ended when the
// message is settled. Every handler call of d runs in it; retries and the
// dead-letter decision are its events.
func (p *partition) span(ctx context.Context, d *delivery) context.Context {
	if d.span == nil {
		m := d.m
		parent := p.w.tracing.prop.Extract(context.Background(), headerCarrier(m.Headers))
		_, d.span = p.w.tracing.tracer.Start(parent, "process "+m.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(m.ReceivedAt),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName("process"),
				semconv.MessagingDestinationName(m.Topic),
				semconv.MessagingDestinationPartitionID(strconv.Itoa(int(m.Partition))),
				semconv.MessagingKafkaOffset(int(m.Offset)),
				semconv.MessagingConsumerGroupName(m.Consumer),
				semconv.MessagingMessageID(m.ID),
				semconv.MessagingKafkaMessageKey(string(m.Key)),
			))
	}
	return trace.ContextWithSpan(ctx, d.span)
}

// failed records a failed handler call on d's span.
func (d *delivery) failed(err error) {
	if d.span != nil {
		d.span.RecordError(err, trace.WithAttributes(attribute.Int(attrAttempt, d.m.Attempt)))
	}
}

// event adds a span event to d's span, if it has one.
func (d *delivery) event(name string, attrs ...attribute.KeyValue) {
	if d.span != nil {
		d.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// retrying records that d's handler will be called again after wait.
func (d *delivery) retrying(name string, wait time.Duration) {
	d.event(name, attribute.Int(attrAttempt, d.m.Attempt), attribute.String(attrRetryIn, wait.String()))
}

// endSpan ends d's span with how the message was settled.
func (d *delivery) endSpan(outcome string, err error) {
	if d.span == nil {
		return
	}
	d.span.SetAttributes(attribute.String(attrOutcome, outcome), attribute.Int(attrAttempts, d.m.Attempt))
	if err != nil {
		d.span.SetStatus(codes.Error, err.Error())
	}
	d.span.End()
	d.span = nil
}
