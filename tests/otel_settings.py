"""The test settings, plus OpenTelemetry's SDK with its in-memory exporter (tracing tests).

A worker process started with these settings records its spans in the SDK's
InMemorySpanExporter and appends each finished span, as one JSON line, to
the file named by CONVEYOR_TEST_SPANS, which the test then reads.
"""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.settings import *  # noqa: F403


def span_json(span) -> dict:
    def ids(context) -> dict:
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    return {
        "name": span.name,
        "kind": span.kind.name,
        **ids(span.context),
        "parent": ids(span.parent) if span.parent else None,
        "links": [ids(link.context) for link in span.links],
        "attributes": dict(span.attributes),
        "status": span.status.status_code.name,
    }


class FileBackedExporter(InMemorySpanExporter):
    """The SDK's in-memory exporter, that also hands each span to the test process."""

    def export(self, spans):
        result = super().export(spans)
        with open(os.environ["CONVEYOR_TEST_SPANS"], "a") as out:
            for span in spans:
                out.write(json.dumps(span_json(span)) + "\n")
        return result


if os.environ.get("CONVEYOR_TEST_SPANS"):
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileBackedExporter()))
    trace.set_tracer_provider(_provider)
