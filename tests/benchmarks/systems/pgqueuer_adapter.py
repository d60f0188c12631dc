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

DRAIN_BATCH = 10


class PgqueuerAdapter(AsyncAdapter):
    name = "pgqueuer"
    finished_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.conn: asyncpg.Connection | None = None

    async def queries(self) -> Queries:
        if self.conn is None:
            self.conn = await asyncpg.connect(self.url)
        return Queries(AsyncpgDriver(self.conn))

    def install(self) -> dict[str, Any]:
        async def go() -> None:
            await (await self.queries()).install()

        self.run(go())
        return {}

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        q = await self.queries()
        if len(seqs) == 1:
            await q.enqueue(kind, str(seqs[0]).encode())
        else:
            await q.enqueue([kind] * len(seqs), [str(s).encode() for s in seqs], [0] * len(seqs))

    @staticmethod
    def layout(kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        if kind == "noop":  # I/O-light: unlimited in-flight, default-ish batches
            return {"batch_size": DRAIN_BATCH, "concurrency_limit": 0}
        # relay: total slots enforced in SQL, one batch fills a process's slots
        return {"batch_size": concurrency, "concurrency_limit": processes * concurrency}

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "processes": processes,
            "driver": "asyncpg",
            "entrypoints": "async def",
            "bulk_enqueue": "Queries.enqueue(list, ...) (1,000 per call)",
            **self.layout(kind, processes, concurrency),
        }

    def work(self, p: dict[str, Any]) -> None:
        knobs = self.layout(p["kind"], int(p["processes"]), int(p["concurrency"]))

        async def go() -> None:
            conn = await asyncpg.connect(self.url)
            pgq = PgQueuer(AsyncpgDriver(conn))
            handler = (
                bench_common.noop_job_async if p["kind"] == "noop" else bench_common.relay_job_async
            )

            async def entry(job: Job) -> None:
                await handler(int(job.payload or b"0"))

            pgq.entrypoint(p["kind"], concurrency_limit=knobs["concurrency_limit"])(entry)
            for sig in (signal.SIGTERM, signal.SIGINT):  # graceful stop on SIGTERM
                asyncio.get_running_loop().add_signal_handler(sig, pgq.shutdown.set)
            mode = QueueExecutionMode.drain if p["burst"] else QueueExecutionMode.continuous
            await pgq.run(batch_size=knobs["batch_size"], mode=mode)

        self.run(go())

    def close(self) -> None:
        if self.conn is not None:
            self.run(self.conn.close())
        super().close()


if __name__ == "__main__":
    bench_common.main(PgqueuerAdapter)
