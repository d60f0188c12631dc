"""Keyset pages of jobs, newest first, that stay fast and stable at millions of rows.

A page is "the `limit` jobs with the highest ids below the cursor". New jobs
get higher ids, so inserts never shift a later page: a client walking the
pages sees every job that existed when it started exactly once.

Each page is the merge, by id, of one short read per (state, queue) pair,
each a range of `conveyor_job_list_idx` `(state, queue, id)` (a hand-made
skip scan): with both filters there is one pair; with `queue` alone, one per
state (seven); with `state` alone, one per queue that has jobs in that
state (found first with a loose index scan). Every pair is a constant in
its branch, so the planner knows from the statistics which pairs are rare
(read from the index range) and which hold most of the table (read from
the primary key backwards, which fills a page as fast). Without either
filter the primary key is read backwards; with a task or a search but no
state or queue, the running jobs (from `conveyor_job_reap_idx`) and the
others are read apart, since the task and list indexes leave running rows
out. The `task` filter is applied inside those reads. With `unique_key`
(unique jobs), the page is read from the key's two indexes
(`models.unique_key_is`), the other filters applied to the few jobs of that
key. Pages with state `running` read `conveyor_job_reap_idx`, which leads
with the queue (the list index leaves running rows out).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from typing import Any

from django.db import connections
from django.db.models import QuerySet

from ..models import Job, unique_key_is
from ..queue_counts import QUEUES_IN_STATE
from ..readable import select_list
from ..states import JobState

# {columns}: every column, its timestamps clamped (readable.select_list), so
# that a row holding one Python cannot load still lists.
_BRANCH = """(
    SELECT {columns} FROM conveyor_job AS j
    WHERE j.state = %(state_{n})s AND j.queue = %(queue_{n})s AND j.id < %(before)s {task}
    ORDER BY j.id DESC
    LIMIT %(limit)s
)"""
PAGE = """
SELECT {columns} FROM conveyor_job AS j
WHERE j.id < %(before)s {task}
ORDER BY j.id DESC
LIMIT %(limit)s
"""
# With a task or a search but neither state nor queue: the running jobs and
# the others apart, since the task index (like the list index) leaves
# running rows out and conveyor_job_reap_idx has them.
_PART = """(
    SELECT {columns} FROM conveyor_job AS j
    WHERE j.id < %(before)s AND j.state {part} 'running' {task}
    ORDER BY j.id DESC
    LIMIT %(limit)s
)"""
TASK_FILTER = "AND j.task_path = %(task)s"
NO_CURSOR = 2**63 - 1


@functools.cache
def _columns() -> str:
    return select_list(Job, "j")


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


def _pairs(database: str, state: str | None, queue: str | None) -> list[tuple[str, str]]:
    if state and queue:
        return [(state, queue)]
    if queue:
        return [(s.value, queue) for s in JobState]
    with connections[database].cursor() as cursor:
        cursor.execute(QUEUES_IN_STATE, {"state": state})
        return [(state, name) for (name,) in cursor.fetchall()]


def query(
    database: str,
    *,
    state: str | None,
    queue: str | None,
    task: str | None,
    before: int,
    limit: int,
    where: tuple[str, dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The SQL of one page of at most `limit` jobs, and its parameters.

    `where`: one more predicate (a search's, with named parameters), inside each read.
    """
    params: dict[str, Any] = {"task": task, "before": before, "limit": limit}
    task_filter = TASK_FILTER if task else ""
    if where is not None:
        task_filter += f" AND ({where[0]})"
        params.update(where[1])
    if not (state or queue):
        if not task_filter:
            return PAGE.format(task=task_filter, columns=_columns()), params
        parts = [_PART.format(part=p, task=task_filter, columns=_columns()) for p in ("<>", "=")]
        return _merged(parts), params
    pairs = _pairs(database, state, queue)
    if not pairs:
        return "SELECT * FROM conveyor_job WHERE false", params
    branches = []
    for n, (pair_state, pair_queue) in enumerate(pairs):
        params[f"state_{n}"], params[f"queue_{n}"] = pair_state, pair_queue
        branches.append(_BRANCH.format(n=n, task=task_filter, columns=_columns()))
    return _merged(branches), params


def _merged(branches: list[str]) -> str:
    """One page from reads that each give their newest jobs first."""
    return (
        "SELECT page.* FROM (\n"
        + "\nUNION ALL\n".join(branches)
        + "\n) AS page\nORDER BY page.id DESC\nLIMIT %(limit)s"
    )


def _of_key(
    database: str, unique_key: str, *, state: str | None, queue: str | None,
    task: str | None, before: int, limit: int, where: tuple[str, list[Any]] | None = None,
) -> QuerySet[Job]:  # fmt: skip
    jobs = Job.objects.using(database).filter(unique_key_is(unique_key), id__lt=before)
    for name, value in (("state", state), ("queue", queue), ("task_path", task)):
        if value:
            jobs = jobs.filter(**{name: value})
    if where is not None:  # A search's predicate, in its ORM form (`%s` and a list).
        jobs = jobs.extra(where=[where[0]], params=where[1])
    return jobs.order_by("-id")[:limit]


def page(
    database: str, *, limit: int, window: int | None = None, **filters: Any
) -> tuple[list[Job], int | None]:
    """One page (newest first) and the cursor id of the next, or None on the last.

    `filters` are those of `query()`: state, queue, task, before and where (named
    parameters), and unique_key (every job of that key, read through its two
    indexes, no window; then `where` is in the ORM's form, `%s` and a list).
    `window`: look at no more than this many of the newest jobs the other
    filters select; if the page is not full by then, the cursor points below
    them, so the next page goes on with the next window.
    """
    if unique_key := filters.pop("unique_key", None):
        jobs = list(_of_key(database, unique_key, limit=limit + 1, **filters))
        if len(jobs) > limit:
            return jobs[:limit], jobs[limit - 1].id
        return jobs, None
    floor = None
    if window is not None:
        plain = {k: v for k, v in filters.items() if k != "where"}
        sql, params = query(database, limit=window, **plain)
        with connections[database].cursor() as cursor:
            cursor.execute(f"SELECT min(w.id), count(*) FROM ({sql}) AS w", params)
            lowest, seen = cursor.fetchone()
        if seen == window:
            floor = lowest
            sql, params = filters["where"]
            filters["where"] = (
                f"id >= %(window_floor)s AND {sql}",
                {**params, "window_floor": floor},
            )
    sql, params = query(database, limit=limit + 1, **filters)
    jobs = list(Job.objects.using(database).raw(sql, params))
    if len(jobs) > limit:
        return jobs[:limit], jobs[limit - 1].id
    return jobs, floor
