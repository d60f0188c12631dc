"""`Unique`: at most one job per key among chosen states (docs/unique-jobs.md).

A call's key is computed here, before any SQL: the SHA-256 of the parts
`by` names (the task's path always), the period and the states, as
canonical JSON. The period's bucket is not: ENQUEUE takes it from the
database's clock, so that hosts with skewed clocks agree on it. PostgreSQL
enforces the key with the partial unique index conveyor_job_unique_key_uniq,
whose predicate reads the job's own blocking states (protocol.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .bounds import MAX_SECONDS, breach, is_number
from .compat import InvalidTask
from .exceptions import ArgumentsNotSerializable
from .serialization import to_json

PARTS = ("task", "args", "kwargs", "queue")
# A job that runs comes back to available when it is retried, snoozed or
# reaped: if these did not hold the key, a newer job could take it meanwhile
# and the job would have nowhere to come back to.
REQUIRED_STATES = ("blocked", "available", "running")
OPTIONAL_STATES = ("completed", "failed", "dead", "cancelled")
ON_DUPLICATE = ("skip", "replace")
KEY_LENGTH = 64  # unique_key: a hex SHA-256.
KEY_FORMAT = re.compile(r"[0-9a-f]{64}")  # What a search or a filter by key accepts.


@dataclass(frozen=True, slots=True, kw_only=True)
class Unique:
    """Which calls of a task are one job, for how long, and what a duplicate does.

    Every option is checked here, so a bad one fails where the task is
    defined or `.using()` is called, with `InvalidTask` naming it.
    """

    by: Any = PARTS  # Names of PARTS and at most one callable (called like the task).
    period: int | float | timedelta | None = None  # Whole seconds; None: no period.
    states: Any = REQUIRED_STATES  # States in which an existing job holds the key.
    on_duplicate: str = "skip"  # Or "replace": a job not yet started takes the call's arguments.
    parts: tuple[str, ...] = field(init=False, repr=False, compare=False)
    key_function: Callable[..., Any] | None = field(init=False, repr=False, compare=False)
    seconds: int | None = field(init=False, repr=False, compare=False)
    # What the job's row keeps of it (`uniqueness`): the options that are not the defaults.
    info: dict[str, Any] = field(init=False, repr=False, compare=False)
    # `info` and `states` as JSON, once for every call (a batch may have thousands).
    info_json: str = field(init=False, repr=False, compare=False)
    states_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts, function = _by(self.by)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "key_function", function)
        object.__setattr__(self, "seconds", _seconds(self.period))
        object.__setattr__(self, "states", _states(self.states))
        if not isinstance(self.on_duplicate, str) or self.on_duplicate not in ON_DUPLICATE:
            raise InvalidTask(
                "Unique(on_duplicate=...) must be 'skip' or 'replace', "
                f"not {self.on_duplicate!r:.80}."
            )
        info: dict[str, Any] = {}
        if self.described_by() != list(PARTS):
            info["by"] = self.described_by()
        if self.seconds is not None:
            info["period"] = self.seconds
        if self.replaces:
            info["on_duplicate"] = self.on_duplicate
        object.__setattr__(self, "info", info)
        object.__setattr__(self, "info_json", _CANONICAL.encode(info))
        object.__setattr__(self, "states_json", _CANONICAL.encode(self.states))

    @property
    def replaces(self) -> bool:
        return self.on_duplicate == "replace"

    def described_by(self) -> list[str]:
        """`by` as the job keeps it: the part names, then the callable's dotted name."""
        names = list(self.parts)
        if self.key_function is not None:
            names.append(_dotted(self.key_function))
        return names


def _by(by: Any) -> tuple[tuple[str, ...], Callable[..., Any] | None]:
    items = [by] if isinstance(by, str) or callable(by) else by
    try:
        items = list(items)
    except TypeError:
        raise InvalidTask(
            f"Unique(by=...) takes part names ({_quoted(PARTS)}) and at most one callable, "
            f"not {type(by).__name__} {by!r:.80}."
        ) from None
    if not items:
        raise InvalidTask(f"Unique(by=...) names nothing; give some of {_quoted(PARTS)}.")
    names = {"task"}
    functions = []
    for item in items:
        if isinstance(item, str) and item in PARTS:
            names.add(item)
        elif callable(item) and not isinstance(item, str):
            functions.append(item)
        else:
            raise InvalidTask(
                f"Unique(by=...) takes {_quoted(PARTS)} or a callable, not {item!r:.80}."
            )
    if len(functions) > 1:
        raise InvalidTask("Unique(by=...) takes at most one callable.")
    return tuple(p for p in PARTS if p in names), (functions[0] if functions else None)


def _seconds(period: Any) -> int | None:
    if period is None:
        return None
    value = period.total_seconds() if isinstance(period, timedelta) else period
    if not (
        is_number(value)
        and breach(value, minimum=1, maximum=MAX_SECONDS) is None
        and float(value).is_integer()
    ):
        raise InvalidTask(
            f"Unique(period=...) must be a whole number of seconds from 1 to {MAX_SECONDS:.0f} "
            f"(ten years), or a timedelta of whole seconds, not {period!r:.80}."
        )
    return int(value)


def _states(states: Any) -> tuple[str, ...]:
    items = [states] if isinstance(states, str) else states
    try:
        names = [getattr(s, "value", s) for s in items]
    except TypeError:
        raise InvalidTask(f"Unique(states=...) takes state names, not {states!r:.80}.") from None
    known = (*REQUIRED_STATES, *OPTIONAL_STATES)
    for name in names:
        if name not in known:
            raise InvalidTask(
                f"Unique(states=...) names no job state {name!r:.40}; the states are "
                f"{', '.join(known)}."
            )
    missing = [s for s in REQUIRED_STATES if s not in names]
    if missing:
        raise InvalidTask(
            "Unique(states=...) must contain blocked, available and running (a job that runs "
            f"can come back to available, for a retry); missing: {', '.join(missing)}."
        )
    return tuple(s for s in known if s in names)


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _dotted(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None) or "?"
    return f"{module}.{getattr(function, '__qualname__', type(function).__name__)}"


@dataclass(frozen=True, slots=True)
class Kept:
    """What a job's row says of its key (`uniqueness`), the defaults filled in."""

    by: list[str]  # The parts, then a callable's dotted name.
    period: int | None
    on_duplicate: str
    value: Any  # What the callable of `by` returned (derived from the arguments).
    replaced: int  # Calls whose arguments went into the job.
    replaced_at: str | None  # ISO 8601, the database's time of the last of them.

    @classmethod
    def of(cls, uniqueness: Any) -> Kept:
        """Read leniently: a row written by hand or by another version shows what
        it can, and never fails the page or the listing it is on."""
        info = uniqueness if isinstance(uniqueness, Mapping) else {}
        by = info.get("by", PARTS)
        period, replaced = info.get("period"), info.get("replaced", 0)
        on_duplicate, replaced_at = info.get("on_duplicate", "skip"), info.get("replaced_at")
        return cls(
            by=[str(part) for part in by] if isinstance(by, list) else list(PARTS),
            period=period if _whole(period) and 0 < period <= MAX_SECONDS else None,
            on_duplicate=on_duplicate if on_duplicate in ("skip", "replace") else "skip",
            value=info.get("key"),
            replaced=replaced if _whole(replaced) and replaced >= 0 else 0,
            replaced_at=replaced_at if _timestamp(replaced_at) else None,
        )

    @staticmethod
    def states_of(unique_states: Any) -> list[str]:
        """A row's unique_states as state names; anything else reads as none."""
        if not isinstance(unique_states, list):
            return []
        return [s for s in unique_states if isinstance(s, str)]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _timestamp(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class UniqueCall:
    """One call's uniqueness, as ENQUEUE writes it."""

    key: str  # unique_key: the hex SHA-256 of the parts.
    period: int | None  # Seconds; ENQUEUE computes the bucket (unique_window) from now().
    states: tuple[str, ...]  # unique_states: the index's predicate reads them.
    replace: bool  # on_duplicate == "replace".
    info: dict[str, Any]  # uniqueness: what the key was made of (Unique.info), and the key.
    info_json: str | None = None  # `info` as JSON, when it is the Unique's own.
    states_json: str | None = None  # `states` as JSON.


def unique_call(
    unique: Unique,
    *,
    task_name: str,
    task_path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str,
) -> UniqueCall:
    """The key of one call under `unique`; `args` and `kwargs` after their JSON round trip.

    The key is the SHA-256 of the canonical JSON of an object of the parts.
    Its text is put together here from each part's canonical JSON, in the
    order of their sorted names, which is the same text (tests/test_unique.py
    checks it against the whole object, and pins keys of the release before):
    encoding the whole object for every call cost a batch of unique calls a
    few microseconds each.
    """
    parts = unique.parts
    info, info_json = unique.info, unique.info_json  # Shared unless a callable names the key.
    text = []
    if "args" in parts:
        text.append('"args":' + _CANONICAL.encode(args))
    if unique.key_function is not None:
        value = _key_value(unique.key_function, task_name, args, kwargs)
        text.append('"key":' + _CANONICAL.encode(value))
        info, info_json = {**info, "key": value}, None
    if "kwargs" in parts:
        text.append('"kwargs":' + _CANONICAL.encode(kwargs))
    text.append('"period":' + ("null" if unique.seconds is None else str(unique.seconds)))
    if "queue" in parts:
        text.append('"queue":' + _CANONICAL.encode(queue))
    text.append('"states":' + unique.states_json)
    text.append('"task":' + _CANONICAL.encode(task_path))
    return UniqueCall(
        key=hashlib.sha256(("{" + ",".join(text) + "}").encode()).hexdigest(),
        period=unique.seconds,
        states=unique.states,
        replace=unique.replaces,
        info=info,
        info_json=info_json,
        states_json=unique.states_json,
    )


# One encoder for every key: json.dumps() with options builds a new one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _key_value(
    function: Callable[..., Any], task_name: str, args: list[Any], kwargs: Mapping[str, Any]
) -> Any:
    try:
        value = function(*args, **kwargs)
    except Exception as exc:
        raise InvalidTask(
            f"Unique(by={_dotted(function)}) of {task_name}() raised {type(exc).__name__}: {exc}."
        ) from exc
    try:
        return json.loads(to_json(value, f"The key Unique(by=...) of {task_name}() returned"))
    except ArgumentsNotSerializable as exc:
        raise InvalidTask(str(exc)) from exc


@dataclass(slots=True, eq=False)  # Hashed by identity: a key of the outcomes.
class Entry:
    """Calls of one enqueue batch that get one outcome, as if made one after another.

    `first` is the call whose row is written; `members` are all of them (the
    first included), `replacers` those with on_duplicate="replace", in order.
    """

    first: int
    members: list[int]
    replacers: list[int]

    def arguments_of(self, *, inserting: bool) -> int:
        """Whose arguments the job takes: on insert, the last replacer after the first
        (or the first); on a replace of an existing job, the last replacer."""
        after = [i for i in self.replacers if i != self.first] if inserting else self.replacers
        return after[-1] if after else self.first


def fold(calls: list[tuple[str | None, UniqueCall | None]]) -> list[list[Entry]]:
    """Group a batch's calls, given as (idempotency key, uniqueness) pairs, into rounds.

    A call with the idempotency key of an earlier one joins that call's entry
    (it must be the same call: the caller checks). Calls without an
    idempotency key that share a unique key with the calls just before them
    join them: the first is inserted or meets the key, the rest return its
    job (and a replacer's arguments go into it), as they would one by one.
    A call that carries its own idempotency key is resolved on its own, since
    that key is checked first; so a unique key's entries go in successive
    rounds, each one after the entry before it has its outcome. Calls without
    a unique key are all in the first round.
    """
    rounds: list[list[Entry]] = []
    by_idempotency: dict[str, Entry] = {}
    open_run: dict[str, Entry] = {}  # The entry of a key that later calls may join.
    runs: dict[str, int] = {}  # Entries per unique key so far.
    for index, (idempotency_key, unique) in enumerate(calls):
        key = unique.key if unique is not None else None
        replacer = unique is not None and unique.replace
        if idempotency_key is not None and idempotency_key in by_idempotency:
            by_idempotency[idempotency_key].members.append(index)
            continue
        if key is not None and idempotency_key is None and key in open_run:
            entry = open_run[key]
            entry.members.append(index)
            if replacer:
                entry.replacers.append(index)
            continue
        entry = Entry(index, [index], [index] if replacer else [])
        level = 0
        if key is not None:
            level = runs.get(key, 0)
            runs[key] = level + 1
            if idempotency_key is None:
                open_run[key] = entry
            else:
                open_run.pop(key, None)
        if idempotency_key is not None:
            by_idempotency[idempotency_key] = entry
        while len(rounds) <= level:
            rounds.append([])
        rounds[level].append(entry)
    return rounds
