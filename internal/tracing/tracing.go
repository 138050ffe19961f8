// Package tracing builds the OpenTelemetry tracer provider of a runner
// process: an OTLP/HTTP exporter configured by the standard
// OTEL_EXPORTER_OTLP_* variables, batched, with the service's resource.
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ServiceNameDefault is service.name unless configured or OTEL_SERVICE_NAME.
const ServiceNameDefault = "tasklease"

// Provider returns a tracer provider exporting over OTLP/HTTP; call its
// Shutdown on exit to flush the last spans. The exporter reads its
// endpoint, headers and timeouts from the OTEL_EXPORTER_OTLP_* variables,
// and the batch processor its delays from OTEL_BSP_*.
func Provider(ctx context.Context, serviceName, version, instance string) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	if serviceName == "" {
		serviceName = ServiceNameDefault
	}
	// resource.Environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES)
	// is merged last, so it wins over the configured name.
	res, err := resource.Merge(resource.NewSchemaless(
		attribute.String("service.name", serviceName),
		attribute.String("service.version", version),
		attribute.String("service.instance.id", instance),
	), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
