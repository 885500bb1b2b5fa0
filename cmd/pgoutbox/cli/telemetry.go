package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingHelp documents the OpenTelemetry environment in --help.
const tracingHelp = `Tracing (OpenTelemetry, off by default), from the standard environment variables:
  OTEL_TRACES_EXPORTER=otlp|console|none   otlp sends OTLP over HTTP (protobuf) to
                      OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
                      (default http://localhost:4318), with OTEL_EXPORTER_OTLP_HEADERS etc.;
                      console prints spans as JSON on stdout; none (the default) is off
  OTEL_SERVICE_NAME   service name (default pgoutbox); OTEL_RESOURCE_ATTRIBUTES adds more
  OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG   sampling (default parentbased_always_on:
                      an event is traced when its producer's request was sampled)
Each published event gets a PRODUCER span in the trace of the transaction that
enqueued it (from the traceparent saved in its headers).`

// tracing is a configured tracer provider; tp is nil when tracing is off.
type tracing struct {
	tp *sdktrace.TracerProvider
}

// provider returns the tracer provider, or nil when tracing is off.
func (t *tracing) provider() trace.TracerProvider {
	if t.tp == nil {
		return nil
	}
	return t.tp
}

// shutdown flushes the spans still buffered.
func (t *tracing) shutdown(ctx context.Context) error {
	if t.tp == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// setupTracing builds a tracer provider from the OTEL_* environment. An unknown
// exporter or protocol is a usage error; nothing connects until spans are
// exported. console spans go to stdout.
func setupTracing(ctx context.Context, stdout io.Writer) (*tracing, error) {
	exporters := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if exporters == "" || exporters == "none" {
		return &tracing{}, nil
	}
	var opts []sdktrace.TracerProviderOption
	for _, name := range strings.Split(exporters, ",") {
		var exp sdktrace.SpanExporter
		var err error
		switch name = strings.TrimSpace(name); name {
		case "otlp":
			if err := checkOTLPProtocol(); err != nil {
				return nil, err
			}
			exp, err = otlptracehttp.New(ctx)
		case "console":
			exp, err = stdouttrace.New(stdouttrace.WithWriter(stdout))
		case "none":
			return nil, usagef("OTEL_TRACES_EXPORTER=%q: none cannot be combined with other exporters", exporters)
		default:
			return nil, usagef("OTEL_TRACES_EXPORTER=%q: unknown exporter %q (want otlp, console or none)", exporters, name)
		}
		if err != nil {
			return nil, usagef("OTEL_TRACES_EXPORTER=%s: %v", name, err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES beat the
	// default name.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "pgoutbox")),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, usagef("OTEL_RESOURCE_ATTRIBUTES: %v", err)
	}
	opts = append(opts, sdktrace.WithResource(res))
	return &tracing{tp: sdktrace.NewTracerProvider(opts...)}, nil
}

// checkOTLPProtocol refuses protocols other than http/protobuf, the only one
// built in, instead of silently sending to the wrong port.
func checkOTLPProtocol() error {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v := strings.TrimSpace(os.Getenv(k))
		if v == "" {
			continue
		}
		if v != "http/protobuf" {
			return usagef("%s=%q: only http/protobuf is supported", k, v)
		}
		return nil
	}
	return nil
}

// metricsHelp documents --metrics-addr in --help.
const metricsHelp = `Metrics and probes (--metrics-addr host:port): GET /metrics (Prometheus),
/healthz (the process is alive), /readyz (200 when the database answers a ping and
the relay's last contact with the database and the broker worked, else 503).
Metric names and alerts: docs/operations.md.`
