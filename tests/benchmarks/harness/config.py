"""What is run: systems, their worker layouts, and the workload sizes."""

from __future__ import annotations

from dataclasses import dataclass

ALL_SYSTEMS = (
    "conveyor",
    "procrastinate",
    "pgqueuer",
    "chancy",
    "django-tasks-db",
    "django-ox",
    "celery",
)
ALL_WORKLOADS = ("drain", "latency", "relay", "growth", "soak")

ADAPTERS = {name: f"{name.replace('-', '_')}_adapter.py" for name in ALL_SYSTEMS}
USES_POSTGRES = {name: name != "celery" for name in ALL_SYSTEMS}
GROWTH_SUPPORTED = {"conveyor"}
SOAK_SUPPORTED = {"conveyor"}
SOAK_SKIP_REASON = "the memory soak (RSS sampled over a long drain) runs for django-conveyor only"
GROWTH_SKIP_REASON = (
    "growth pre-inserts finished rows straight into the system's job table; it is "
    "implemented for django-conveyor only (peers' schemas, triggers and history "
    "tables differ: pgqueuer moves finished jobs to a log table, Celery keeps none)"
)

# (processes, concurrency per process) for the I/O-light workloads (drain, growth):
# each system's documented shape for many small jobs on a 2-core host.
DRAIN_LAYOUT: dict[str, tuple[int, int]] = {
    "conveyor": (2, 8),
    "procrastinate": (2, 10),  # async tasks, concurrency per worker
    "pgqueuer": (2, 0),  # 0: pgqueuer's unlimited in-flight async entrypoints
    "chancy": (2, 10),  # AsyncExecutor, queue concurrency per worker
    "django-tasks-db": (4, 1),  # one task at a time per process
    "django-ox": (2, 4),
    "celery": (2, 1),  # two solo-pool workers, prefetch 64 each
}
# the idle worker of the latency workload: one process
LATENCY_LAYOUT: dict[str, tuple[int, int]] = {
    name: (1, 1) if name in ("django-tasks-db", "celery") else (1, 4) for name in ALL_SYSTEMS
}
# relay slots: label -> (processes, concurrency); 12 = 3 processes x 4
RELAY_SLOTS: dict[str, tuple[int, int]] = {"1": (1, 1), "4": (1, 4), "12": (3, 4)}


@dataclass(frozen=True)
class Sizes:
    drain_jobs: int
    drain_single_jobs: int
    latency_jobs: int
    latency_rate: float
    relay_jobs: int
    growth_history: tuple[int, ...]
    growth_jobs: int
    soak_jobs: int
    repeat: int


FULL = Sizes(
    drain_jobs=10_000,
    drain_single_jobs=1_000,
    latency_jobs=1_000,
    latency_rate=100.0,
    relay_jobs=3_000,
    growth_history=(1_000, 100_000, 1_000_000),
    growth_jobs=10_000,
    soak_jobs=100_000,
    repeat=3,
)
QUICK = Sizes(
    drain_jobs=300,
    drain_single_jobs=50,
    latency_jobs=100,
    latency_rate=100.0,
    relay_jobs=120,
    growth_history=(1_000, 10_000),
    growth_jobs=300,
    soak_jobs=5_000,
    repeat=1,
)
