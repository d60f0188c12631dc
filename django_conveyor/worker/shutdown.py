"""What SIGTERM and SIGINT do to a worker process, and its graceful shutdown.

The first signal stops the control loop (`Worker.stop`), which then drains
(`Worker.drain` and `Worker.hand_back`, in loop.py):

1. jobs claimed but not yet started are handed back at once;
2. running handlers get up to the shutdown timeout to finish; their
   outcomes are written and the heartbeat keeps their leases meanwhile;
3. whatever still runs after that is handed back.

A hand-back is a RELEASE outcome, written like any other (guarded by the
token): the job is `available` again at once, and the attempt does not
count. A job inside its `context.atomic()` keeps its row lock and is left
to its block; a job whose block committed is completed, not handed back.

Python cannot stop a thread, so a handler that ignores its timeout (a
sleep loop, a busy loop, a CPU loop inside an async handler's event loop)
may still run once its lease is handed back. It does not keep the process
alive: the command then ends it (`Worker.run_to_exit`), without waiting for
handler threads, so the first signal ends a worker within about the
shutdown timeout, whatever its handlers do.

A repeat of a stop signal within REPEAT_GRACE_SECONDS of the first is the
same stop: a signal sent to a whole process group (systemd's control group,
supervisord's stopasgroup, `kill -TERM -<pgid>`, a terminal's Ctrl-C)
reaches a process next to another party that forwards it too, so one stop
often arrives twice. A hard stop exits at once with 128 + the signal
number: nothing is handed back, the leases expire and are reaped. It is
SIGQUIT (Ctrl-\\ in a terminal), or a stop signal repeated after the grace
interval. A child of `--processes` never takes a repeat for a hard stop:
its supervisor (supervisor.py) decides, and relays a hard stop as SIGQUIT.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

logger = logging.getLogger(__name__)

REPEAT_GRACE_SECONDS = 2.0  # A repeated stop signal this soon is the same stop.
HARD_STOP_SIGNAL = signal.SIGQUIT  # Always a hard stop, whoever sends it.


class StopSignals:
    """First stop signal: stop gracefully. A hard stop: SIGQUIT, or a late repeat.

    With `repeat_is_hard=False` (a supervised child) a repeated stop signal
    is never a hard stop, however late; only SIGQUIT is.
    """

    def __init__(
        self, stop: Callable[[], None], signals: tuple[int, ...], *, repeat_is_hard: bool = True
    ) -> None:
        self.stop = stop
        self.signals = signals
        self.repeat_is_hard = repeat_is_hard
        self.first_at: float | None = None  # time.monotonic() of the first stop signal.

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Signal handlers can only be set from the main thread.
        handled = (*self.signals, HARD_STOP_SIGNAL) if self.signals else ()
        for signum in handled:
            signal.signal(signum, self.on_signal)
        # A supervisor forks its children with these blocked, so that a stop
        # sent before the handlers exist waits for them instead of killing.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if is_hard_stop(signum, self.first_at, repeat_is_hard=self.repeat_is_hard):
            # Leases we hold expire and are reaped.
            os.write(2, f"conveyor worker: {name}: hard stop, exiting now\n".encode())
            os._exit(128 + signum)
        if self.first_at is not None:
            logger.info("%s received again: already stopping (a repeat is the same stop)", name)
            return
        self.first_at = time.monotonic()
        logger.info("%s received: finishing in-flight jobs", name)
        self.stop()


def is_hard_stop(signum: int, first_at: float | None, *, repeat_is_hard: bool = True) -> bool:
    """SIGQUIT, or a stop signal repeated after the grace interval (when repeats count)."""
    if signum == HARD_STOP_SIGNAL:
        return True
    if first_at is None or not repeat_is_hard:
        return False
    return time.monotonic() - first_at >= REPEAT_GRACE_SECONDS


def exit_process(code: int, handlers: int) -> NoReturn:
    """End the process now, leaving handler threads that are still running.

    A normal exit would wait for them: the thread running an async handler's
    event loop is joined at interpreter exit, so a CPU loop there would keep
    the process alive for ever. Their leases were handed back already.
    """
    logger.warning(
        "%d handler(s) still running after their leases were given up; exiting without them",
        handlers,
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
