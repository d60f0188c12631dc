"""Per-attempt logs: the records a handler emits, kept with its attempt.

One `logging.Handler` on the root logger (`install`, by the worker) sends
each record to the attempt whose handler runs in the record's context: a
context variable holds that attempt while the executor calls the handler
(`attempt_log`), and its buffer is made at the first record kept. asgiref's
async_to_sync copies the context into an async handler's event loop, and
asyncio copies it into the tasks the handler starts, so their records count
too; a thread the handler starts with `threading.Thread` has a context of
its own, and another slot's records go to that slot's attempt: no record
reaches another job's log.

The buffer is bounded (`MAX_LOG_BYTES` of message text, then records are
counted, not kept); `seal()` freezes it when the outcome is decided, and the
outcome's transaction writes it (`protocol.ATTEMPT_LOG`) only if the fence
accepted the outcome. An attempt that logs nothing allocates nothing.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from datetime import UTC, datetime
from typing import Any

from ..serialization import storable_text

MAX_LOG_BYTES = 64 * 1024  # Of message text per attempt; the rest is counted.
MAX_RECORD_CHARS = 8 * 1024  # One record's message (with its traceback).

# The attempt (an object with `log` and `lease`) whose handler runs in this context.
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("conveyor_attempt", default=None)
_making = threading.Lock()  # Two threads of one attempt's context make one buffer.


class AttemptLog:
    """The records of one attempt, appended from any thread of its context."""

    __slots__ = ("_lock", "dropped", "records", "sealed", "size")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.size = 0  # Characters of message text kept.
        self.dropped = 0  # Records past the bound, or after the seal.
        self.sealed = False

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self.sealed or self.size + len(record["message"]) > MAX_LOG_BYTES:
                self.dropped += 1
                return
            self.size += len(record["message"])
            self.records.append(record)

    def seal(self) -> AttemptLog:
        """No more records: the outcome that carries this log has been decided."""
        with self._lock:
            self.sealed = True
        return self


class Capture(logging.Handler):
    """The root logger's handler: each record to the attempt of its context, if any.

    It must not change what the process prints: a record no other handler
    would see goes to `logging.lastResort` as if this handler were not there
    (Python only uses it when no handler at all is found, so without this an
    unconfigured library's errors would vanish from stderr once a worker ran).
    """

    def __init__(self, level: int) -> None:
        super().__init__(logging.NOTSET)  # Every record, for the last resort; ours at `level`.
        self.capture_level = level

    def emit(self, record: logging.LogRecord) -> None:
        last_resort = logging.lastResort
        if last_resort is not None and record.levelno >= last_resort.level and self._alone(record):
            last_resort.handle(record)
        held = _current.get()
        if held is None or record.levelno < self.capture_level:
            return
        log = held.log
        if log is None:
            with _making:
                log = held.log
                if log is None:
                    log = held.log = AttemptLog()
        try:
            message = self.format(record)
        except Exception:  # A record whose arguments do not format: never the handler's fault.
            message = f"{record.msg!r} (its arguments did not format)"
        log.add(
            {
                "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
                "level": record.levelname,
                "logger": record.name,
                "message": storable_text(message[:MAX_RECORD_CHARS]),
            }
        )

    def _alone(self, record: logging.LogRecord) -> bool:
        """No handler but this one is on the record's way up (Logger.callHandlers' walk)."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return False
            logger = logger.parent if logger.propagate else None
        return True


_installed: Capture | None = None


def install(level: int | None) -> None:
    """Capture records at `level` and above for the attempts of this process; None: off."""
    global _installed
    uninstall()
    if level is None:
        return
    _installed = Capture(level)
    _installed.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(_installed)


def uninstall() -> None:
    """Stop capturing (the worker stopped)."""
    global _installed
    if _installed is not None:
        logging.getLogger().removeHandler(_installed)
        _installed = None


class attempt_log:
    """Records emitted in this context belong to `held`'s attempt while the block runs.

    A class, not a generator: it runs once per attempt on the hot path.
    """

    __slots__ = ("held", "token")

    def __init__(self, held: Any) -> None:
        self.held = held
        self.token: contextvars.Token[Any] | None = None

    def __enter__(self) -> None:
        if _installed is not None:
            self.held.log = None  # A buffer from an earlier run of the same object.
            self.token = _current.set(self.held)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _current.reset(self.token)


def row(held: Any) -> dict[str, Any] | None:
    """The sealed log of an attempt, as ATTEMPT_LOG writes it; None when it kept nothing."""
    log = held.log
    if log is None:
        return None
    log.seal()
    if not log.records and not log.dropped:
        return None
    lease = held.lease
    return {
        "id": lease.id,
        "version": lease.version,
        "records": log.records,
        "dropped": log.dropped,
    }
