"""Base for the asyncio peers, whose worker runs in-process: ``adapter.py worker``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from bench_common import SYSTEMS_DIR
from djsystems import FLOOR_TABLE, StoreQueries

T = TypeVar("T")


class AsyncAdapter(StoreQueries):
    name = "async"
    has_burst = True
    floor_description = (
        f"INSERT INTO {FLOOR_TABLE} (payload jsonb) on the system's own connection "
        "(autocommit: one round trip, one commit)"
    )
    bulk_description = "the system's bulk API"

    def __init__(self, params: dict[str, Any]) -> None:
        self.url: str = params["database_url"]
        self.params = params
        self.loop = asyncio.new_event_loop()
        self._sync: Any = None
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SYSTEMS_DIR), os.environ.get("PYTHONPATH", "")) if p
        )
        os.environ["BENCH_DATABASE_URL"] = self.url

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]:
        params = {
            "database_url": self.url,
            "kind": kind,
            "processes": processes,
            "setting": setting,
            "burst": burst,
        }
        argv = [sys.executable, sys.argv[0], "worker", json.dumps(params)]
        return [list(argv) for _ in range(processes)]

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
        """A separate psycopg connection for the harness's own queries."""
        import psycopg

        if self._sync is None:
            self._sync = psycopg.connect(self.url, autocommit=True)
        cur = self._sync.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []

    def floor_insert(self, i: int) -> None:
        self.run(self.afloor(i))

    async def afloor(self, i: int) -> None:
        raise NotImplementedError

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.run(self.aenqueue([seq], kind))

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        self.run(self.aenqueue(list(seqs), kind))

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        self.loop.close()
