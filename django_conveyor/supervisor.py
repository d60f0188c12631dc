"""`--processes N`: fork N worker processes, forward signals, restart the dead.

Children are forked after Django is set up and before any connection is
open, so each opens its own connections. A child that dies unexpectedly is
restarted (with a growing delay if it keeps dying); its leases expire and are
reaped, so no job is lost with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

from django.db import connections

from .backoff import RESTART_SECONDS, Ladder

logger = logging.getLogger("django_conveyor.supervisor")

HEALTHY_AFTER_SECONDS = 30.0


class Supervisor:
    def __init__(self, processes: int, run_child: Callable[[int], int], *, burst: bool) -> None:
        self.processes = processes
        self.run_child = run_child
        self.burst = burst
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (slot, started)
        self.restarts: dict[int, Ladder] = {}  # slot -> its restart delays
        self.stopping = False
        self.signals_seen = 0
        self.exit_code = 0

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        for slot in range(self.processes):
            self.spawn(slot)
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            self.reap_child(pid, status)
        logger.info("supervisor exiting with %d", self.exit_code)
        return self.exit_code

    def spawn(self, slot: int) -> None:
        connections.close_all()  # Never share a connection across fork.
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # Ctrl-C reaches the whole process group; only the supervisor
                # acts on it, and it tells each child once, with SIGTERM.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                code = self.run_child(slot)
            except BaseException:
                logger.exception("worker process crashed")
            finally:
                os._exit(code)
        self.children[pid] = (slot, time.monotonic())
        logger.info("started worker process %d (slot %d)", pid, slot)

    def reap_child(self, pid: int, status: int) -> None:
        slot, started = self.children.pop(pid, (None, 0.0))
        if slot is None:
            return
        code = os.waitstatus_to_exitcode(status)
        clean = code == 0
        if self.stopping or (self.burst and clean):
            # A child that ends badly while stopping fails the whole run; one
            # that died earlier and was restarted does not.
            if not clean:
                self.exit_code = self.exit_code or 1
            logger.info("worker process %d exited with %d", pid, code)
            return
        restarts = self.restarts.setdefault(slot, Ladder(RESTART_SECONDS))
        if time.monotonic() - started > HEALTHY_AFTER_SECONDS:
            restarts.reset()  # A healthy child is replaced at once.
            delay = 0.0
        else:
            delay = restarts.next_delay()
        logger.warning("worker process %d died (exit %d); restarting in %.1fs", pid, code, delay)
        time.sleep(delay)
        if not self.stopping:
            self.spawn(slot)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_seen += 1
        self.stopping = True
        logger.info(
            "%s received: stopping %d worker processes",
            signal.Signals(signum).name,
            len(self.children),
        )
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
