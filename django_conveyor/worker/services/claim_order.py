"""The claim order service: whether other queues' waiting rows sort ahead of a worker's.

CLAIM reads the waiting rows of every queue in claim order (priority, then
due time, then id) and keeps those of the worker's queues, so a worker of
several queues passes, on every claim, each waiting row of a queue it does
not serve (or no longer claims: paused, limited) that sorts ahead of its
own: a backlog of 10^6 such rows made each claim 80 times as long. A
worker of one queue reads its own range of the queue-led index and never
meets them.

So every INTERVAL_SECONDS a worker of several queues counts, on its control
connection, how many of the first SCAN_ROWS waiting rows in claim order are
of queues its CLAIM does not take (protocol.PASSED_AHEAD, one bounded index
scan). From
MERGE_AT of them on, the claimer sends CLAIM_MERGED instead, which reads one
ordered range per queue and merges them: the same jobs in the same order,
at a fixed cost per claim that is higher than CLAIM's when nothing is
ahead. Below UNMERGE_BELOW it sends CLAIM again. The count is only a route:
both statements take the same jobs under the same guard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from ... import protocol
from ...protocol import Cursor
from ..claims import Claimer
from .base import transaction_of

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 5.0
SCAN_ROWS = 20_000  # How far into the claim order a look reads (about 4 ms).
# About 0.2 µs of a claim's time per row passed: from 10,000 rows on, CLAIM
# pays more than CLAIM_MERGED's planning and branches (docs/performance.md).
MERGE_AT = 10_000
UNMERGE_BELOW = 5_000  # Apart from MERGE_AT, so a count near it does not flap.


class ClaimOrderCounts(NamedTuple):
    claim_order_looks: int = 0


@dataclass
class ClaimOrderService:
    claimer: Claimer
    interval: float = INTERVAL_SECONDS
    name: str = "claim order"
    while_draining: bool = False

    def run_once(self, cursor: Cursor, now: Any = None) -> ClaimOrderCounts:
        if not self.claimer.may_merge:
            self.claimer.behind = False
            return ClaimOrderCounts()
        with transaction_of(cursor):
            cursor.execute(protocol.JIT_OFF)
            passed = protocol.passed_ahead(cursor, queues=self.claimer.free_queues, scan=SCAN_ROWS)
        behind = passed >= (UNMERGE_BELOW if self.claimer.behind else MERGE_AT)
        if behind != self.claimer.behind:
            logger.info(
                "%d of the first %d waiting jobs in claim order are of queues this worker "
                "does not claim: %s",
                passed,
                SCAN_ROWS,
                "claiming from each queue's own range (CLAIM_MERGED)"
                if behind
                else "claiming in one ordered scan again (CLAIM)",
            )
        self.claimer.behind = behind
        return ClaimOrderCounts(1)
