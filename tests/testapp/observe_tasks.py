"""Tasks of the observability tests: they log, report progress and wait on files."""

import asyncio
import logging
import threading
import time
from pathlib import Path

from django_conveyor.tasks import task

logger = logging.getLogger("tests.observe")


@task(tags=["observe"])
def tagged(label):
    return label


@task(takes_context=True, tags=["observe", "labels"])
def labels(context):
    """What the handler sees of its job's labels."""
    return {"tags": list(context.tags), "meta": context.meta}


@task(takes_context=True)
def logs_lines(context, label, lines, pause=0.0):
    """Logs `lines` warnings naming `label`, pausing between them, while another thread logs too."""
    noise = threading.Thread(target=lambda: logger.warning("noise from a thread of %s", label))
    noise.start()
    for i in range(lines):
        logger.warning("%s line %d", label, i)
        logger.info("%s info %d", label, i)  # below the default level
        time.sleep(pause)
    noise.join()
    return label


@task(takes_context=True)
async def logs_lines_async(context, label, lines, pause=0.0):
    async def child():
        logger.warning("%s from a task", label)

    for i in range(lines):
        logger.warning("%s line %d", label, i)
        await asyncio.sleep(pause)
    await asyncio.create_task(child())
    await asyncio.to_thread(logger.warning, "%s from to_thread", label)  # copies the context
    return label


@task(takes_context=True, max_attempts=2, backoff_base=0.01, backoff_cap=0.01)
def logs_then_fails(context, label):
    logger.warning("%s attempt %d", label, context.attempt)
    if context.attempt == 1:
        raise RuntimeError(f"{label} failed once")
    return label


@task()
def floods(label, count):
    for i in range(count):
        logger.warning("%s %05d %s", label, i, "x" * 100)


@task(takes_context=True)
def reports_progress(context, steps, release):
    """Reports progress many times per beat, then waits for the file `release`."""
    for i in range(1, steps + 1):
        context.set_progress(i, total=steps, message=f"step {i}")
    while not Path(release).exists():
        time.sleep(0.02)
    return steps
