"""pgqueuer adapter: asyncpg driver, async entrypoints, batched dequeue."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import asyncpg
import bench_common
from asyncbase import AsyncAdapter
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode


class PgqueuerAdapter(AsyncAdapter):
    name = "pgqueuer"
    main_table = "pgqueuer"
    finished_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    # a finished job is deleted from the queue table (and logged) in one statement
    pending_sql = "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')"
    bulk_description = "Queries.enqueue(lists of entrypoints, payloads, priorities)"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.conn: asyncpg.Connection | None = None
        self._queries: Queries | None = None

    async def queries(self) -> Queries:
        """One connection and one Queries object for every call (built once)."""
        if self._queries is None:
            self.conn = await asyncpg.connect(self.url)
            self._queries = Queries(AsyncpgDriver(self.conn))
        return self._queries

    def install(self) -> dict[str, Any]:
        async def go() -> None:
            await (await self.queries()).install()

        self.run(go())
        return {}

    async def afloor(self, i: int) -> None:
        await self.queries()  # the connection Queries uses
        assert self.conn is not None
        await self.conn.execute("INSERT INTO bench_floor (payload) VALUES ($1)", f"[{i}]")

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        q = await self.queries()
        if len(seqs) == 1:
            await q.enqueue(kind, str(seqs[0]).encode())
        else:
            await q.enqueue([kind] * len(seqs), [str(s).encode() for s in seqs], [0] * len(seqs))

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        return {
            "processes": processes,
            "driver": "asyncpg",
            "entrypoints": "async def",
            "batch_size": setting.get("batch_size", 10),
            "concurrency_limit": setting.get("concurrency_limit", 0) or "unlimited",
            "mode": "drain (burst) / continuous",
        }

    def work(self, p: dict[str, Any]) -> None:
        setting = p["setting"]

        async def go() -> None:
            conn = await asyncpg.connect(self.url)
            pgq = PgQueuer(AsyncpgDriver(conn))
            handler = (
                bench_common.noop_job_async if p["kind"] == "noop" else bench_common.relay_job_async
            )

            async def entry(job: Job) -> None:
                await handler(int(job.payload or b"0"))

            pgq.entrypoint(p["kind"], concurrency_limit=int(setting.get("concurrency_limit", 0)))(
                entry
            )
            for sig in (signal.SIGTERM, signal.SIGINT):  # graceful stop on SIGTERM
                asyncio.get_running_loop().add_signal_handler(sig, pgq.shutdown.set)
            mode = QueueExecutionMode.drain if p["burst"] else QueueExecutionMode.continuous
            await pgq.run(batch_size=int(setting.get("batch_size", 10)), mode=mode)

        self.run(go())

    def close(self) -> None:
        if self.conn is not None:
            self.run(self.conn.close())
        super().close()


if __name__ == "__main__":
    bench_common.main(PgqueuerAdapter)
