"""Keyset pages of jobs, newest first, that stay fast and stable at millions of rows.

A page is "the `limit` jobs with the highest ids below the cursor". New jobs
get higher ids, so inserts never shift a later page: a client walking the
pages sees every job that existed when it started exactly once.

Each page is read from `conveyor_job_list_idx` `(state, queue, id)` as one
short index range per (state, queue) pair, merged by id (a hand-made skip
scan): with both filters that is one range; with `queue` alone, one per
state (seven); with `state` alone, one per queue that has jobs in that
state (found with a loose index scan). Without either, the primary key is
read backwards. The `task` filter is applied inside those ranges.
"""

from __future__ import annotations

import base64
import binascii
import json

from ..models import Job
from ..states import JobState
from ..stats import QUEUES_IN_STATE

_RANGE = """
SELECT page.* FROM ({pairs}) AS p(state, queue)
CROSS JOIN LATERAL (
    SELECT j.* FROM conveyor_job AS j
    WHERE j.state = p.state AND j.queue = p.queue AND j.id < %(before)s {task}
    ORDER BY j.id DESC
    LIMIT %(limit)s
) AS page
ORDER BY page.id DESC
LIMIT %(limit)s
"""

PAGE_BY_STATE_AND_QUEUE = _RANGE.format(
    pairs="SELECT %(state)s::text, %(queue)s::text", task="{task}"
)
PAGE_BY_QUEUE = _RANGE.format(
    pairs="SELECT s, %(queue)s::text FROM unnest(%(states)s::text[]) AS s", task="{task}"
)
PAGE_BY_STATE = _RANGE.format(
    pairs=f"SELECT %(state)s::text, q.queue FROM ({QUEUES_IN_STATE}) AS q", task="{task}"
)
PAGE = """
SELECT j.* FROM conveyor_job AS j
WHERE j.id < %(before)s {task}
ORDER BY j.id DESC
LIMIT %(limit)s
"""
TASK_FILTER = "AND j.task_path = %(task)s"
NO_CURSOR = 2**63 - 1


class BadCursor(ValueError):
    pass


def encode_cursor(before: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"before": before}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return NO_CURSOR
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        before = data["before"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise BadCursor(cursor) from None
    if isinstance(before, bool) or not isinstance(before, int) or before < 1:
        raise BadCursor(cursor)
    return before


def page(
    database: str,
    *,
    state: str | None,
    queue: str | None,
    task: str | None,
    before: int,
    limit: int,
) -> tuple[list[Job], int | None]:
    """One page (newest first) and the cursor id of the next, or None on the last."""
    if state and queue:
        sql = PAGE_BY_STATE_AND_QUEUE
    elif queue:
        sql = PAGE_BY_QUEUE
    elif state:
        sql = PAGE_BY_STATE
    else:
        sql = PAGE
    params = {
        "state": state,
        "queue": queue,
        "states": [s.value for s in JobState],
        "task": task,
        "before": before,
        "limit": limit + 1,
    }
    sql = sql.format(task=TASK_FILTER if task else "")
    jobs = list(Job.objects.using(database).raw(sql, params))
    if len(jobs) > limit:
        return jobs[:limit], jobs[limit - 1].id
    return jobs, None
