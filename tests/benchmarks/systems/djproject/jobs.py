"""The benchmark's task functions, registered with whichever backend is active."""

from __future__ import annotations

from typing import Any

import bench_common
from django.conf import settings

if settings.SYSTEM == "conveyor":
    from django_conveyor import task as _task
else:
    from django.tasks import task as _task

task: Any = _task


@task()
def noop(seq: int) -> None:
    bench_common.noop_job(seq)


@task()
def relay(seq: int) -> None:
    bench_common.relay_job(seq)


KINDS = {"noop": noop, "relay": relay}
