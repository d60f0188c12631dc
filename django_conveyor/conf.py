"""The one place that reads `settings.CONVEYOR`, and the one declaration of each key.

Every key is declared once, as a `Setting` on `ConveyorSettings`: the types
it accepts, its default, its lower bound and what it means. Both readers
derive from that declaration: `conveyor_settings()` converts the user's
dict (every duration to float) and refuses a bad value with a message that
names the key, and `checks.py` reports the same `problems()` as system-check
errors at start-up. `setting_changed` clears the cache so tests can override
the dict.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .bounds import MAX_INT, MAX_SECONDS, Breach, breach
from .exceptions import ConveyorConfigurationError

T = TypeVar("T")

DEFAULT_DATABASE = "default"
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_HEARTBEAT_SECONDS = 10.0
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_REAP_SECONDS = 5.0
DEFAULT_GATES_SECONDS = 1.0
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_CAP_SECONDS = 600.0
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
DEFAULT_API_MAX_BODY_BYTES = 64 * 1024
DEFAULT_VACUUM_DEAD_ROWS = 50_000

SECONDS = (int, float)  # Durations: float seconds, ints accepted (never bool).
NONE = type(None)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with CONVEYOR, as a system check reports it."""

    id: str  # The check id, "conveyor.E0xx".
    msg: str
    hint: str


class Setting(Generic[T]):
    """One key of CONVEYOR: accepted types, default, lower bound, meaning."""

    __slots__ = (
        "bound_id", "convert", "default", "doc", "exclusive", "maximum", "minimum", "name",
        "types",
    )  # fmt: skip

    def __init__(
        self,
        types: tuple[type, ...],
        default: T,
        doc: str,
        *,
        minimum: float | None = None,  # Values below (or at, if exclusive) are refused.
        exclusive: bool = False,
        maximum: float | None = None,  # Values above are refused (NaN and infinity too).
        convert: Callable[[Any], T] | None = None,  # Applied to a valid user value.
        bound_id: str = "conveyor.E004",  # The check id of a value past the bound.
    ) -> None:
        self.types = types
        self.default = default
        self.doc = doc
        self.minimum = minimum
        self.exclusive = exclusive
        self.maximum = maximum
        self.convert = convert
        self.bound_id = bound_id
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, obj: ConveyorSettings, owner: type) -> T: ...
    def __get__(self, obj: ConveyorSettings | None, owner: type) -> Setting[T] | T:
        return self if obj is None else obj._values[self.name]

    @property
    def key(self) -> str:
        return f"CONVEYOR[{self.name!r}]"

    @property
    def hint(self) -> str:
        return f"{self.name}: {self.doc} Default: {self.default!r}."

    def problem(self, value: Any) -> Problem | None:
        """What is wrong with `value` for this key (its type or its bound), or None."""
        # bool is an int to Python, but never a number or a count here.
        if not isinstance(value, self.types) or (
            isinstance(value, bool) and bool not in self.types
        ):
            names = " or ".join("None" if t is NONE else t.__name__ for t in self.types)
            return Problem(
                "conveyor.E003",
                f"{self.key} must be {names}, not {type(value).__name__} {value!r}.",
                self.hint,
            )
        if value is None or (self.minimum is None and self.maximum is None):
            return None
        broken = breach(value, minimum=self.minimum, exclusive=self.exclusive, maximum=self.maximum)
        if broken is None:
            return None
        if broken is Breach.NOT_A_NUMBER:
            bound = "a number"
        elif broken is Breach.BELOW:
            bound = f"more than {self.minimum:g}" if self.exclusive else f"{self.minimum:g} or more"
        else:
            bound = f"at most {self.maximum:.0f}" + (
                " seconds (ten years)" if self.maximum == MAX_SECONDS else ""
            )
        return Problem(self.bound_id, f"{self.key} must be {bound}, not {value!r}.", self.hint)

    def raw(self, values: Mapping[str, Any]) -> Any:
        """The value as the user wrote it, or the default."""
        return values.get(self.name, self.default)

    def value(self, values: Mapping[str, Any]) -> T:
        """The value to use: written or default, converted (durations become float)."""
        value = self.raw(values)
        return self.convert(value) if self.convert else value


def _positive_seconds(default: float, doc: str) -> Setting[float]:
    return Setting[float](
        SECONDS, default, doc, minimum=0, exclusive=True, maximum=MAX_SECONDS, convert=float
    )


class ConveyorSettings:
    """The CONVEYOR dict, validated: one attribute per declared key."""

    __slots__ = ("_values",)

    DATABASE = Setting[str](
        (str,), DEFAULT_DATABASE,
        "the DATABASES alias holding conveyor_job, for every queue not in QUEUE_DATABASES.",
    )  # fmt: skip
    LEASE_SECONDS = _positive_seconds(
        DEFAULT_LEASE_SECONDS, "seconds a claim or a heartbeat keeps a job."
    )
    HEARTBEAT_SECONDS = _positive_seconds(
        DEFAULT_HEARTBEAT_SECONDS, "how often a worker renews its leases (at most half the lease)."
    )
    POLL_SECONDS = _positive_seconds(
        DEFAULT_POLL_SECONDS, "how long an idle worker waits before it looks for jobs again."
    )
    REAP_SECONDS = _positive_seconds(
        DEFAULT_REAP_SECONDS, "how often each worker takes back expired leases."
    )
    GATES_SECONDS = _positive_seconds(
        DEFAULT_GATES_SECONDS,
        "how often each worker fires due timers and gate timeouts and checks wait_until "
        "conditions (docs/workflows.md).",
    )
    SHUTDOWN_TIMEOUT_SECONDS = Setting[float](
        SECONDS, DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
        "seconds running handlers get after SIGTERM before their leases are handed back.",
        minimum=0, maximum=MAX_SECONDS, convert=float,
    )  # fmt: skip
    MAX_ATTEMPTS = Setting[int](
        (int,), DEFAULT_MAX_ATTEMPTS, "attempts per job unless the task sets max_attempts.",
        minimum=1, maximum=MAX_INT,
    )  # fmt: skip
    BACKOFF_BASE_SECONDS = _positive_seconds(
        DEFAULT_BACKOFF_BASE_SECONDS, "ceiling of the first retry's delay; doubles per attempt."
    )
    BACKOFF_CAP_SECONDS = _positive_seconds(
        DEFAULT_BACKOFF_CAP_SECONDS, "no retry waits longer than this."
    )
    PREFETCH = Setting["int | None"](
        (int, NONE), None,
        "jobs claimed beyond the free slots; None adapts to job length, 0 turns it off.",
        minimum=0, maximum=MAX_INT,
    )  # fmt: skip
    NOTIFY = Setting[bool]((bool,), True, "send NOTIFY in the enqueue transaction.")
    LISTEN = Setting[bool]((bool,), True, "keep a LISTEN connection; False polls only.")
    LISTENER_DSN = Setting["str | None"](
        (str, NONE), None, "a libpq connection string for LISTEN alone, bypassing a pooler."
    )
    VACUUM_DEAD_ROWS = Setting["int | None"](
        (int, NONE), DEFAULT_VACUUM_DEAD_ROWS,
        "dead row versions in conveyor_job past which a worker vacuums it; None leaves it "
        "to autovacuum alone.",
        minimum=1000, maximum=MAX_INT,
    )  # fmt: skip
    RETENTION_SECONDS = _positive_seconds(
        DEFAULT_RETENTION_SECONDS, "how long conveyor_prune keeps finished jobs by default."
    )
    QUEUE_DATABASES = Setting["dict[str, str]"](
        (dict,), {}, "sharding: queue name -> the DATABASES alias holding its jobs.",
        convert=dict,
    )  # fmt: skip
    CRON = Setting["dict[str, dict[str, Any]]"](
        (dict,), {}, "periodic jobs: schedule name -> {schedule, task, ...}; see docs/cron.md.",
        convert=dict,
    )  # fmt: skip
    QUEUES = Setting["dict[str, dict[str, Any]]"](
        (dict,), {},
        "flow control: queue name -> {concurrency, rate, key_concurrency, fair}; "
        "see docs/flow-control.md.",
        convert=dict,
    )  # fmt: skip
    API_TASKS = Setting["tuple[str, ...]"](
        (list, tuple), (), "task paths or patterns the HTTP API may enqueue; see docs/api.md.",
        convert=tuple,
    )  # fmt: skip
    API_MAX_BODY_BYTES = Setting[int](
        (int,), DEFAULT_API_MAX_BODY_BYTES, "larger HTTP API request bodies are refused.",
        minimum=1, bound_id="conveyor.E032",
    )  # fmt: skip
    METRICS_ALLOWED_ADDRESSES = Setting["tuple[str, ...]"](
        (list, tuple), (), "addresses or networks that may scrape the metrics without a key.",
        convert=tuple,
    )  # fmt: skip
    # Observability (docs/observability.md).
    JOB_LOG_LEVEL = Setting["int | None"](
        (str, int, NONE), "WARNING",
        "lowest level of the log records kept with each attempt; None keeps none.",
        convert=lambda value: _log_level(value),
    )  # fmt: skip
    SEARCH_SCAN_ROWS = Setting[int](
        (int,), 25_000, "jobs an args./kwargs. search looks at per page, newest first.",
        minimum=1000, maximum=MAX_INT,
    )  # fmt: skip
    TRACING = Setting[bool](
        (bool,), True, "run attempts in OpenTelemetry spans when the [otel] extra is installed."
    )

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    @classmethod
    def declared(cls) -> Iterator[Setting[Any]]:
        """Every declared key, in declaration order."""
        return (v for v in vars(cls).values() if isinstance(v, Setting))

    def database_for(self, queue: str) -> str:
        """The alias whose conveyor_job holds this queue's jobs."""
        return self.QUEUE_DATABASES.get(queue, self.DATABASE)

    def databases(self) -> list[str]:
        """Every alias that holds conveyor tables, DATABASE first."""
        return list(dict.fromkeys([self.DATABASE, *self.QUEUE_DATABASES.values()]))


SETTINGS: dict[str, Setting[Any]] = {s.name: s for s in ConveyorSettings.declared()}


def problems(value: Any, databases: Collection[str] | None = None) -> list[Problem]:
    """Everything wrong with a CONVEYOR value; aliases are checked when `databases` is given."""
    if not isinstance(value, dict):
        return [
            Problem(
                "conveyor.E001",
                f"CONVEYOR must be a dict, not {type(value).__name__}.",
                "Set CONVEYOR to a dict of the keys to change, or remove it for the defaults.",
            )
        ]
    found: list[Problem] = []
    bad: set[str] = set()  # Keys already reported: no cross-key check on them.
    for key, val in value.items():
        setting = SETTINGS.get(key)
        if setting is None:
            found.append(
                Problem(
                    "conveyor.E002",
                    f"CONVEYOR[{key!r}] is not a setting of django-conveyor.",
                    f"Known keys: {', '.join(sorted(SETTINGS))}.",
                )
            )
        elif problem := setting.problem(val):
            found.append(problem)
            bad.add(key)
    found += _timing_problems(value, bad)
    found += _database_problems(value, databases)
    found += _log_level_problems(value, bad)
    return found


def _log_level(value: Any) -> int | None:
    """A level name or number as logging's number; None stays None."""
    if value is None or isinstance(value, int):
        return value
    level = logging.getLevelName(value.upper())
    return level if isinstance(level, int) else None


def _log_level_problems(values: dict[str, Any], bad: set[str]) -> list[Problem]:
    setting = ConveyorSettings.JOB_LOG_LEVEL
    value = values.get(setting.name)
    if setting.name in bad or not isinstance(value, str) or _log_level(value) is not None:
        return []
    return [
        Problem(
            "conveyor.E009",
            f"{setting.key} must be a level of logging (DEBUG, INFO, WARNING, ERROR, CRITICAL, "
            f"or a number) or None, not {value!r}.",
            "Write a level name such as 'WARNING', or None to keep no records.",
        )
    ]


def _timing_problems(values: dict[str, Any], bad: set[str]) -> list[Problem]:
    lease, beat = ConveyorSettings.LEASE_SECONDS, ConveyorSettings.HEARTBEAT_SECONDS
    if {lease.name, beat.name} & bad or not beat.raw(values) * 2 > lease.raw(values):
        return []
    return [
        Problem(
            "conveyor.E006",
            f"{beat.key} ({beat.raw(values)}) must be at most half of {lease.key} "
            f"({lease.raw(values)}), or one late heartbeat loses the lease.",
            "Lower HEARTBEAT_SECONDS or raise LEASE_SECONDS; a third of the lease leaves "
            "room to miss a beat.",
        )
    ]


def _database_problems(values: dict[str, Any], databases: Collection[str] | None) -> list[Problem]:
    found = []
    database = values.get("DATABASE", DEFAULT_DATABASE)
    if databases is not None and isinstance(database, str) and database not in databases:
        found.append(
            Problem(
                "conveyor.E005",
                f"CONVEYOR['DATABASE'] names {database!r}, which is not in DATABASES.",
                "Name an alias of DATABASES, or add that alias.",
            )
        )
    shards = values.get("QUEUE_DATABASES", {})
    for queue, alias in shards.items() if isinstance(shards, dict) else ():
        if not isinstance(queue, str) or not isinstance(alias, str):
            found.append(
                Problem(
                    "conveyor.E007",
                    f"CONVEYOR['QUEUE_DATABASES'] must map queue names to database aliases "
                    f"(strings), not {queue!r}: {alias!r}.",
                    "Write it as {'queue name': 'DATABASES alias', ...}.",
                )
            )
        elif databases is not None and alias not in databases:
            found.append(
                Problem(
                    "conveyor.E008",
                    f"CONVEYOR['QUEUE_DATABASES'][{queue!r}] names {alias!r}, which is not "
                    "in DATABASES.",
                    "Name an alias of DATABASES, or add that alias (and migrate it).",
                )
            )
    return found


def not_postgresql(database: str, engine: str) -> str:
    """conveyor.E020's sentence: the system check, an enqueue and a worker all say it."""
    return f"django-conveyor needs PostgreSQL, but DATABASES[{database!r}] uses {engine!r}."


def written() -> Any:
    """The user's CONVEYOR value exactly as written (an empty dict when unset)."""
    return getattr(django_settings, "CONVEYOR", {})


def raw_settings() -> dict[str, Any]:
    """The user's CONVEYOR dict as written, unvalidated ({} unless it is a dict)."""
    value = written()
    return dict(value) if isinstance(value, dict) else {}


# Values no code could run with; the rest (unknown keys, missing aliases, the
# heartbeat/lease ratio) are reported by the system checks alone.
REFUSED_AT_RUNTIME = frozenset(
    {
        "conveyor.E001",
        "conveyor.E003",
        "conveyor.E004",
        "conveyor.E007",
        "conveyor.E009",
        "conveyor.E032",
    }
)


@functools.cache
def conveyor_settings() -> ConveyorSettings:
    """The validated settings; a bad value raises, naming the key, even without checks."""
    refused = [p for p in problems(written()) if p.id in REFUSED_AT_RUNTIME]
    if refused:
        raise ConveyorConfigurationError(" ".join(p.msg for p in refused))
    raw = raw_settings()
    return ConveyorSettings({s.name: s.value(raw) for s in SETTINGS.values()})


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in {"CONVEYOR", "DATABASES"}:
        conveyor_settings.cache_clear()
