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
    main_table = None
    floor_description = "a bare LPUSH on the producer's Redis connection (Celery has no database)"
    bulk_description = "apply_async on one producer per job (no bulk API)"

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

    def redis(self) -> Any:
        if getattr(self, "_redis", None) is None:
            self._conn = self.mod.app.connection_for_write()
            self._redis = self._conn.default_channel.client
        return self._redis

    def floor_setup(self) -> None:
        self.redis().delete("bench_floor")

    def floor_insert(self, i: int) -> None:
        self.redis().lpush("bench_floor", f"[{i}]")

    def pending(self) -> int:
        """Messages still in the queue or delivered but not acknowledged (kombu's hash)."""
        r = self.redis()
        return int(r.llen("default")) + int(r.hlen("unacked"))

    def analyze(self) -> None:
        pass

    def table_stats(self) -> dict[str, Any] | None:
        return None

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.mod.KINDS[kind].delay(seq)

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        task = self.mod.KINDS[kind]
        with self.mod.app.producer_or_acquire() as producer:
            for seq in seqs:
                task.apply_async((seq,), producer=producer)

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]:
        pool = setting.get("pool", "solo")
        # prefork: one worker whose pool has one child process per process of the layout
        instances = 1 if pool == "prefork" else processes
        concurrency = processes if pool == "prefork" else int(setting.get("concurrency", 1))
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
                pool,
                "-c",
                str(concurrency),
                "--prefetch-multiplier",
                str(setting.get("prefetch", 64)),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
                "-n",
                f"w{i}@%h",
            ]
            for i in range(instances)
        ]

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        pool = setting.get("pool", "solo")
        return {
            "worker_instances": 1 if pool == "prefork" else processes,
            "pool": pool,
            "concurrency": processes if pool == "prefork" else setting.get("concurrency", 1),
            "prefetch_multiplier": setting.get("prefetch", 64),
            "result_backend": None,
            "acks": "early (default)",
            "flags": "--without-gossip --without-mingle --without-heartbeat",
        }

    def count_finished(self) -> int | None:
        return None  # no result backend; the handler marks are the record

    def insert_finished(self, n: int) -> None:
        raise NotImplementedError("celery: Redis broker keeps no finished-job history")

    def close(self) -> None:
        if getattr(self, "_conn", None) is not None:
            self._conn.release()


if __name__ == "__main__":
    bench_common.main(CeleryAdapter)
