"""What a worker runs with: the options it is given, completed from the settings.

`WorkerOptions` is what the command line (or a caller) asks for; None means
the CONVEYOR setting. `WorkerConfig.resolve` fills in every unset value and
refuses what no worker can run with, naming the option.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
from dataclasses import dataclass
from typing import TypeVar

from ..bounds import MAX_INT, MAX_SECONDS, count_breach, is_count, is_number, seconds_breach
from ..conf import conveyor_settings
from ..exceptions import ConveyorConfigurationError
from .instrument import Instrument
from .services.heartbeat import interval_for

MAX_CONCURRENCY = 1024  # Handler slots (threads) one process may run.
T = TypeVar("T")


def worker_database(queues: tuple[str, ...]) -> str:
    """The one database a worker's queues live in (a worker never spans shards)."""
    settings = conveyor_settings()
    by_alias: dict[str, list[str]] = {}
    for queue_name in queues:
        by_alias.setdefault(settings.database_for(queue_name), []).append(queue_name)
    if len(by_alias) > 1:
        spread = "; ".join(f"{', '.join(q)} on {a!r}" for a, q in sorted(by_alias.items()))
        raise ConveyorConfigurationError(
            f"A worker serves queues of one database, but these span several: {spread}. "
            "Run one worker per database."
        )
    return next(iter(by_alias), settings.DATABASE)


def new_worker_id() -> str:
    """Unique per process incarnation, so a restarted worker never shares a token owner."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """What the command line (or a caller) asks for; None means the CONVEYOR setting."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    lease_seconds: float | None = None  # CONVEYOR["LEASE_SECONDS"]
    shutdown_timeout: float | None = None  # CONVEYOR["SHUTDOWN_TIMEOUT_SECONDS"]
    burst: bool = False  # Exit 0 once nothing is ready and nothing is held.
    listen: bool | None = None  # CONVEYOR["LISTEN"]; False polls only.
    poll_seconds: float | None = None  # CONVEYOR["POLL_SECONDS"]
    prefetch: int | None = None  # CONVEYOR["PREFETCH"]
    max_jobs: int | None = None  # Exit after this many attempts finished.
    worker_id: str | None = None  # A new host:pid:random id.
    cron: bool = True  # Run the scheduler service (periodic jobs); --no-cron turns it off.
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
    supervised: bool = False  # A child of --processes: its supervisor decides on a hard stop.
    instrument: Instrument | None = None  # Metrics hook; None reports nothing.


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """The options with every unset value taken from the settings: what the worker runs with."""

    queues: tuple[str, ...]
    concurrency: int
    database: str  # The alias of every queue served.
    worker_id: str
    lease_seconds: float
    heartbeat_seconds: float
    reap_seconds: float
    gates_seconds: float
    shutdown_timeout: float
    poll_seconds: float
    prefetch: int | None  # None adapts to job length.
    listen: bool
    listener_dsn: str | None
    vacuum_dead_rows: int | None  # None: autovacuum alone (vacuum.py).

    @classmethod
    def resolve(cls, options: WorkerOptions) -> WorkerConfig:
        """The options completed from the settings; refuses values no worker can run with.

        The command's flags are checked by argparse already; this catches the
        same mistakes from code (and from processes that skip system checks).
        """
        settings = conveyor_settings()
        database = worker_database(options.queues)
        _check_count("concurrency", options.concurrency, 1, MAX_CONCURRENCY)
        if options.prefetch is not None:
            _check_count("prefetch", options.prefetch, 0, MAX_INT)
        for name in ("lease_seconds", "poll_seconds", "shutdown_timeout"):
            _check_seconds(name, getattr(options, name), zero=name == "shutdown_timeout")
        lease_seconds = _given(options.lease_seconds, settings.LEASE_SECONDS)
        return cls(
            queues=tuple(options.queues),
            concurrency=options.concurrency,
            database=database,
            worker_id=options.worker_id or new_worker_id(),
            lease_seconds=lease_seconds,
            heartbeat_seconds=interval_for(lease_seconds, settings.HEARTBEAT_SECONDS),
            reap_seconds=settings.REAP_SECONDS,
            gates_seconds=settings.GATES_SECONDS,
            shutdown_timeout=_given(options.shutdown_timeout, settings.SHUTDOWN_TIMEOUT_SECONDS),
            poll_seconds=_given(options.poll_seconds, settings.POLL_SECONDS),
            prefetch=_given(options.prefetch, settings.PREFETCH),
            listen=_given(options.listen, settings.LISTEN),
            # The listener DSN reaches CONVEYOR["DATABASE"]; shard workers use their own.
            listener_dsn=settings.LISTENER_DSN if database == settings.DATABASE else None,
            vacuum_dead_rows=settings.VACUUM_DEAD_ROWS,
        )


def _given(option: T | None, setting: T) -> T:
    return setting if option is None else option


def _check_count(name: str, value: object, low: int, high: int) -> None:
    if not is_count(value) or count_breach(value, low, high):
        raise ConveyorConfigurationError(
            f"The worker's {name} must be a whole number from {low} to {high}, not {value!r}."
        )


def _check_seconds(name: str, value: object, *, zero: bool) -> None:
    """None (the setting applies) or a finite number of seconds PostgreSQL can add to now()."""
    if value is None:
        return
    if not is_number(value) or seconds_breach(value, zero=zero):
        low = "zero or more" if zero else "more than zero"
        raise ConveyorConfigurationError(
            f"The worker's {name} must be a number of seconds, {low} and at most "
            f"{MAX_SECONDS:.0f} (ten years), not {value!r}."
        )
