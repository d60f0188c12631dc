"""Wakes a worker when a job is enqueued in one of its queues.

NOTIFY is an optimisation, never the correctness mechanism: a lost
notification only costs up to one poll interval, so errors here are logged
and the listener reconnects while the worker keeps polling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg

from ..protocol import NOTIFY_CHANNEL
from .backoff import LISTENER_RECONNECT_SECONDS, Ladder
from .connections import connect

logger = logging.getLogger("django_conveyor.listener")


class Listener(threading.Thread):
    def __init__(
        self,
        *,
        database: str,
        dsn: str | None,
        queues: frozenset[str],
        wake: Callable[[], None],
        stopping: threading.Event,
    ) -> None:
        super().__init__(name="conveyor-listener", daemon=True)
        self.database = database
        self.dsn = dsn
        self.queues = queues
        self.wake = wake
        self.stopping = stopping
        self.notifications = 0

    def run(self) -> None:
        backoff = Ladder(LISTENER_RECONNECT_SECONDS)
        while not self.stopping.is_set():
            try:
                self.listen()
                backoff.reset()
            except psycopg.Error as exc:
                delay = backoff.next_delay()
                logger.warning("listener lost its connection (%s); retrying in %.1fs", exc, delay)
                self.wake()  # Anything may have been enqueued meanwhile: poll now.
                self.stopping.wait(delay)

    def listen(self) -> None:
        with connect(self.database, dsn=self.dsn, prepare=False) as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            logger.debug("listening on channel %s", NOTIFY_CHANNEL)
            self.wake()
            while not self.stopping.is_set():
                for notify in conn.notifies(timeout=1.0):
                    if notify.payload in self.queues:
                        self.notifications += 1
                        self.wake()
                    if self.stopping.is_set():
                        return
                time.sleep(0)  # Let the GIL go between bursts.
