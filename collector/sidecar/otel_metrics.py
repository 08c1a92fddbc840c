"""The OpenTelemetry GenAI server metrics, recorded from finished rows when OTLP metrics are on.

    gen_ai.server.request.duration        s   admission to the last byte, every request
    gen_ai.server.time_to_first_token     s   streamed requests with a first token
    gen_ai.server.time_per_output_token   s   requests with more than one output token

Attributes: gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
gen_ai.response.model (when the stream named it), server.address/port, error.type on failures.
Bucket boundaries are the semantic conventions' advice. The same numbers are on /metrics as the
headroom_* histograms; these are for backends that take OTLP only.
"""

from __future__ import annotations

from typing import Any

from collector.record import RequestRecord
from collector.sidecar.tracecontext import Telemetry

__all__ = ["GenAiMetrics", "DURATION_BUCKETS", "TTFT_BUCKETS", "TPOT_BUCKETS"]

DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


def _reader(protocol: str, endpoint: str | None) -> Any:
    """A periodic OTLP metric reader for `protocol` (endpoint None: the OTEL_* variables)."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # lazy: metrics SDK when on

    if protocol == "grpc":
        # lazy: the [otlp-grpc] extra
        from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metrics

        return PeriodicExportingMetricReader(grpc_metrics.OTLPMetricExporter(endpoint=endpoint))
    # lazy, as above; otel imports this module lazily, so its URL rule is imported here
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from collector.sidecar.otel import signal_url

    return PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=signal_url(endpoint, "metrics") if endpoint else None)
    )


class GenAiMetrics:
    """Its own MeterProvider with the three GenAI histograms; `record(row)` per finished request."""

    def __init__(
        self,
        resource: Any,
        *,
        protocol: str = "http/protobuf",
        endpoint: str | None = None,
        reader: Any = None,
    ) -> None:
        from opentelemetry.sdk.metrics import MeterProvider  # lazy: the metrics SDK only when on

        self._provider = MeterProvider(
            resource=resource, metric_readers=[reader or _reader(protocol, endpoint)]
        )
        meter = self._provider.get_meter("llm-headroom")
        self._duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            "s",
            "Generative AI server request duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            "s",
            "Time to generate the first token",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
        )
        self._tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            "s",
            "Time per output token after the first",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS,
        )

    def record(
        self,
        record: RequestRecord,
        provider: str,
        server: tuple[str, int] | None,
        telemetry: Telemetry | None = None,
    ) -> None:
        """Observe one finished request on the three histograms."""
        from collector.sidecar.otel import _operation  # one definition of the operation name

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": _operation(record.endpoint),
            "gen_ai.provider.name": provider,
        }
        if record.model:
            attributes["gen_ai.request.model"] = record.model
        if telemetry is not None and telemetry.response_model:
            attributes["gen_ai.response.model"] = telemetry.response_model
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        if record.outcome not in (None, "ok"):
            attributes["error.type"] = record.outcome
        if record.e2e_s is not None:
            self._duration.record(record.e2e_s, attributes)
        if record.ttft_s is not None:
            self._ttft.record(record.ttft_s, attributes)
        if record.tpot_s is not None:
            self._tpot.record(record.tpot_s, attributes)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._provider.shutdown()
