"""OpenTelemetry trace context, with the `[otel]` extra (opentelemetry-api).

Imported only when `CONVEYOR["TRACING"]` is on and `opentelemetry` imports
(`enabled()`); otherwise nothing here runs and nothing is imported.

- `inject(meta)`: at enqueue, the active span's W3C trace context goes into
  the job's `meta` (`traceparent`, `tracestate`), unless `meta` has one.
- `attempt_span(held)`: the worker runs each attempt in a CONSUMER span named
  `process <queue>` (OpenTelemetry's messaging conventions), attributes job
  id, task, queue and attempt. Attempt 1 continues the enqueuer's trace
  (parent and link); a later attempt starts a new trace linked to it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SYSTEM = "django_conveyor"
TRACE_KEYS = ("traceparent", "tracestate")


@functools.cache
def _api() -> Any:
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return trace, TraceContextTextMapPropagator()


def enabled() -> bool:
    from ..conf import conveyor_settings

    return conveyor_settings().TRACING and _api() is not None


def inject(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """`meta` with the active span's trace context added (a new dict), or `meta` as it was."""
    if meta and "traceparent" in meta:
        return meta
    trace, propagator = _api()
    if not trace.get_current_span().get_span_context().is_valid:
        return meta
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return {**(meta or {}), **{k: carrier[k] for k in TRACE_KEYS if k in carrier}}


@contextmanager
def attempt_span(lease: Any) -> Iterator[Any]:
    """The span of one attempt, current while the handler runs; ends with the block."""
    trace, propagator = _api()
    meta = lease.meta if isinstance(lease.meta, dict) else {}  # A row written by hand.
    carrier = {k: meta[k] for k in TRACE_KEYS if isinstance(meta.get(k), str)}
    creation = trace.get_current_span(propagator.extract(carrier)).get_span_context()
    links = [trace.Link(creation)] if creation.is_valid else []
    # Attempt 1 continues the enqueuer's trace; a retry is a new trace, linked.
    parent = (
        trace.set_span_in_context(trace.NonRecordingSpan(creation))
        if creation.is_valid and lease.attempt == 1
        else trace.set_span_in_context(trace.INVALID_SPAN)
    )
    tracer = trace.get_tracer("django_conveyor")
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": lease.queue,
        "messaging.message.id": str(lease.id),
        "conveyor.job.id": lease.id,
        "conveyor.task": lease.task_path,
        "conveyor.attempt": lease.attempt,
    }
    with tracer.start_as_current_span(
        f"process {lease.queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def failed(span: Any, exc: BaseException) -> None:
    """Mark the attempt's span as failed by `exc`."""
    trace, _ = _api()
    cls = type(exc)
    span.set_attribute("error.type", f"{cls.__module__}.{cls.__qualname__}")
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
