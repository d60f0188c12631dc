"""The backend's Task class, its workflow `Step`, a `task` decorator with its options, the resolver.

`ConveyorTask` adds per-task `max_attempts`, `timeout`, backoff bounds, a
per-call `idempotency_key` and `unique` (unique.py) to the standard Task. The decorator works on
Django 6.0, 6.1 and the 5.2 backport alike, because it builds the backend's
task class itself instead of relying on keyword forwarding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.utils.module_loading import autodiscover_modules, import_string

from .compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    Task,
    TaskResult,
    task_backends,
)
from .exceptions import UnknownTask
from .observability.labels import combined_tags, meta_problem, tags_problem
from .unique import Unique

OPTION_NAMES = (
    "max_attempts",
    "timeout",
    "backoff_base",
    "backoff_cap",
    "idempotency_key",
    "dependency_policy",
    "tags",
    "meta",
    "unique",
    "concurrency_key",
)
DEPENDENCY_POLICIES = ("cancel", "run")
# Read by the worker from the task itself, so a per-call value could not reach it.
PER_TASK_OPTIONS = ("timeout", "backoff_base", "backoff_cap")
TASK_MODULE_NAME = "tasks"  # Imported in every installed app to list its tasks.

_known_task_paths: set[str] = set()  # Every ConveyorTask built in this process.


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTask(Task):
    max_attempts: int | None = None  # None: CONVEYOR["MAX_ATTEMPTS"].
    timeout: float | None = None  # Seconds an attempt may run before it is retried.
    backoff_base: float | None = None  # Seconds; ceiling of the first retry's delay.
    backoff_cap: float | None = None  # Seconds; no retry waits longer.
    idempotency_key: str | None = None  # Set per call with .using(); one job per key.
    depends_on: tuple[str, ...] = ()  # Result ids this call waits for; per call, .using().
    dependency_policy: str = "cancel"  # "run": run once every dependency is final.
    # Observability (docs/observability.md): labels stored on the job row.
    tags: tuple[str, ...] = ()  # The task's, then each .using()'s, duplicates dropped.
    meta: dict[str, Any] | None = field(default=None, hash=False)  # Per call, .using().
    unique: Unique | None = None  # One job per key among chosen states (docs/unique-jobs.md).
    # Flow control (docs/flow-control.md): the key a queue's key_concurrency and
    # fair count by; text per call (.using()), or a function of the call's
    # arguments on @task, computed at enqueue and stored on the row.
    concurrency_key: str | Callable[..., str | None] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.tags, list):  # @task(tags=[...]): kept as a tuple, like .using()'s.
            object.__setattr__(self, "tags", combined_tags(self.tags))
        Task.__post_init__(self)  # No bare super(): slotted dataclasses lose its cell.
        _known_task_paths.add(self.module_path)

    def using(
        self,
        *,
        idempotency_key: str | None = None,
        depends_on: Iterable[Any] | None = None,
        tags: Iterable[str] | None = None,
        meta: dict[str, Any] | None = None,
        unique: Unique | bool | None = None,
        concurrency_key: str | Callable[..., str | None] | None = None,
        **changes: Any,
    ) -> ConveyorTask:
        """Like Task.using(), plus `max_attempts`, `idempotency_key`, `depends_on`
        (results or result ids of jobs already enqueued), `dependency_policy`,
        `tags` (added to the task's), `meta` (merged over earlier .using()'s) and
        `unique` (a `Unique`, or False for none on this call) and `concurrency_key`
        (text, or a function of the call's arguments)."""
        per_task = sorted(set(changes) & set(PER_TASK_OPTIONS))
        if per_task:
            raise TypeError(
                f"{', '.join(per_task)} apply to every call of a task: set them on "
                "@task(...), not with .using()."
            )
        extra = {name: changes.pop(name) for name in OPTION_NAMES if name in changes}
        if idempotency_key is not None:
            extra["idempotency_key"] = idempotency_key
        if concurrency_key is not None:
            extra["concurrency_key"] = concurrency_key  # validate_task checks it.
        if depends_on is not None:
            extra["depends_on"] = dependency_ids(depends_on)
        if tags is not None:
            if problem := tags_problem(tags):
                raise InvalidTask(problem)
            extra["tags"] = combined_tags(self.tags, tags)
        if meta is not None:
            if problem := meta_problem(meta):
                raise InvalidTask(problem)
            extra["meta"] = {**(self.meta or {}), **meta}
        task = Task.using(self, **changes) if changes else self
        extra = {k: v for k, v in extra.items() if v is not None}
        if unique is not None:
            extra["unique"] = None if unique is False else unique  # validate_task checks it.
        return replace(task, **extra) if extra else task

    def step(self, *args: Any, **kwargs: Any) -> Step:
        """This task with these arguments, for a workflow (`workflows.chain`, `group`, ...)."""
        return Step(self, args, kwargs)

    def enqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        """Enqueue many calls of this task in one statement (and one NOTIFY).

        Returns their `ConveyorTaskResult`s, in the order of `calls`.
        """
        return self.get_backend().enqueue_many(self, calls)


@dataclass(frozen=True, slots=True)
class Step:
    """One call of a task inside a workflow."""

    task: Any  # A ConveyorTask (its .using() options apply: queue, priority, depends_on...).
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] | None = None  # A gate (workflows/gates.py): no handler runs it.

    @property
    def label(self) -> str:
        if self.gate is not None:
            return f"gate {self.gate.get('signal') or self.gate['kind']}"
        return self.task.name


def dependency_ids(depends_on: Iterable[Any]) -> tuple[str, ...]:
    """Result ids from results (anything with an `id`), result ids or job ids."""
    if isinstance(depends_on, str | bytes) or hasattr(depends_on, "id"):
        raise TypeError("depends_on takes a list of results or result ids.")
    ids = []
    for dep in depends_on:
        value = getattr(dep, "id", dep)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(f"depends_on takes results or result ids, not {dep!r:.80}.")
        ids.append(str(value))
    return tuple(dict.fromkeys(ids))


def known_task_paths() -> list[str]:
    """The task paths this process knows, after importing each app's `tasks` module.

    The admin's task filter reads this registry instead of a DISTINCT scan
    of `conveyor_job`.
    """
    _discover_task_modules()
    return sorted(_known_task_paths)


@functools.cache
def _discover_task_modules() -> None:
    autodiscover_modules(TASK_MODULE_NAME)


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Any:
    """`@task` with django-conveyor's options (`max_attempts`, `timeout`, ...)."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise TypeError(f"Unknown task option(s): {', '.join(sorted(unknown))}.")
    for per_call in ("idempotency_key", "meta"):
        if per_call in options:
            raise TypeError(f"{per_call} is per call: use task.using({per_call}=...).enqueue(...).")

    def wrapper(func: Callable[..., Any]) -> Task:
        task_class = task_backends[backend].task_class
        if options and not issubclass(task_class, ConveyorTask):
            raise TypeError(
                f"Task backend {backend!r} does not accept django-conveyor options "
                f"({', '.join(sorted(options))}); point it at ConveyorBackend."
            )
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            **options,
        )

    return wrapper(function) if function else wrapper


@functools.lru_cache(maxsize=1024)
def resolve_task(task_path: str) -> Task:
    """The task a job names (its `task_path`), for the worker and `get_result()` alike."""
    try:
        obj = import_string(task_path)
    except Exception as exc:  # ImportError, or whatever the module raised as it loaded.
        raise UnknownTask(f"{task_path!r} does not import: {type(exc).__name__}: {exc}.") from exc
    if not isinstance(obj, Task):
        raise UnknownTask(f"{task_path!r} is not a task (decorate it with @task).")
    return obj


def task_or_none(task_path: str) -> Task | None:
    """The task, or None when the path does not resolve (the executor reports why)."""
    try:
        return resolve_task(task_path)
    except UnknownTask:
        return None
