"""Celery + Redis adapter: no result backend, tuned prefetch, solo/threads pools."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import bench_common
from bench_common import SYSTEMS_DIR


class CeleryAdapter:
    name = "celery"
    has_burst = False

    def __init__(self, params: dict[str, Any]) -> None:
        os.environ["BENCH_REDIS_URL"] = params["redis_url"]
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SYSTEMS_DIR), os.environ.get("PYTHONPATH", "")) if p
        )
        import celery_app

        self.mod = celery_app

    def install(self) -> dict[str, Any]:
        with self.mod.app.connection_for_write() as conn:
            conn.default_channel.client.flushdb()
        return {}

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.mod.KINDS[kind].delay(seq)

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        task = self.mod.KINDS[kind]
        with self.mod.app.producer_or_acquire() as producer:
            for seq in seqs:
                task.apply_async((seq,), producer=producer)

    @staticmethod
    def pool(concurrency: int) -> str:
        return "solo" if concurrency == 1 else "threads"

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "celery_app",
                "worker",
                "-Q",
                "default",
                "-P",
                self.pool(concurrency),
                "-c",
                str(concurrency),
                "--prefetch-multiplier",
                str(self.mod.PREFETCH),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
                "-n",
                f"w{i}@%h",
            ]
            for i in range(processes)
        ]

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "processes": processes,
            "pool": self.pool(concurrency),
            "concurrency": concurrency,
            "prefetch_multiplier": self.mod.PREFETCH,
            "result_backend": None,
            "acks": "early (default)",
            "flags": "--without-gossip --without-mingle --without-heartbeat",
            "bulk_enqueue": "apply_async on one producer (no bulk API)",
        }

    def count_finished(self) -> int | None:
        return None  # no result backend; the handler marks are the record

    def insert_finished(self, n: int) -> None:
        raise NotImplementedError("celery: Redis broker keeps no finished-job history")

    def close(self) -> None:
        pass


if __name__ == "__main__":
    bench_common.main(CeleryAdapter)
