"""The Celery application the benchmark's workers load (``-A celery_app``)."""

from __future__ import annotations

import os

import bench_common
from celery import Celery

PREFETCH = int(os.environ.get("BENCH_CELERY_PREFETCH", "64"))

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,  # no result backend: nothing to store for no-op jobs
    task_default_queue="default",
    worker_prefetch_multiplier=PREFETCH,
    worker_disable_rate_limits=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop(seq: int) -> None:
    bench_common.noop_job(seq)


@app.task(name="relay")
def relay(seq: int) -> None:
    bench_common.relay_job(seq)


KINDS = {"noop": noop, "relay": relay}
