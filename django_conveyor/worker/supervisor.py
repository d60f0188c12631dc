"""`--processes N`: fork N worker processes, forward signals, restart the dead.

Children are forked after Django is set up and before any connection is
open, so each opens its own connections. A child that dies unexpectedly is
restarted (with a growing delay if it keeps dying); its leases expire and are
reaped, so no job is lost with it. A child that stopped cleanly on its own
(a SIGTERM sent to it alone, `--max-tasks`) is replaced at once.

Signals. The first SIGTERM or SIGINT the supervisor receives becomes one
SIGTERM to every child: a graceful stop. A signal sent to the whole process
group reaches each child twice (from the sender and from the supervisor);
a child treats every SIGTERM as the same graceful stop (shutdown.py), so
that double delivery can never turn into a hard stop. The hard stop is
the supervisor's decision: SIGQUIT, or a stop signal repeated after
shutdown.REPEAT_GRACE_SECONDS, is relayed to every child as SIGQUIT, and
the supervisor exits with 128 + the signal number it received.
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
from .shutdown import HARD_STOP_SIGNAL, is_hard_stop

logger = logging.getLogger(__name__)

HEALTHY_AFTER_SECONDS = 30.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HANDLED_SIGNALS = (*STOP_SIGNALS, HARD_STOP_SIGNAL)


class Supervisor:
    def __init__(self, processes: int, run_child: Callable[[int], int], *, burst: bool) -> None:
        self.processes = processes
        self.run_child = run_child
        self.burst = burst
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (slot, started)
        self.restarts: dict[int, Ladder] = {}  # slot -> its restart delays
        self.stopping = False
        self.stop_requested_at: float | None = None  # time.monotonic() of the first stop.
        self.told: int | None = None  # The signal every child gets once stopping.
        self.exit_code = 0

    def run(self) -> int:
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self.on_signal)
        for slot in range(self.processes):
            if self.stopping:
                break
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
        # Until the child's worker installs its handlers (StopSignals.install
        # unblocks them), a stop signal waits instead of killing it or running
        # the supervisor's handler in the child.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                self.child(slot)
            # Known before a stop that waited for the fork is handled, so it is told too.
            self.children[pid] = (slot, time.monotonic())
            if self.told is not None:  # A stop handled while this child was being forked.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self.told)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
        logger.info("started worker process %d (slot %d)", pid, slot)

    def child(self, slot: int) -> None:
        code = 1
        try:
            # Ctrl-C reaches the whole process group; only the supervisor
            # acts on it, and it tells each child once, with SIGTERM.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for signum in (signal.SIGTERM, HARD_STOP_SIGNAL):
                signal.signal(signum, signal.SIG_DFL)
            code = self.run_child(slot)
        except BaseException:
            logger.exception("worker process crashed")
        finally:
            os._exit(code)

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
        if clean:
            logger.info("worker process %d stopped (exit 0); starting a replacement", pid)
            self.spawn(slot)
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
        name = signal.Signals(signum).name
        if is_hard_stop(signum, self.stop_requested_at):
            self.stopping = True
            self.exit_code = 128 + signum
            logger.warning(
                "%s received: hard stop of %d worker processes", name, len(self.children)
            )
            self.tell_children(HARD_STOP_SIGNAL)
            return
        if self.stop_requested_at is not None:
            logger.info("%s received again: already stopping (a repeat is the same stop)", name)
            return
        self.stopping = True
        self.stop_requested_at = time.monotonic()
        logger.info("%s received: stopping %d worker processes", name, len(self.children))
        self.tell_children(signal.SIGTERM)

    def tell_children(self, signum: int) -> None:
        self.told = signum  # Also for a child forked from now on (spawn).
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
