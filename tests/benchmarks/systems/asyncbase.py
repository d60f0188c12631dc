"""Base for the asyncio peers, whose worker runs in-process: ``adapter.py worker``."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from bench_common import SYSTEMS_DIR

T = TypeVar("T")


class AsyncAdapter:
    name = "async"
    has_burst = True
    finished_sql = ""

    def __init__(self, params: dict[str, Any]) -> None:
        self.url: str = params["database_url"]
        self.params = params
        self.loop = asyncio.new_event_loop()
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SYSTEMS_DIR), os.environ.get("PYTHONPATH", "")) if p
        )
        os.environ["BENCH_DATABASE_URL"] = self.url

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]:
        import json

        params = {
            "database_url": self.url,
            "kind": kind,
            "processes": processes,
            "concurrency": concurrency,
            "burst": burst,
        }
        argv = [sys.executable, sys.argv[0], "worker", json.dumps(params)]
        return [list(argv) for _ in range(processes)]

    def count_finished(self) -> int:
        import psycopg

        with psycopg.connect(self.url) as conn:
            row = conn.execute(self.finished_sql).fetchone()
            return int(row[0]) if row else 0

    def insert_finished(self, n: int) -> None:
        raise NotImplementedError(f"{self.name}: history pre-insert not implemented")

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.run(self.aenqueue([seq], kind))

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        for i in range(0, len(seqs), 1000):
            self.run(self.aenqueue(list(seqs[i : i + 1000]), kind))

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.loop.close()
