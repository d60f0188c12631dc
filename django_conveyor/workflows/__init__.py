"""Workflows: chains, groups and fan-ins of tasks, enqueued in one transaction.

A `Step` (tasks.py) is a task with its arguments (`task.step(*args,
**kwargs)`). The builders compose steps and other workflows into a
`Workflow`:

    chain(a, b, c)            each after the one before
    group(a, b, c)            side by side
    fan_in([a, b, c], then)   `then` after every one of them (a chord)

Gates are steps that no handler runs (`signal`, `sleep`, `wait_until`):
each waits in the database, blocked, until a signal, the clock or a row
ends it (workflows/gates.py, workflows/conditions.py, and docs/workflows.md,
"Workflows that wait").

`Workflow.enqueue()` writes every job and every edge in one
`transaction.atomic()` on the jobs' database (a savepoint inside the
caller's own transaction), so the whole workflow commits or none of it.
The graph is checked before anything is written: a cycle, a step with more
than `protocol.MAX_DEPENDENCIES` dependencies, steps in different databases,
or an outside dependency that does not exist or already failed are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from .. import protocol
from ..backend import UNIQUE_WITH_DEPENDENCIES
from ..bounds import EARLIEST_INSTANT, MAX_SECONDS, instant_breach, seconds_breach
from ..compat import InvalidTask
from ..conf import conveyor_settings
from ..exceptions import DependencyCycle, DependencyInOtherDatabase, TooManyDependencies
from ..results import ConveyorTaskResult
from ..tasks import Step
from . import conditions, gates


class Workflow:
    """A graph of steps, each after the steps it names; enqueue it with `enqueue()`."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._after: list[list[int | str]] = []  # Per step: indexes or names it waits for.
        self._names: dict[str, int] = {}

    def add(self, step: Step, *, name: str | None = None, after: Iterable[int | str] = ()) -> int:
        """Add a step after others (their indexes, or names given now or later); its index."""
        if name is not None:
            if name in self._names:
                raise ValueError(f"A step is already named {name!r}.")
            self._names[name] = len(self.steps)
        self.steps.append(step)
        self._after.append(list(after))
        return len(self.steps) - 1

    def _edges(self) -> list[set[int]]:
        edges = []
        for index, refs in enumerate(self._after):
            deps = set()
            for ref in refs:
                if isinstance(ref, str):
                    if ref not in self._names:
                        raise ValueError(f"Step {index} waits for {ref!r}, which names no step.")
                    ref = self._names[ref]
                if not 0 <= ref < len(self.steps):
                    raise ValueError(f"Step {index} waits for step {ref}, which does not exist.")
                deps.add(ref)
            edges.append(deps)
        return edges

    def _name_of(self, index: int) -> str:
        names = {i: n for n, i in self._names.items()}
        return names.get(index, f"{self.steps[index].label}#{index}")

    def sources(self) -> list[int]:
        return [i for i, deps in enumerate(self._edges()) if not deps]

    def sinks(self) -> list[int]:
        edges = self._edges()
        waited_for = set().union(*edges) if edges else set()
        return [i for i in range(len(self.steps)) if i not in waited_for]

    def _merge(self, other: Workflow, after: Iterable[int] = ()) -> tuple[list[int], list[int]]:
        """Copy `other` in, its sources after `after`; its (sources, sinks) here."""
        offset = len(self.steps)
        edges = other._edges()
        after = list(after)
        for index, step in enumerate(other.steps):
            deps = [offset + d for d in sorted(edges[index])] or after
            self.add(step, after=deps)
        return [offset + i for i in other.sources()], [offset + i for i in other.sinks()]

    def levels(self) -> list[list[int]]:
        """Steps by depth (each after only steps of earlier levels); refuses a cycle."""
        edges = self._edges()
        depth: dict[int, int] = {}
        waiting = {i: set(deps) for i, deps in enumerate(edges)}
        ready = [i for i, deps in waiting.items() if not deps]
        dependents: dict[int, list[int]] = {}
        for i, deps in enumerate(edges):
            for d in deps:
                dependents.setdefault(d, []).append(i)
        while ready:
            i = ready.pop()
            depth[i] = max((depth[d] + 1 for d in edges[i]), default=0)
            for j in dependents.get(i, ()):
                waiting[j].discard(i)
                if not waiting[j]:
                    ready.append(j)
        if len(depth) < len(self.steps):
            stuck = ", ".join(self._name_of(i) for i in sorted(set(waiting) - set(depth)))
            raise DependencyCycle(
                f"The workflow's steps wait for each other in a cycle: {stuck}; nothing "
                "was enqueued."
            )
        by_level: list[list[int]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for i in sorted(depth):
            by_level[depth[i]].append(i)
        return by_level

    def enqueue(self) -> WorkflowResult:
        """Enqueue every step, in one transaction on the steps' database."""
        levels = self.levels()
        edges = self._edges()
        steps = _bind_gates(self.steps)
        for step in steps:
            step.task.get_backend().validate_task(step.task)
        database = _one_database(steps)
        jobs = []
        for index, step in enumerate(steps):
            job = step.task.get_backend().new_job(step.task, step.args, step.kwargs)
            if job.unique is not None and edges[index]:
                raise InvalidTask(UNIQUE_WITH_DEPENDENCIES.format(name=step.task.name))
            if step.gate is not None:
                job = replace(job, gate=step.gate)
            wanted = len(set(job.depends_on)) + len(edges[index])
            if wanted > protocol.MAX_DEPENDENCIES:
                raise TooManyDependencies(
                    f"Step {self._name_of(index)} waits for {wanted} jobs; the limit is "
                    f"{protocol.MAX_DEPENDENCIES}. Fan in through intermediate steps."
                )
            jobs.append(job)
        ids: dict[int, int] = {}
        results: dict[int, ConveyorTaskResult] = {}
        with transaction.atomic(using=database):
            with connections[database].cursor() as cursor:
                # Outside dependencies: checked (and share-locked) before any write.
                protocol.pending_dependencies(cursor, jobs)
            for level in levels:
                batch = [
                    replace(jobs[i], depends_on=(*jobs[i].depends_on, *(ids[d] for d in edges[i])))
                    for i in level
                ]
                tasks = [steps[i].task for i in level]
                written = tasks[0].get_backend().enqueue_jobs(tasks, batch)
                for i, result in zip(level, written, strict=True):
                    results[i] = result
                    ids[i] = protocol_id(result)
            _check_new_conditions(database, [ids[i] for i, s in enumerate(steps) if s.gate])
        names = {name: results[i] for name, i in self._names.items()}
        return WorkflowResult([results[i] for i in range(len(steps))], names)

    async def aenqueue(self) -> WorkflowResult:
        return await sync_to_async(self.enqueue, thread_sensitive=True)()

    def __len__(self) -> int:
        return len(self.steps)


def _bind_gates(steps: list[Step]) -> list[Step]:
    """Gates take the queue and backend of the workflow's first task, so they share its database."""
    tasks = [s.task for s in steps if s.gate is None]
    if len(tasks) == len(steps):
        return steps
    options: dict[str, Any] = {}
    if tasks:
        options = {"queue_name": tasks[0].queue_name, "backend": tasks[0].backend}
    return [
        replace(s, task=s.task.using(**options, dependency_policy=s.gate["policy"]))
        if s.gate is not None
        else s
        for s in steps
    ]


def _check_new_conditions(database: str, gate_ids: list[int]) -> None:
    """Check the conditions of the new condition gates that wait already (no upstream)."""
    if gate_ids:
        conditions.check_conditions(database, ids=gate_ids)


def protocol_id(result: ConveyorTaskResult) -> int:
    """The conveyor_job id of a result (its id is `alias:id` in a shard)."""
    return int(str(result.id).rpartition(":")[2])


def _one_database(steps: Sequence[Step]) -> str:
    settings = conveyor_settings()
    databases = {settings.database_for(s.task.queue_name) for s in steps}
    if len(databases) > 1:
        raise DependencyInOtherDatabase(
            f"The workflow's steps live in several databases ({', '.join(sorted(databases))}); "
            "a workflow's jobs share one database, so route their queues to one."
        )
    return databases.pop() if databases else settings.DATABASE


@dataclass(frozen=True, slots=True)
class WorkflowResult:
    """The results of an enqueued workflow, in step order (and by name for `add(name=)`)."""

    results: list[ConveyorTaskResult]
    names: dict[str, ConveyorTaskResult] = field(default_factory=dict)

    def __getitem__(self, key: int | str) -> ConveyorTaskResult:
        return self.names[key] if isinstance(key, str) else self.results[key]

    def __iter__(self) -> Iterator[ConveyorTaskResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def last(self) -> ConveyorTaskResult:
        """The last step added: a chain's end, a fan-in's callback."""
        return self.results[-1]


def _as_workflow(part: Step | Workflow) -> Workflow:
    if isinstance(part, Workflow):
        return part
    if isinstance(part, Step):
        workflow = Workflow()
        workflow.add(part)
        return workflow
    raise TypeError(
        f"A workflow is made of steps (task.step(...)) and workflows, not {part!r:.80}."
    )


def chain(*parts: Step | Workflow) -> Workflow:
    """Each part after every end of the part before it."""
    workflow = Workflow()
    ends: list[int] = []
    for part in parts:
        _, ends = workflow._merge(_as_workflow(part), after=ends)
    return workflow


def group(*parts: Step | Workflow) -> Workflow:
    """The parts side by side, none waiting for another."""
    workflow = Workflow()
    for part in parts:
        workflow._merge(_as_workflow(part))
    return workflow


def fan_in(parts: Iterable[Step | Workflow], then: Step | Workflow) -> Workflow:
    """`then` after every one of `parts` (a group and its callback)."""
    return chain(group(*parts), then)


ON_TIMEOUT = ("fail", "continue")
POLICIES = ("cancel", "run")


def signal(
    name: str,
    *,
    timeout: timedelta | None = None,
    on_timeout: str = "fail",
    dependency_policy: str = "cancel",
) -> Step:
    """A gate that waits for `send_signal(gate, name, payload=...)`; the payload is its result."""
    gates.check_signal_name(name, "signal's name")
    definition = {"kind": "signal", "signal": name, **_timeout(timeout, on_timeout, "signal")}
    return _gate(definition, dependency_policy)


def sleep(
    duration: timedelta | None = None,
    *,
    until: datetime | None = None,
    dependency_policy: str = "cancel",
) -> Step:
    """A durable timer: `duration` after its upstream steps are done, or until `until`."""
    if (duration is None) == (until is None):
        raise ValueError("sleep() takes a duration or until=, exactly one of them.")
    if duration is not None:
        definition = {"kind": "sleep", "seconds": _seconds(duration, "sleep()'s duration")}
    else:
        definition = {"kind": "sleep", "until": _instant(until)}
    return _gate(definition, dependency_policy)


def wait_until(
    model: Any,
    q: Any,
    *,
    timeout: timedelta | None = None,
    on_timeout: str = "fail",
    dependency_policy: str = "cancel",
) -> Step:
    """A gate that waits until a row of `model` matches `q`; `{"matched": pk}` is its result."""
    definition = {
        "kind": "condition",
        "condition": conditions.condition(model, q),
        **_timeout(timeout, on_timeout, "wait_until"),
    }
    return _gate(definition, dependency_policy)


def _gate(definition: dict[str, Any], policy: str) -> Step:
    if policy not in POLICIES:
        raise ValueError(
            f"dependency_policy must be one of {', '.join(map(repr, POLICIES))}, "
            f"not {policy!r:.80}."
        )
    # "policy" is read when the gate is bound to its workflow; the rest is stored.
    return Step(gates.gate_task(definition["kind"]), gate={**definition, "policy": policy})


def _timeout(timeout: timedelta | None, on_timeout: str, what: str) -> dict[str, Any]:
    if on_timeout not in ON_TIMEOUT:
        raise ValueError(
            f"{what}()'s on_timeout must be one of {', '.join(map(repr, ON_TIMEOUT))}, "
            f"not {on_timeout!r:.80}."
        )
    if timeout is None:
        return {"on_timeout": on_timeout}
    return {"seconds": _seconds(timeout, f"{what}()'s timeout"), "on_timeout": on_timeout}


def _seconds(value: Any, what: str) -> float:
    if not isinstance(value, timedelta):
        raise TypeError(f"{what} must be a timedelta, not {type(value).__name__} {value!r:.60}.")
    seconds = value.total_seconds()
    if seconds_breach(seconds, zero=True):
        raise ValueError(
            f"{what} must be from 0 to ten years ({MAX_SECONDS:.0f} seconds), not {value}."
        )
    return seconds


def _instant(value: Any) -> str:
    if not isinstance(value, datetime):
        raise TypeError(
            f"sleep()'s until must be a datetime, not {type(value).__name__} {value!r:.60}."
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"sleep()'s until must be an aware datetime, not the naive {value}.")
    # As run_after: an instant no worker or page could read back would jam its gate.
    if instant_breach(value) or value > datetime.now(UTC) + timedelta(seconds=MAX_SECONDS):
        raise ValueError(
            f"sleep()'s until {value.isoformat()} must be an instant from "
            f"{EARLIEST_INSTANT.date().isoformat()} UTC to ten years from now."
        )
    return value.astimezone(UTC).isoformat()


__all__ = [
    "Workflow",
    "WorkflowResult",
    "chain",
    "fan_in",
    "group",
    "signal",
    "sleep",
    "wait_until",
]
