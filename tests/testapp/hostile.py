"""Handlers that attack their worker: they kill it, or never return."""

import os
import time

from asgiref.sync import sync_to_async

from django_conveyor import task

from .models import Effect

STUCK_SECONDS = 120.0  # Long past any test's bound; the worker must not wait for it.


@task(max_attempts=3)
def kills_its_worker():
    os._exit(1)


def started(label: str) -> None:
    """Say that a slot runs it (a plain write), so a test knows it is not just buffered."""
    Effect.objects.create(job_id=0, token=0, worker="", label=label)


def stuck(busy: bool) -> None:
    """Ignore every timeout: sleep in a loop, or spin without sleeping."""
    started("stuck")
    deadline = time.monotonic() + STUCK_SECONDS
    while time.monotonic() < deadline:
        if not busy:
            time.sleep(0.05)


async def spin() -> None:
    """A CPU loop inside the event loop's thread: no await, so no cancellation."""
    await sync_to_async(started)("stuck")
    deadline = time.monotonic() + STUCK_SECONDS
    while time.monotonic() < deadline:
        pass


@task(timeout=60, max_attempts=1)
def ignores_shutdown(busy):
    stuck(busy)


@task(timeout=60, max_attempts=1)
async def async_ignores_shutdown():
    await spin()


@task(timeout=1, max_attempts=1)
def ignores_timeout(busy):
    stuck(busy)


@task(timeout=1, max_attempts=1)
async def async_ignores_timeout():
    await spin()
