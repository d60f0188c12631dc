"""Which tasks the HTTP API may enqueue: `CONVEYOR["API_TASKS"]`, never the network.

Entries are task paths (`shop.tasks.send_receipt`) or patterns whose
wildcards (`*`, `?`, `[...]`, as in `fnmatch`) are in the last part only
(`shop.tasks.*`). The modules named by the entries are imported from the
settings, once; a name sent by a client is only looked up among the tasks
found there, so a request can never make the server import anything.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

from django.utils.module_loading import import_string

from ..compat import Task
from ..conf import conveyor_settings

WILDCARDS = frozenset("*?[")


class NotAllowed(LookupError):
    """The task is not on the allow-list."""


class UnknownTask(LookupError):
    """The task is on the allow-list but names no task."""


@dataclass(frozen=True, slots=True)
class AllowList:
    entries: tuple[str, ...]
    tasks: dict[str, Task]  # task path -> task, for every task an entry names.
    problems: tuple[str, ...]  # Entries that cannot be resolved, as sentences.

    def allows(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, entry) for entry in self.entries)

    def resolve(self, path: str) -> Task:
        """The task a client named; NotAllowed is decided before anything else."""
        if not self.allows(path):
            raise NotAllowed(path)
        try:
            return self.tasks[path]
        except KeyError:
            raise UnknownTask(path) from None


def is_pattern(entry: str) -> bool:
    return bool(WILDCARDS & set(entry))


def entry_problem(entry: object) -> str | None:
    """Why an entry is malformed, or None."""
    if not isinstance(entry, str) or not entry:
        return f"{entry!r} is not a task path."
    module, _, last = entry.rpartition(".")
    if not module or not last:
        return f"{entry!r} is not a dotted task path such as 'shop.tasks.send_receipt'."
    if is_pattern(module):
        return (
            f"{entry!r} has a wildcard before its last part; name the module "
            "(wildcards match task names within it, as in 'shop.tasks.*')."
        )
    return None


def _tasks_of(module: ModuleType, entry: str) -> dict[str, Task]:
    found = {}
    for value in vars(module).values():
        if isinstance(value, Task) and fnmatch.fnmatchcase(value.module_path, entry):
            found[value.module_path] = value
    return found


def _backend_problem(path: str, task: Task) -> str | None:
    from ..backend import ConveyorBackend

    try:
        backend = task.get_backend()
    except Exception as exc:  # An InvalidTaskBackend of either django.tasks line.
        return f"{path!r} uses the task backend {task.backend!r}, which fails to load: {exc}."
    if not isinstance(backend, ConveyorBackend):
        return (
            f"{path!r} uses the task backend {task.backend!r}, which is not a "
            "ConveyorBackend, so the API cannot enqueue it."
        )
    return None


def build(entries: tuple[str, ...]) -> AllowList:
    tasks: dict[str, Task] = {}
    problems: list[str] = []
    for entry in entries:
        if problem := entry_problem(entry):
            problems.append(problem)
            continue
        module_path, _, name = entry.rpartition(".")
        try:
            if is_pattern(name):
                matched = _tasks_of(importlib.import_module(module_path), entry)
                if not matched:
                    problems.append(f"{entry!r} matches no task in {module_path}.")
                tasks.update(matched)
                continue
            task = import_string(entry)
        except ImportError as exc:
            problems.append(f"{entry!r} cannot be imported: {exc}.")
            continue
        if not isinstance(task, Task):
            problems.append(f"{entry!r} is not a task (decorate it with @task).")
            continue
        tasks[entry] = task
    for path, task in list(tasks.items()):
        if problem := _backend_problem(path, task):
            problems.append(problem)
            del tasks[path]
    return AllowList(entries=entries, tasks=tasks, problems=tuple(problems))


@functools.cache
def _cached(entries: tuple[str, ...]) -> AllowList:
    return build(entries)


def allow_list() -> AllowList:
    return _cached(tuple(conveyor_settings().API_TASKS))
