"""`/conveyor/metrics`: gauges computed from the database at scrape time.

Mount with ``path("conveyor/metrics", include("django_conveyor.metrics.urls"))``.
The same response carries this site's enqueue counters (`process.py`).
A scrape needs an API key with the `metrics` scope (`Authorization: Bearer`)
or a client address in `CONVEYOR["METRICS_ALLOWED_ADDRESSES"]`. The figures
and how each is found cheaply are in `django_conveyor.queue_counts`.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .. import operations, queue_counts
from ..api import keys
from ..conf import conveyor_settings
from ..states import JobState
from . import process

SCOPE = "metrics"


class DatabaseCollector(Collector):
    """Reads `queue_counts.snapshot()` once per scrape and yields it as gauges."""

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        queues = queue_counts.snapshot(operations.known_queues()).values()
        jobs = GaugeMetricFamily(
            "conveyor_jobs",
            "Jobs per queue and state. Blocked, available and running are exact; finished "
            f"states are exact up to {queue_counts.EXACT_BELOW} per queue, then PostgreSQL's "
            "estimate.",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "conveyor_queue_lag_seconds",
            "Age of the oldest ready job (available, run_after passed); 0 when none is ready.",
            labels=["queue"],
        )
        dead_letters = GaugeMetricFamily(
            "conveyor_dead_letter_jobs",
            "Failed and dead jobs (the dead-letter view), counted as conveyor_jobs counts them.",
            labels=["queue"],
        )
        active = GaugeMetricFamily(
            "conveyor_leases_active", "Running jobs whose lease is valid.", labels=["queue"]
        )
        expired = GaugeMetricFamily(
            "conveyor_leases_expired",
            "Running jobs whose lease expired, waiting for a reaper to take them back.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "conveyor_queue_paused", "1 when the queue is paused, else 0.", labels=["queue"]
        )
        throttled = GaugeMetricFamily(
            "conveyor_jobs_throttled",
            "Ready jobs of a limited queue (available, due, not isolated) that wait because a "
            "limit is reached, per reason: concurrency (the queue's running jobs), rate (the "
            "rate window is full) or key_concurrency (their key's running jobs). Each job is "
            "counted under the first reason that holds, in that order. Exact.",
            labels=["queue", "reason"],
        )
        for queue in queues:
            for reason, count in queue.throttled.items():
                throttled.add_metric([queue.name, reason], count)
            for state in JobState:
                jobs.add_metric([queue.name, state.value], queue.jobs[state.value])
            lag.add_metric([queue.name], queue.lag_seconds)
            dead_letters.add_metric([queue.name], queue.dead_letters)
            active.add_metric([queue.name], queue.leases_active)
            expired.add_metric([queue.name], queue.leases_expired)
            paused.add_metric([queue.name], 1 if queue.paused else 0)
        yield from (jobs, lag, dead_letters, active, expired, paused, throttled)
        waiting = GaugeMetricFamily(
            "conveyor_gates_waiting",
            "Gates (workflow steps no handler runs) that wait, per queue and kind: signal, "
            "sleep (a timer) or condition (wait_until). Exact.",
            labels=["queue", "kind"],
        )
        for (queue, kind), count in sorted(waiting_gates().items()):
            waiting.add_metric([queue, kind], count)
        yield waiting
        yield GaugeMetricFamily(
            "conveyor_scrape_duration_seconds",
            "Time the database took to answer this scrape.",
            value=time.perf_counter() - started,
        )


# Through conveyor_job_gate_waiting_idx: the waiting gates only, whatever the table's size.
WAITING_GATES = """
SELECT queue, gate ->> 'kind', count(*) FROM conveyor_job
WHERE state = 'blocked' AND gate IS NOT NULL AND pending_dependencies = 0
GROUP BY 1, 2
"""


def waiting_gates() -> dict[tuple[str, str], int]:
    """Waiting gates per (queue, kind), over every database."""
    from django.db import connections

    counts: dict[tuple[str, str], int] = {}
    for database in conveyor_settings().databases():
        with connections[database].cursor() as cursor:
            cursor.execute(WAITING_GATES)
            for queue, kind, count in cursor.fetchall():
                counts[queue, kind] = counts.get((queue, kind), 0) + count
    return counts


def registry() -> CollectorRegistry:
    """The database's gauges, and this site's own enqueue counters."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    registry.register(process.collector())
    return registry


def _address_allowed(request: HttpRequest) -> bool:
    allowed = conveyor_settings().METRICS_ALLOWED_ADDRESSES
    if not allowed:
        return False
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(net, strict=False) for net in allowed)


@sensitive_variables("header", "raw")
def refusal(request: HttpRequest) -> HttpResponse | None:
    """401 or 403 unless the request may scrape; None when it may."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, raw = header.partition(" ")
        key = keys.authenticate(raw.strip()) if scheme.lower() == "bearer" else None
        if key is None:
            return _refused(401, "The API key is not valid.")
        if SCOPE not in key.scopes:
            return _refused(403, f"The API key {key.name!r} does not have the 'metrics' scope.")
        return None
    if _address_allowed(request):
        return None
    return _refused(
        401,
        "Send an API key with the 'metrics' scope as 'Authorization: Bearer <key>', or "
        "scrape from an address in CONVEYOR['METRICS_ALLOWED_ADDRESSES'].",
    )


def _refused(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="django-conveyor"'
    return response


# CSRF protects cookie-authenticated writes; this view reads and takes no
# cookie (a key or the client's address), so a POST is what it is: 405.
@csrf_exempt
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if refused := refusal(request):
        return refused
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry()), content_type=content_type)
