"""Counters of the process they run in: enqueues, from the signals of every enqueue.

`conveyor_jobs_enqueued_total` counts new jobs when their transaction
commits (a rolled-back enqueue is not a job); `conveyor_jobs_enqueue_replays_total`
counts enqueues whose idempotency key already named a job. Any process that
enqueues counts: web processes (shown by the scrape view) and workers whose
handlers enqueue (shown on `--metrics-port`).

In a server with several processes (gunicorn, uWSGI), set
PROMETHEUS_MULTIPROC_DIR as prometheus_client's multiprocess mode asks, and
the scrape view adds up every process's counts.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.multiprocess import MultiProcessCollector

from ..compat import task_enqueued
from ..conf import conveyor_settings
from ..signals import task_enqueue_replayed

REGISTRY = CollectorRegistry(auto_describe=True)
LABELS = ("queue", "task")


@dataclass(frozen=True, slots=True)
class EnqueueCounters:
    enqueued: Counter
    replays: Counter


@functools.cache
def counters() -> EnqueueCounters:
    """Made on first use, so multiprocess mode is chosen by then."""
    return EnqueueCounters(
        enqueued=Counter(
            "conveyor_jobs_enqueued",
            "New jobs enqueued by this process, counted when their transaction commits.",
            LABELS,
            registry=REGISTRY,
        ),
        replays=Counter(
            "conveyor_jobs_enqueue_replays",
            "Enqueues whose idempotency key already named a job (nothing written).",
            LABELS,
            registry=REGISTRY,
        ),
    )


def _labels(task_result: Any) -> tuple[str, str]:
    task = task_result.task
    return task.queue_name, task.module_path


def _ours(sender: Any) -> bool:
    from ..backend import ConveyorBackend

    return isinstance(sender, type) and issubclass(sender, ConveyorBackend)


def _count_new(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if not _ours(sender):
        return
    counter = counters().enqueued.labels(*_labels(task_result))
    database = conveyor_settings().database_for(task_result.task.queue_name)
    transaction.on_commit(counter.inc, using=database)


def _count_replay(sender: Any, task_result: Any, **kwargs: Any) -> None:
    counters().replays.labels(*_labels(task_result)).inc()


def install() -> None:
    """Count enqueues in this process from now on (idempotent)."""
    counters()
    task_enqueued.connect(_count_new, dispatch_uid="django_conveyor.metrics.enqueued")
    task_enqueue_replayed.connect(_count_replay, dispatch_uid="django_conveyor.metrics.replays")


def collector() -> Any:
    """This process's counters, or every process's in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry)
        return registry
    return REGISTRY
