"""procrastinate adapter: async tasks, psycopg connector, LISTEN/NOTIFY on."""

from __future__ import annotations

from typing import Any

import bench_common
import procrastinate
from asyncbase import AsyncAdapter

POOL_MAX = 40  # connections per worker process, at most (2 x 40 + the harness < 100)


def build_app(url: str, max_size: int = 10) -> procrastinate.App:
    """The app and its two tasks, bound to this run's database."""
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=max_size)
    )

    @app.task(name="noop", queue="default")
    async def noop(seq: int) -> None:
        await bench_common.noop_job_async(seq)

    @app.task(name="relay", queue="default")
    async def relay(seq: int) -> None:
        await bench_common.relay_job_async(seq)

    return app


class ProcrastinateAdapter(AsyncAdapter):
    name = "procrastinate"
    main_table = "procrastinate_jobs"
    finished_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    pending_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    bulk_description = "task.batch_defer_async(*kwargs)"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        concurrency = int((params.get("setting") or {}).get("concurrency", 8))
        self.app = build_app(self.url, max_size=min(concurrency + 2, POOL_MAX))
        self.run(self.app.open_async())

    def install(self) -> dict[str, Any]:
        self.run(self.app.schema_manager.apply_schema_async())
        return {}

    async def afloor(self, i: int) -> None:
        pool = self.app.connector.pool  # type: ignore[attr-defined]
        async with pool.connection() as conn:
            await conn.execute("INSERT INTO bench_floor (payload) VALUES (%s)", [f"[{i}]"])

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        task = self.app.tasks[kind]
        if len(seqs) == 1:
            await task.defer_async(seq=seqs[0])
        else:
            await task.batch_defer_async(*({"seq": s} for s in seqs))

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        concurrency = int(setting.get("concurrency", 8))
        return {
            "processes": processes,
            "concurrency": concurrency,
            "pool_max_size": min(concurrency + 2, POOL_MAX),
            "listen_notify": True,
            "tasks": "async def",
            "delete_jobs": "never",
        }

    def work(self, p: dict[str, Any]) -> None:
        self.run(
            self.app.run_worker_async(
                queues=["default"],
                concurrency=int(p["setting"].get("concurrency", 8)),
                wait=not p["burst"],
                listen_notify=True,
                install_signal_handlers=True,
                delete_jobs="never",
            )
        )

    def close(self) -> None:
        self.run(self.app.close_async())
        super().close()


if __name__ == "__main__":
    bench_common.main(ProcrastinateAdapter)
