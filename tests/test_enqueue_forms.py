"""ENQUEUE's two forms (one job as a VALUES row, many from typed arrays) write the same rows."""

import datetime as dt

import pytest
from django.db import connection

from django_conveyor import protocol
from django_conveyor.unique import UniqueCall

pytestmark = pytest.mark.django_db(transaction=True)

LATER = dt.datetime(2031, 5, 4, 3, 2, 1, tzinfo=dt.UTC)
GATE = {"kind": "signal", "signal": "approval", "on_timeout": "fail", "seconds": 60}
# Every column that does not differ between two jobs by construction (id, times).
COMPARED = """task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
    enqueued_run_after, lease_version, idempotency_key, errors, pending_dependencies,
    dependency_policy, gate, gate_deadline IS NOT NULL, tags, meta, unique_key,
    unique_window IS NOT NULL, unique_states, uniqueness, concurrency_key"""


def jobs(tag: str, first_id: int) -> list[protocol.NewJob]:
    """A plain job, one with every option, a gate behind a dependency and an armed gate."""
    base = {"args": [1, "é\\\"'"], "kwargs": {"to": "a@b"}, "queue": "default",
            "backend": "default", "priority": 0, "max_attempts": 3}  # fmt: skip
    unique = UniqueCall(
        key=f"{tag}-unique", period=60, states=("available", "running"), replace=False,
        info={"parts": ["args"], "key": f"{tag}-unique"},
    )  # fmt: skip
    return [
        protocol.NewJob(task_path="tests.testapp.tasks.add", **base),
        protocol.NewJob(
            task_path="tests.testapp.tasks.add",
            **{**base, "priority": 7},
            run_after=LATER,
            idempotency_key=f"{tag}-key",
            tags=("a", "b"),
            meta={"m": [1, None]},
            unique=unique,
            concurrency_key="customer-1",
        ),
        protocol.NewJob(
            task_path="django_conveyor.workflows.gates.signal",
            **base,
            depends_on=(first_id,),
            dependency_policy="run",
            gate=GATE,
        ),
        protocol.NewJob(task_path="django_conveyor.workflows.gates.signal", **base, gate=GATE),
    ]


def written(ids: list[int]) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {COMPARED} FROM conveyor_job WHERE id = ANY(%s) ORDER BY id", [ids])
        rows = cur.fetchall()
    # The keys name their form; the rest must be equal.
    return [tuple(str(v).replace("one-", "").replace("many-", "") for v in row) for row in rows]


def test_one_call_at_a_time_writes_what_one_call_of_many_writes():
    with connection.cursor() as cur:
        [dependency] = protocol.enqueue(cur, jobs("one", 0)[:1], notify=False)
        one = [dependency.id]
        for job in jobs("one", dependency.id)[1:]:
            [enqueued] = protocol.enqueue(cur, [job], notify=False)
            one.append(enqueued.id)
        many_jobs = jobs("many", 0)
        [many_dependency] = protocol.enqueue(cur, many_jobs[:1], notify=False)
        rest = protocol.enqueue(cur, jobs("many", many_dependency.id)[1:], notify=False)
        many = [many_dependency.id, *(e.id for e in rest)]
    assert [e.state for e in rest] == ["available", "blocked", "blocked"]
    one_rows, many_rows = written(one), written(many)
    assert one_rows == many_rows
    assert one_rows[1][11] == "key" and one_rows[2][16] == "False" and one_rows[3][16] == "True"
