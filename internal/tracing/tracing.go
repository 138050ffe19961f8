// Package tracing builds the OpenTelemetry tracer provider of a runner
// process: an OTLP/HTTP exporter configured by the standard
// OTEL_EXPORTER_OTLP_* variables — or, with OTEL_TRACES_EXPORTER=console,
// spans as JSON lines on a writer —, batched, with the service's resource.
package tracing

import (
	"context"
	"fmt"
	"io"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ServiceNameDefault is service.name unless configured or OTEL_SERVICE_NAME.
const ServiceNameDefault = "tasklease"

// Exporters, as OTEL_TRACES_EXPORTER names them.
const (
	ExporterOTLP    = "otlp"    // OTLP over HTTP (the default)
	ExporterConsole = "console" // JSON lines on Options.Console
)

// Options configure Provider.
type Options struct {
	// ServiceName is service.name (default ServiceNameDefault;
	// OTEL_SERVICE_NAME wins).
	ServiceName string
	// Version and Instance are service.version and service.instance.id.
	Version, Instance string
	// Exporter is ExporterOTLP ("" too) or ExporterConsole.
	Exporter string
	// Console receives the console exporter's spans, one JSON object a
	// line.
	Console io.Writer
}

// Provider returns a tracer provider exporting as opts say; call its
// Shutdown on exit to flush the last spans. The OTLP exporter reads its
// endpoint, headers and timeouts from the OTEL_EXPORTER_OTLP_* variables,
// and the batch processor its delays from OTEL_BSP_*.
func Provider(ctx context.Context, opts Options) (*sdktrace.TracerProvider, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch opts.Exporter {
	case "", ExporterOTLP:
		if exp, err = otlptracehttp.New(ctx); err != nil {
			return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
		}
	case ExporterConsole:
		if opts.Console == nil {
			return nil, fmt.Errorf("tracing: the console exporter needs a writer")
		}
		if exp, err = stdouttrace.New(stdouttrace.WithWriter(opts.Console)); err != nil {
			return nil, fmt.Errorf("tracing: console exporter: %w", err)
		}
	default:
		return nil, fmt.Errorf("tracing: unknown exporter %q (want otlp or console)", opts.Exporter)
	}
	serviceName := opts.ServiceName
	if serviceName == "" {
		serviceName = ServiceNameDefault
	}
	// resource.Environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES)
	// is merged last, so it wins over the configured name.
	res, err := resource.Merge(resource.NewSchemaless(
		attribute.String("service.name", serviceName),
		attribute.String("service.version", opts.Version),
		attribute.String("service.instance.id", opts.Instance),
	), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
