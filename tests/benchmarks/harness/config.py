"""What is run: systems, the settings swept for each, and the workload sizes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

ALL_SYSTEMS = (
    "conveyor",
    "procrastinate",
    "pgqueuer",
    "chancy",
    "django-tasks-db",
    "django-ox",
    "celery",
)
# The default run, in this order; `profile` runs only when named (it needs py-spy
# and ptrace, and one long drain of its own).
DEFAULT_WORKLOADS = (
    "drain", "enqueue", "latency", "limit", "sustained", "growth", "features", "relay",
)  # fmt: skip
ALL_WORKLOADS = (*DEFAULT_WORKLOADS, "profile")

ADAPTERS = {name: f"{name.replace('-', '_')}_adapter.py" for name in ALL_SYSTEMS}
USES_POSTGRES = {name: name != "celery" for name in ALL_SYSTEMS}

# Workloads that exist for django-conveyor only, and why (written into the JSON).
CONVEYOR_ONLY = {
    "growth": (
        "growth pre-inserts rows straight into the job table; it is implemented for "
        "django-conveyor only, whose targets it checks (the peers' schemas, triggers and "
        "history tables differ: pgqueuer moves finished jobs to a log table, Celery keeps none)"
    ),
    "limit": (
        "the physical limit drives django-conveyor's own claim and completion SQL "
        "(django_conveyor/protocol.py) without its worker"
    ),
    "profile": "py-spy profiles a django-conveyor worker",
    "features": (
        "what django-conveyor's flow control and unique jobs cost; the peers' limits and "
        "uniqueness differ in kind, and several keep them in paid tiers"
    ),
}
# The sustained run is long (10^6 jobs in the full run): django-conveyor, whose
# target it is, and pgqueuer, the fastest peer of the published runs, for comparison.
SUSTAINED_SYSTEMS = ("conveyor", "pgqueuer")
SUSTAINED_SKIP = (
    "the sustained run (10^6 jobs) is run for django-conveyor and pgqueuer only, to "
    "keep the full run near an hour; `--systems X --workloads sustained` runs it for X"
)

# Worker processes for the drain: every system at 1 and at 2 (one per core).
DRAIN_PROCESSES = (1, 2)

# The main knob of each system, swept in the drain; every entry is one setting.
# conveyor prefetch None = the adaptive claim-ahead buffer (the default).
# The worker's own defaults (conveyor_worker with no flags). Its final drains run
# beside the best swept setting's, at full size and as often, so that "fast by
# default" compares two medians, not two single short sweep runs (the larger of
# several noisy runs is biased upwards).
NO_FLAGS: dict[str, dict[str, Any]] = {"conveyor": {"concurrency": 4, "prefetch": None}}

DRAIN_SWEEP: dict[str, list[dict[str, Any]]] = {
    "conveyor": [
        {"concurrency": 4, "prefetch": None},
        {"concurrency": 10, "prefetch": None},
        {"concurrency": 32, "prefetch": None},
        {"concurrency": 10, "prefetch": 32},
        {"concurrency": 10, "prefetch": 1000},
        {"concurrency": 10, "prefetch": 4000},  # About the default's cap, fixed.
    ],
    "pgqueuer": [{"batch_size": b, "concurrency_limit": 0} for b in (10, 50, 200)],
    "procrastinate": [{"concurrency": c} for c in (10, 50, 200)],
    "chancy": [{"concurrency": c} for c in (10, 50, 200)],
    # one task at a time per process, no other throughput knob; the interval only
    # matters when idle (a busy worker looks again at once)
    "django-tasks-db": [{"interval": 0.1}],
    "django-ox": [{"concurrency": c, "interval": 0.1} for c in (1, 4, 16)],
    "celery": [
        {"pool": "solo", "concurrency": 1, "prefetch": 16},
        {"pool": "solo", "concurrency": 1, "prefetch": 64},
        {"pool": "solo", "concurrency": 1, "prefetch": 256},
        {"pool": "threads", "concurrency": 8, "prefetch": 64},
        # prefork: one worker whose pool has one child per "process" of the layout
        {"pool": "prefork", "concurrency": 0, "prefetch": 64},
    ],
}

# The idle worker of the latency workload (1 process); the polling-only peers
# are tried at their usual 0.1 s and at an aggressive 0.01 s.
LATENCY_SWEEP: dict[str, list[dict[str, Any]]] = {
    "conveyor": [{"concurrency": 4, "prefetch": None}],
    "pgqueuer": [{"batch_size": 10, "concurrency_limit": 0}],
    "procrastinate": [{"concurrency": 4}],
    "chancy": [{"concurrency": 4}],
    "django-tasks-db": [{"interval": 0.1}, {"interval": 0.01}],
    "django-ox": [{"concurrency": 4, "interval": i} for i in (0.1, 0.01)],
    "celery": [{"pool": "solo", "concurrency": 1, "prefetch": 64}],
}


def relay_setting(system: str, processes: int, concurrency: int) -> dict[str, Any]:
    """The setting that gives `processes x concurrency` slots (relay workload)."""
    if system == "conveyor":
        return {"concurrency": concurrency, "prefetch": None}
    if system == "pgqueuer":  # total slots enforced in SQL; one batch fills a process
        return {"batch_size": concurrency, "concurrency_limit": processes * concurrency}
    if system in ("procrastinate", "chancy"):
        return {"concurrency": concurrency}
    if system == "django-tasks-db":  # slots are processes
        return {"interval": 0.1, "processes_per_slot": True}
    if system == "django-ox":
        return {"concurrency": concurrency, "interval": 0.1}
    pool = "solo" if concurrency == 1 else "threads"
    return {"pool": pool, "concurrency": concurrency, "prefetch": 4}


# relay slots: label -> (processes, concurrency); 12 = 3 processes x 4
RELAY_SLOTS: dict[str, tuple[int, int]] = {"1": (1, 1), "4": (1, 4), "12": (3, 4)}

# Growth figures (django-conveyor): label -> what is in the table first and how
# the drain runs. "base" is the same drain with nothing else in the table.
GROWTH_FIGURES = (
    "base",
    "finished-1e6",
    "ready-1e6",
    "ready-other-queue-1e6",
    "processes-8",
    "queues-100",
)

# Features figures (django-conveyor): the drain of one queue without limits and
# under each kind of limit (none reached: djproject/settings.py), and unique
# enqueue beside plain enqueue.
FEATURE_FIGURES = (
    "no limit",
    "concurrency",
    "rate",
    "key_concurrency",
    "fair",
    "unique enqueue",
)

# Batch sizes the physical limit tries (jobs claimed, then completed, per cycle).
LIMIT_BATCHES = (10, 50, 200, 1000)


def label(setting: dict[str, Any]) -> str:
    """A short, stable name for a setting: `concurrency=10,prefetch=auto`."""
    parts = []
    for key, value in setting.items():
        shown = "auto" if value is None else value
        parts.append(f"{key}={shown}")
    return ",".join(parts) or "default"


def parse_setting(text: str) -> dict[str, Any]:
    """`k=v,k=v` from the command line; values are JSON where they parse (auto = None)."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, raw = item.partition("=")
        if raw in ("auto", "none", "None"):
            out[key.strip()] = None
            continue
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


@dataclass(frozen=True)
class Sizes:
    enqueue_single: int  # one call per transaction (and as many bare INSERTs)
    enqueue_bulk: int
    bulk_chunk: int  # jobs per bulk call, the same for every system
    sweep_jobs: int  # one drain per swept setting
    drain_jobs: int  # the best setting's drains
    latency_jobs: int
    latency_rate: float
    sustained_jobs: int
    sustained_backlog: int  # the producer keeps about this many jobs ready
    growth_jobs: int
    growth_rows: int  # finished / ready rows put in the table first
    growth_processes: int
    growth_queues: int
    limit_jobs: int
    relay_jobs: int
    profile_jobs: int
    repeat: int
    sweep_settings: int | None  # None: every setting; quick tries the first few

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


FULL = Sizes(
    enqueue_single=2_000,
    enqueue_bulk=50_000,
    bulk_chunk=5_000,
    sweep_jobs=20_000,
    drain_jobs=50_000,
    latency_jobs=1_000,
    latency_rate=100.0,
    sustained_jobs=1_000_000,
    sustained_backlog=20_000,
    growth_jobs=50_000,
    growth_rows=1_000_000,
    growth_processes=8,
    growth_queues=100,
    limit_jobs=50_000,
    relay_jobs=3_000,
    profile_jobs=300_000,
    repeat=3,
    sweep_settings=None,
)
QUICK = Sizes(
    enqueue_single=100,
    enqueue_bulk=2_000,
    bulk_chunk=1_000,
    sweep_jobs=1_000,
    drain_jobs=2_000,
    latency_jobs=100,
    latency_rate=100.0,
    sustained_jobs=10_000,
    sustained_backlog=2_000,
    growth_jobs=1_000,
    growth_rows=10_000,
    growth_processes=8,
    growth_queues=100,
    limit_jobs=2_000,
    relay_jobs=120,
    profile_jobs=20_000,
    repeat=1,
    sweep_settings=2,
)
