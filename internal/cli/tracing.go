package cli

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// StartTracing turns on OpenTelemetry trace export when the standard OTEL_*
// variables ask for it: OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, or OTEL_TRACES_EXPORTER=otlp. It
// exports OTLP over HTTP (protobuf), which every OpenTelemetry Collector
// takes; the exporter reads the endpoint, headers, TLS and timeout
// variables itself, and OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name
// the service (service defaults it). The global tracer provider and W3C
// propagator (traceparent, baggage) are set, so that outbox.Write records
// the trace and the worker continues it. OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none leave tracing off. stop flushes what is
// buffered, for at most stopTimeout; it is a no-op when tracing is off.
func StartTracing(ctx context.Context, service string, logger *slog.Logger) (stop func(), err error) {
	noop := func() {}
	on, err := tracingRequested()
	if err != nil || !on {
		return noop, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return noop, Usagef("OTEL_EXPORTER_OTLP_*: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(service)), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return noop, Usagef("OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("trace export failed", slog.String("error", err.Error()))
	}))
	logger.Info("traces exported with OTLP over HTTP", slog.String("service", serviceName(res, service)))
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}

// stopTimeout bounds the flush of the spans still buffered at exit.
const stopTimeout = 10 * time.Second

// tracingRequested reads the variables that say whether to export traces.
func tracingRequested() (bool, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	switch e := strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")); e {
	case "none":
		return false, nil
	case "", "otlp":
		if e == "" && os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return false, nil
		}
	default:
		return false, Usagef("OTEL_TRACES_EXPORTER=%s: Ferry exports traces with otlp only (or none)", e)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return false, Usagef("%s=%s: Ferry exports OTLP over HTTP only (http/protobuf)", v, p)
		}
	}
	return true, nil
}

func serviceName(res *resource.Resource, fallback string) string {
	if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		return v.AsString()
	}
	return fallback
}
