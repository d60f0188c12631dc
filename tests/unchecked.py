"""Turn off the checks before SQL for `unchecked_poison` jobs, so PostgreSQL itself refuses them.

The worker checks what it can before SQL (serialization.py, attempts.error_entry);
this lets a test, or a fault run's workers, send a value PostgreSQL refuses all
the same, to prove that a refused row fails its own job and nothing else.
Installed by tests.testapp when CONVEYOR_TEST_UNCHECKED is set, or by a test.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from django_conveyor.worker.handlers import executor

UNCHECKED_TASK = "unchecked_poison"
UNCHECKED_MESSAGE = "unchecked:"


def raw_round_trip(value: Any, what: str, checked: Any = executor.json_round_trip) -> Any:
    if what.startswith(f"{UNCHECKED_TASK}()"):
        return json.loads(json.dumps(value))  # NUL survives: PostgreSQL will refuse it.
    return checked(value, what)


def raw_error_entry(exc: BaseException, note: str = "", checked: Any = executor.error_entry):
    if str(exc).startswith(UNCHECKED_MESSAGE):
        cls = type(exc)
        return {
            "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
            "traceback": "".join(traceback.format_exception(exc)),
        }
    return checked(exc, note)


def install() -> None:
    executor.json_round_trip = raw_round_trip
    executor.error_entry = raw_error_entry


def install_for(monkeypatch: Any) -> None:
    """The same for one test (pytest's monkeypatch undoes it)."""
    monkeypatch.setattr(executor, "json_round_trip", raw_round_trip)
    monkeypatch.setattr(executor, "error_entry", raw_error_entry)
