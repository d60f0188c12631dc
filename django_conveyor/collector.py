"""Python's cyclic garbage collector, paused while a large batch is built.

A batch of 5,000 enqueued calls keeps about ten container objects per call
alive until it returns (arguments, rows, results): enough allocations to
set off about 65 collections, which found nothing to free
(tests/benchmarks/bulk_parts.py). Reference
counting still frees everything that is not a cycle; cycles made meanwhile
wait for the next collection after the batch.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block, and back on after it unless it was off before.

    Process-wide, as the collector is: another thread's cycles also wait
    until the block ends. Two threads in such blocks at once leave it on
    when the first one ends; a block never turns on a collector that was
    off when it began.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
