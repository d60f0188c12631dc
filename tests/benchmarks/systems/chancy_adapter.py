"""chancy adapter: AsyncExecutor queue with eager polling (no drain mode)."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import bench_common
from asyncbase import AsyncAdapter
from chancy import Chancy, Job, Queue, Worker

FUNCS = {"noop": bench_common.noop_job_async, "relay": bench_common.relay_job_async}


class ChancyAdapter(AsyncAdapter):
    name = "chancy"
    has_burst = False
    main_table = "chancy_jobs"
    finished_sql = "SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'"
    pending_sql = "SELECT count(*) FROM chancy_jobs WHERE state NOT IN ('succeeded', 'failed')"
    bulk_description = "chancy.push_many(jobs)"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        quiet = logging.getLogger("bench.chancy")
        quiet.setLevel(logging.WARNING)  # per-job INFO lines would tax chancy alone
        self.chancy = Chancy(self.url, log=quiet)
        self.run(self.chancy.__aenter__())

    def install(self) -> dict[str, Any]:
        self.run(self.chancy.migrate())
        self.run(self.chancy.declare(self.queue(1), upsert=True))
        return {}

    @staticmethod
    def queue(concurrency: int) -> Queue:
        return Queue(
            "default",
            concurrency=concurrency,
            executor=Chancy.Executor.Async,
            polling_interval=1,
            eager_polling=True,
        )

    async def afloor(self, i: int) -> None:
        async with self.chancy.pool.connection() as conn:
            await conn.execute("INSERT INTO bench_floor (payload) VALUES (%s)", [f"[{i}]"])

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        base = Job.from_func(FUNCS[kind], queue="default")
        if len(seqs) == 1:
            await self.chancy.push(base.with_kwargs(seq=seqs[0]))
        else:
            async for _refs in self.chancy.push_many([base.with_kwargs(seq=s) for s in seqs]):
                pass

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        return {
            "processes": processes,
            "queue_concurrency": int(setting.get("concurrency", 10)),
            "executor": "AsyncExecutor",
            "polling_interval_s": 1,
            "eager_polling": True,
            "notifications": True,
        }

    def work(self, p: dict[str, Any]) -> None:
        async def go() -> None:
            await self.chancy.declare(
                self.queue(int(p["setting"].get("concurrency", 10))), upsert=True
            )
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            async with Worker(self.chancy, register_signal_handlers=False):
                await stop.wait()

        self.run(go())

    def close(self) -> None:
        self.run(self.chancy.__aexit__(None, None, None))
        super().close()


if __name__ == "__main__":
    bench_common.main(ChancyAdapter)
