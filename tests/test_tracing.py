"""Trace context with the [otel] extra: enqueue stores it, a real worker process continues it.

The test process and the worker both use OpenTelemetry's SDK with its
in-memory exporter (tests/otel_settings.py hands the worker's spans back
through a file). The first attempt of a job is a child of the span that
enqueued it; a retry starts a new trace linked to that span.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_conveyor.models import Job
from tests.helpers import REPO, kill_group, start_worker, stop_process, wait_until, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def tracer():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    return trace.get_tracer("tests")


def test_enqueue_in_a_span_stores_its_traceparent_and_outside_one_stores_nothing(tracer):
    with tracer.start_as_current_span("request") as span:
        inside = tasks.add.enqueue(1, 2)
        kept = tasks.add.using(
            meta={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        ).enqueue(1, 2)
    outside = tasks.add.enqueue(1, 2)
    context = span.get_span_context()
    assert Job.objects.get(pk=inside.id).meta == {
        "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}"
        f"-{context.trace_flags:02x}"
    }
    assert (
        Job.objects.get(pk=kept.id).meta["traceparent"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    )
    assert Job.objects.get(pk=outside.id).meta is None


def test_a_worker_continues_the_trace_then_links_retries_to_it(tracer, tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    with tracer.start_as_current_span("request") as span:
        ok = tasks.add.enqueue(2, 3)
        failing = tasks.always_fails.enqueue("boom")  # three attempts, 50 ms apart
        bad = tasks.add.enqueue(4, 5)
    Job.objects.filter(pk=bad.id).update(meta=["not", "an", "object"])  # a row written by hand
    origin = span.get_span_context()
    trace_id, span_id = f"{origin.trace_id:032x}", f"{origin.span_id:016x}"
    proc = start_worker(
        "--queues",
        "default",
        log=tmp_path / "worker.log",
        settings="tests.otel_settings",
        env={"CONVEYOR_TEST_SPANS": str(spans_file)},
    )
    try:
        wait_until(lambda: Job.objects.get(pk=failing.id).state == "dead", timeout=60)
        wait_until(lambda: Job.objects.get(pk=ok.id).state == "completed", timeout=60)
        wait_until(lambda: Job.objects.get(pk=bad.id).state == "completed", timeout=60)
        assert stop_process(proc, signal.SIGTERM) == 0
    finally:
        kill_group(proc)
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    by_job = {}
    for s in spans:
        by_job.setdefault(s["attributes"]["conveyor.job.id"], []).append(s)
    (done,) = by_job[int(ok.id)]
    assert done["name"] == "process default" and done["kind"] == "CONSUMER"
    assert done["trace_id"] == trace_id and done["parent"]["span_id"] == span_id
    assert done["links"] == [{"trace_id": trace_id, "span_id": span_id}]
    assert done["attributes"]["conveyor.task"] == "tests.testapp.tasks.add"
    assert done["attributes"]["messaging.destination.name"] == "default"
    assert done["status"] == "UNSET"
    attempts = sorted(by_job[int(failing.id)], key=lambda s: s["attributes"]["conveyor.attempt"])
    assert [s["attributes"]["conveyor.attempt"] for s in attempts] == [1, 2, 3]
    first, *retries = attempts
    assert first["trace_id"] == trace_id and first["parent"]["span_id"] == span_id
    for retry in retries:
        assert retry["trace_id"] != trace_id and retry["parent"] is None
        assert retry["links"] == [{"trace_id": trace_id, "span_id": span_id}]
    assert {s["status"] for s in attempts} == {"ERROR"}
    assert {s["attributes"]["error.type"] for s in attempts} == {"builtins.ValueError"}
    (untraced,) = by_job[int(bad.id)]  # its own span, a root: the bad meta is ignored
    assert untraced["parent"] is None and untraced["links"] == []
    assert untraced["trace_id"] != trace_id and untraced["status"] == "UNSET"


NO_IMPORT = """
import json
import sys

import django

django.setup()
from django_conveyor.worker.config import WorkerOptions
from django_conveyor.worker.loop import Worker
from tests.testapp import tasks

job = tasks.add.enqueue(1, 2)
options = WorkerOptions(queues=("default",), burst=True, listen=False, stop_signals=())
assert Worker(options).run() == 0
print(job.id, json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry"})))
"""


@pytest.mark.parametrize(("tracing", "imported"), [(False, []), (True, ["opentelemetry"])])
def test_with_tracing_off_an_enqueue_and_a_worker_import_nothing_of_opentelemetry(
    tracing, imported
):
    out = subprocess.run(
        [sys.executable, "-c", NO_IMPORT],
        cwd=REPO,
        env={**worker_env(), "CONVEYOR_TEST_CONVEYOR_JSON": json.dumps({"TRACING": tracing})},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    job_id, modules = out.stdout.split(maxsplit=1)
    assert Job.objects.get(pk=int(job_id)).state == "completed"
    assert json.loads(modules) == imported
