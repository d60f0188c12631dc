"""procrastinate adapter: async tasks, psycopg connector, LISTEN/NOTIFY on."""

from __future__ import annotations

from typing import Any

import bench_common
import procrastinate
from asyncbase import AsyncAdapter


def build_app(url: str) -> procrastinate.App:
    """The app and its two tasks, bound to this run's database."""
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=10)
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
    finished_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.app = build_app(self.url)
        self.run(self.app.open_async())

    def install(self) -> dict[str, Any]:
        self.run(self.app.schema_manager.apply_schema_async())
        return {}

    async def aenqueue(self, seqs: list[int], kind: str) -> None:
        task = self.app.tasks[kind]
        if len(seqs) == 1:
            await task.defer_async(seq=seqs[0])
        else:
            await task.batch_defer_async(*({"seq": s} for s in seqs))

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "processes": processes,
            "concurrency": concurrency,
            "listen_notify": True,
            "fetch_job_polling_interval_s": 5.0,
            "tasks": "async def",
            "bulk_enqueue": "batch_defer_async (1,000 per call)",
            "delete_jobs": "never",
        }

    def work(self, p: dict[str, Any]) -> None:
        self.run(
            self.app.run_worker_async(
                queues=["default"],
                concurrency=int(p["concurrency"]),
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
