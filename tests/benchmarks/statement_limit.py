"""What PostgreSQL needs per job for each candidate design of the hot statements.

    .venv-3.12/bin/python tests/benchmarks/statement_limit.py \
        [--part drain,enqueue] [--designs a,b] [--jobs 20000] [--batch 1000] \
        [--rounds 3] [--processes 1] [--out var/statement-limit]

The `limit` workload of run.py measures one thing: jobs/s of the shipped
CLAIM and COMPLETE in a tight loop. This script runs the same loop
(systems/limit_cycle.py) for candidate designs of the statements and of the
table (other indexes, other statement shapes, one statement per cycle) and
measures, per job, what does not depend on how loaded the machine is:

- WAL bytes (pg_current_wal_lsn() before and after) and WAL records by
  kind (pg_walinspect): heap updates, HOT updates, row locks, inserts,
  full-page images, and B-tree insertions, which are the index entries
  written;
- shared buffers hit, read and dirtied, and the server's own execution
  and planning time, per statement (pg_stat_statements);
- HOT and non-HOT updates (pg_stat_user_tables).

Jobs/s are measured too, but only as interleaved rounds: each round runs
every design once, in an order rotated between rounds, so a change in the
machine's load hits every design alike. Compare medians, on a quiet
machine if the figure matters.

It starts a PostgreSQL of its own (`--pg-dir`, default var/statement-pg)
with pg_stat_statements preloaded, so the suite's server is left alone;
every design runs in a fresh database cloned from a migrated template,
with autovacuum off for the job table while it is measured (a vacuum's
WAL is not the statements').

The enqueue part measures single calls (one per transaction, beside the
bare INSERT + COMMIT floor of the enqueue benchmark) and bulk calls of
--chunk jobs in each candidate form.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "benchmarks" / "systems"))

import limit_cycle  # noqa: E402  (systems/, shared with the limit workload)
from limit_cycle import Statements  # noqa: E402

TEMPLATE = "conveyor_stmt_template"
TAG = re.compile(r"/\* stmt:([\w-]+) \*/")
TASK_PATH = "tests.testapp.tasks.noop"


def tagged(tag: str, sql: str) -> str:
    """The statement with a comment naming it, which pg_stat_statements keeps."""
    return f"/* stmt:{tag} */ {sql.strip()}"


# ---------------------------------------------------------------- drain designs


@dataclass(frozen=True)
class Design:
    name: str
    why: str
    statements: Callable[[Any], Statements]
    ddl: tuple[str, ...] = ()
    pipeline: bool = True
    threads: int = 1  # Connections driven by threads of one process (a worker's overlap).
    session: tuple[str, ...] = ()  # Run on each loop connection first (SET ...).
    gil_threads: int = 0  # Threads running Python beside the loop, as a worker's slots do.


def _claim(protocol: Any) -> str:
    return tagged("claim", protocol.CLAIM)


def _complete(protocol: Any) -> str:
    return tagged("complete", protocol.COMPLETE)


def shipped(protocol: Any) -> Statements:
    return Statements(claim=_claim(protocol), complete=_complete(protocol))


def with_unblock(protocol: Any) -> Statements:
    return Statements(
        claim=_claim(protocol),
        complete=_complete(protocol),
        after_complete=tagged("unblock", protocol.UNBLOCK),
    )


COMPLETE_ARRAYS = """
UPDATE conveyor_job AS j
SET state = 'completed', return_value = h.return_value::jsonb, finished_at = now(),
    lease_expires_at = NULL, isolated = false
FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(values)s::text[])
     AS h(id, version, return_value)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""


COMPLETE_BY_ID = COMPLETE_ARRAYS.replace(
    "WHERE j.id = h.id", "WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = h.id"
)


def complete_by_id(protocol: Any) -> Statements:
    return Statements(
        claim=_claim(protocol), complete=tagged("complete", COMPLETE_BY_ID), held=held_arrays
    )


def held_arrays(rows: Sequence[Any], version_at: int) -> dict[str, Any]:
    return {
        "ids": [r[0] for r in rows],
        "versions": [r[version_at] for r in rows],
        "values": ["null"] * len(rows),
    }


def complete_arrays(protocol: Any) -> Statements:
    return Statements(
        claim=_claim(protocol), complete=tagged("complete", COMPLETE_ARRAYS), held=held_arrays
    )


def fused_sql(protocol: Any, *, unblock: bool) -> str:
    """COMPLETE of the held batch, (UNBLOCK of its dependents,) and CLAIM: one statement.

    The data-modifying CTEs touch disjoint rows (running, blocked, available)
    and share one snapshot; the claimed rows come back joined to one row that
    always exists, so an empty claim still says what was completed.
    """
    claim = protocol.CLAIM.strip()
    assert claim.startswith("WITH picked AS (")
    body, _, select = claim.rpartition("\nSELECT ")
    done = """WITH done AS (
    UPDATE conveyor_job AS j
    SET state = 'completed', return_value = h.return_value, finished_at = now(),
        lease_expires_at = NULL, isolated = false
    FROM jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint, return_value jsonb)
    WHERE j.id = h.id AND j.state = 'running'
      AND j.lease_owner = %(owner)s AND j.lease_version = h.version
    RETURNING j.id
)"""
    unblocked = ""
    if unblock:
        unblocked = """, hits AS (
    SELECT d.job_id, count(*) AS n
    FROM conveyor_dependency AS d
    WHERE d.depends_on_id IN (SELECT id FROM done)
    GROUP BY d.job_id
), locked AS (
    SELECT j.id, hits.n FROM conveyor_job AS j JOIN hits ON j.id = hits.job_id
    WHERE j.state = 'blocked' ORDER BY j.id FOR UPDATE OF j
), unblocked AS (
    UPDATE conveyor_job AS j
    SET pending_dependencies = j.pending_dependencies - locked.n,
        state = CASE WHEN j.pending_dependencies - locked.n > 0 THEN 'blocked'
                     ELSE 'available' END
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
)"""
    columns, _, _ = select.partition("\nFROM claimed")
    # The refused ids (usually none), not the written ones, so each row stays small.
    final = f"""
SELECT c.*, r.refused FROM (
    SELECT array_agg(h.id) AS refused FROM jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint)
    WHERE h.id NOT IN (SELECT id FROM done)
) AS r LEFT JOIN (SELECT {columns} FROM claimed) AS c ON true"""
    return tagged("fused", done + unblocked + ", " + body[len("WITH ") :] + final)


def fused(protocol: Any) -> Statements:
    return Statements(claim=fused_sql(protocol, unblock=False), fused=True)


def fused_unblock(protocol: Any) -> Statements:
    return Statements(claim=fused_sql(protocol, unblock=True), fused=True)


# A stand-in for the claim-ahead frontier (see var/design-perf.md): one single-row
# update of the worker's registry row per cycle, in the cycle's transaction.
HAND_OUT = """
UPDATE conveyor_worker SET last_seen_at = greatest(last_seen_at, now()) WHERE id = %(owner)s
"""
WORKER_ROWS = tuple(
    "INSERT INTO conveyor_worker (id, host, pid, queues, concurrency, started_at, last_seen_at,"
    f" leases_held, version) VALUES ('stmt:{i}', 'h', 1, '[]', 10, now(), now(), 0, 'x')"
    for i in range(8)
)


def with_hand_out(protocol: Any) -> Statements:
    return Statements(
        claim=_claim(protocol),
        complete=_complete(protocol),
        per_cycle=tagged("hand-out", HAND_OUT),
    )


# CLAIM for a worker of one queue, without the trick that folds only in a
# custom plan: the queue is a parameter, the paused check a one-time filter.
ONE_QUEUE_FILTER = """AND queue = (%(queues)s::text[])[1]
      AND NOT EXISTS (SELECT 1 FROM conveyor_queue AS q
                      WHERE q.name = (%(queues)s::text[])[1] AND q.paused)"""


def claim_one_queue(protocol: Any) -> Statements:
    import conveyor_adapter  # the shipped filter's text, which the limit workload also edits

    claim = protocol.CLAIM
    if conveyor_adapter.SHIPPED_FILTER not in claim:
        raise RuntimeError("protocol.CLAIM no longer has the queue filter this design edits")
    claim = claim.replace(conveyor_adapter.SHIPPED_FILTER, ONE_QUEUE_FILTER)
    return Statements(claim=tagged("claim", claim), complete=_complete(protocol))


def drop(*indexes: str) -> tuple[str, ...]:
    return tuple(f"DROP INDEX {name}" for name in indexes)


FINAL = "state IN ('completed', 'failed', 'dead', 'cancelled')"


def recreate(name: str, columns: str, where: str) -> tuple[str, ...]:
    partial = f" WHERE {where}" if where else ""
    return (f"DROP INDEX {name}", f"CREATE INDEX {name} ON conveyor_job ({columns}){partial}")


# The admin/API/stats secondary indexes without running rows (the reap index has them).
NOT_RUNNING = (
    recreate("conveyor_job_queue_id_idx", "queue, id", "state <> 'running'")
    + recreate("conveyor_job_task_id_idx", "task_path, id", "state <> 'running'")
    + recreate("conveyor_job_list_idx", "state, queue, id", "state <> 'running'")
)

# The layout before migration 0016: the secondary indexes over every row, the
# running index on lease_expires_at alone.
BEFORE_0016 = (
    recreate("conveyor_job_queue_id_idx", "queue, id", "")
    + recreate("conveyor_job_task_id_idx", "task_path, id", "")
    + recreate("conveyor_job_list_idx", "state, queue, id", "")
    + recreate("conveyor_job_reap_idx", "lease_expires_at", "state = 'running'")
)

DESIGNS = {
    d.name: d
    for d in (
        Design(
            "shipped", "protocol.CLAIM + protocol.COMPLETE, pipelined (the limit today)", shipped
        ),
        Design(
            "before-0016",
            "the shipped pair on the table's layout before migration 0016 (full indexes)",
            shipped,
            ddl=BEFORE_0016,
        ),
        Design(
            "reap-by-expiry",
            "the shipped pair plus a running index on lease_expires_at alone, for REAP",
            shipped,
            ddl=(
                "CREATE INDEX conveyor_job_expiry_idx ON conveyor_job (lease_expires_at)"
                " WHERE state = 'running'",
            ),
        ),
        Design(
            "shipped+unblock",
            "what the worker's cycle sends: COMPLETE, then UNBLOCK of the written ids, then CLAIM",
            with_unblock,
        ),
        Design(
            "claim-one-queue",
            "CLAIM for one queue with a plan PostgreSQL can keep (no custom plan per call)",
            claim_one_queue,
        ),
        Design(
            "claim-one-queue-generic",
            "the one-queue CLAIM with plan_cache_mode = force_generic_plan on the connection",
            claim_one_queue,
            session=("SET plan_cache_mode = force_generic_plan",),
        ),
        Design(
            "shipped-generic",
            "the shipped pair with plan_cache_mode = force_generic_plan",
            shipped,
            session=("SET plan_cache_mode = force_generic_plan",),
        ),
        Design(
            "shipped+hand-out",
            "the shipped pair plus one single-row update of the worker's row per cycle",
            with_hand_out,
            ddl=WORKER_ROWS,
        ),
        Design(
            "not-pipelined",
            "the shipped pair as four round trips (BEGIN, COMPLETE, CLAIM, COMMIT)",
            shipped,
            pipeline=False,
        ),
        Design(
            "pipelined+slots",
            "the shipped pair, pipelined, with 10 threads running Python beside the loop",
            shipped,
            gil_threads=10,
        ),
        Design(
            "not-pipelined+slots",
            "the same with four plain round trips",
            shipped,
            pipeline=False,
            gil_threads=10,
        ),
        Design(
            "fused+slots",
            "one fused statement per cycle, with the 10 threads",
            fused,
            gil_threads=10,
        ),
        Design(
            "complete-arrays",
            "COMPLETE reads typed arrays (unnest) instead of a JSON recordset",
            complete_arrays,
        ),
        Design(
            "complete-by-id",
            "COMPLETE reads typed arrays and finds its rows by primary key (id = ANY)",
            complete_by_id,
        ),
        Design(
            "threads-2",
            "the shipped pair on two connections driven by two threads of one process",
            shipped,
            threads=2,
        ),
        Design(
            "fused",
            "COMPLETE and CLAIM in one statement: one round trip without pipeline mode",
            fused,
        ),
        Design(
            "fused+unblock",
            "COMPLETE, UNBLOCK and CLAIM in one statement (everything the worker's cycle does)",
            fused_unblock,
        ),
        Design(
            "ff50",
            "fillfactor 50: a claim's and a completion's new versions fit on the row's own page",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 50)",),
        ),
        Design(
            "ff70",
            "fillfactor 70",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 70)",),
        ),
        Design(
            "ff85",
            "fillfactor 85",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 85)",),
        ),
        Design(
            "no-admin-idx",
            "diagnostic: without conveyor_job_queue_id_idx and conveyor_job_task_id_idx",
            shipped,
            ddl=drop("conveyor_job_queue_id_idx", "conveyor_job_task_id_idx"),
        ),
        Design(
            "no-list-idx",
            "diagnostic: without conveyor_job_list_idx (state, queue, id)",
            shipped,
            ddl=drop("conveyor_job_list_idx"),
        ),
        Design(
            "no-finished-idx",
            "diagnostic: without conveyor_job_finished_idx",
            shipped,
            ddl=drop("conveyor_job_finished_idx"),
        ),
        Design(
            "secondary-not-running",
            "queue_id, task_id and list indexes without running rows (the reap index has them)",
            shipped,
            ddl=NOT_RUNNING,
        ),
        Design(
            "lean",
            "secondary-not-running + fillfactor 70 (the candidate layout)",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 70)", *NOT_RUNNING),
        ),
        Design(
            "lean-ff50",
            "secondary-not-running + fillfactor 50",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 50)", *NOT_RUNNING),
        ),
        Design(
            "lean-ff85",
            "secondary-not-running + fillfactor 85",
            shipped,
            ddl=("ALTER TABLE conveyor_job SET (fillfactor = 85)", *NOT_RUNNING),
        ),
        Design(
            "not-running-no-queue-id",
            "diagnostic: secondary-not-running without conveyor_job_queue_id_idx",
            shipped,
            ddl=NOT_RUNNING + drop("conveyor_job_queue_id_idx"),
        ),
        Design(
            "admin-final-only",
            "queue_id and task_id indexes on finished rows only",
            shipped,
            ddl=recreate("conveyor_job_queue_id_idx", "queue, id", FINAL)
            + recreate("conveyor_job_task_id_idx", "task_path, id", FINAL),
        ),
        Design(
            "bare-indexes",
            "diagnostic floor: only the primary key, the claim indexes and the reap index",
            shipped,
            ddl=drop(
                "conveyor_job_queue_id_idx",
                "conveyor_job_task_id_idx",
                "conveyor_job_list_idx",
                "conveyor_job_finished_idx",
            ),
        ),
    )
}


# ---------------------------------------------------------------- the server


def ensure_server(pg_dir: Path) -> None:
    """Our own embedded server, with pg_stat_statements preloaded (restarting it once)."""
    import psycopg

    from django_conveyor import embedded

    if not (pg_dir / "PG_VERSION").exists():
        _init_cluster(pg_dir)
    params = _url_params(embedded.start(pg_dir))
    with psycopg.connect(**params, autocommit=True) as conn:
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        if "pg_stat_statements" not in preload:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    if "pg_stat_statements" not in preload:
        embedded.stop(pg_dir)
        params = _url_params(embedded.start(pg_dir))
    with psycopg.connect(**params, autocommit=True) as conn:
        for setting, value in (
            ("pg_stat_statements.track", "all"),
            ("pg_stat_statements.track_utility", "on"),
            ("pg_stat_statements.track_planning", "on"),
        ):
            conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def _init_cluster(pg_dir: Path) -> None:
    """initdb with server binaries that ship pg_stat_statements and pg_walinspect.

    The embedded server prefers the pgserver wheel, which has neither; a
    folder initialised by another major version makes it pick that one's
    binaries (Debian's, as the benchmark's own server uses).
    """
    import glob
    import pwd
    import subprocess

    libs = sorted(glob.glob("/usr/lib/postgresql/*/lib/pg_walinspect.so"))
    if not libs:
        raise SystemExit("needs PostgreSQL 15+ server binaries with contrib (Debian's postgresql)")
    bindir = Path(libs[-1]).parent.parent / "bin"
    user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    pg_dir.mkdir(parents=True, mode=0o700)
    ids: dict[str, Any] = {}
    if user is not None:
        os.chown(pg_dir, user.pw_uid, user.pw_gid)
        ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    flags = ["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"]
    subprocess.run(
        [str(bindir / "initdb"), "-D", str(pg_dir), *flags],
        check=True, cwd=pg_dir, capture_output=True, **ids,
    )  # fmt: skip


def _url_params(url: str) -> dict[str, Any]:
    import environ

    cfg = environ.Env.db_url_config(url)
    return {"host": cfg["HOST"], "port": cfg["PORT"], "user": cfg["USER"], "dbname": cfg["NAME"]}


def conninfo(dbname: str) -> str:
    from psycopg.conninfo import make_conninfo

    from django_conveyor.worker.connections import connection_params

    params = connection_params("default")
    params["dbname"] = dbname
    return make_conninfo(**{k: v for k, v in params.items() if v not in (None, "")})


def admin(*statements: str) -> None:
    import psycopg

    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def make_template() -> None:
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    admin(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)", f"CREATE DATABASE {TEMPLATE}")
    call_command("migrate", verbosity=0)
    connections.close_all()
    with psycopg.connect(conninfo(TEMPLATE), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, payload jsonb)")


def fresh_database(name: str) -> str:
    admin(
        f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}",
    )
    return conninfo(name)


# ---------------------------------------------------------------- measuring


@dataclass
class Counters:
    lsn: str
    tables: dict[str, int]


def counters(conn: Any) -> Counters:
    lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    row = conn.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
        " WHERE relname = 'conveyor_job'"
    ).fetchone()
    names = ("inserted", "updated", "hot_updated", "deleted")
    return Counters(lsn, dict(zip(names, map(int, row), strict=True)))


def wal_breakdown(conn: Any, start: str, end: str) -> dict[str, Any]:
    rows = conn.execute(
        'SELECT "resource_manager/record_type", count, record_size, fpi_size'
        " FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0",
        [start, end],
    ).fetchall()
    kinds = {
        name: {"count": int(c), "bytes": int(r) + int(f), "fpi_bytes": int(f)}
        for name, c, r, f in rows
    }
    total = int(conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", [end, start]).fetchone()[0])
    btree = sum(v["count"] for k, v in kinds.items() if k.startswith("Btree/INSERT"))
    return {
        "bytes": total,
        "records": sum(v["count"] for v in kinds.values()),
        "fpi_bytes": sum(v["fpi_bytes"] for v in kinds.values()),
        "index_entries": btree,
        "heap": {k: v["count"] for k, v in kinds.items() if k.startswith(("Heap/", "Heap2/"))},
        "kinds": kinds,
    }


def statement_stats(conn: Any) -> dict[str, dict[str, float]]:
    rows = conn.execute(
        "SELECT query, calls, total_exec_time, total_plan_time, plans, shared_blks_hit,"
        " shared_blks_read,"
        " shared_blks_dirtied, shared_blks_written, wal_records, wal_fpi, wal_bytes, rows"
        " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
        " WHERE datname = current_database())"
    ).fetchall()
    out: dict[str, dict[str, float]] = {}
    names = (
        "calls", "exec_ms", "plan_ms", "plans", "hit", "read", "dirtied", "written",
        "wal_records", "wal_fpi", "wal_bytes", "rows",
    )  # fmt: skip
    for query, *values in rows:
        found = TAG.search(query)
        text = query.strip().upper()
        name = found.group(1) if found else text if text in ("BEGIN", "COMMIT") else None
        if name is None and "INSERT INTO CONVEYOR_JOB" in text:
            name = "enqueue"  # protocol.ENQUEUE, as protocol.enqueue() sends it
        if name is None:
            continue
        into = out.setdefault(name, dict.fromkeys(names, 0.0))
        for key, value in zip(names, values, strict=True):
            into[key] += float(value)
    return out


def per_job(stats: dict[str, dict[str, float]], n: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, s in stats.items():
        out[name] = {
            "calls": int(s["calls"]),
            "plans": int(s["plans"]),
            "server_us": (s["exec_ms"] + s["plan_ms"]) * 1000 / n,
            "plan_us": s["plan_ms"] * 1000 / n,
            "hit": s["hit"] / n,
            "read": s["read"] / n,
            "dirtied": s["dirtied"] / n,
            "wal_bytes": s["wal_bytes"] / n,
        }
    return out


def load_jobs(conn: Any, n: int, chunk: int = 5000) -> None:
    """n ready no-op jobs through protocol.enqueue, as the benchmark's bulk load."""
    from django_conveyor import protocol

    with conn.cursor() as cur:
        for lo in range(0, n, chunk):
            jobs = [
                protocol.NewJob(TASK_PATH, [i], {}, "default", "default", 0, 5)
                for i in range(lo, min(n, lo + chunk))
            ]
            protocol.enqueue(cur, jobs, notify=False)


def measure_drain(design: Design, n: int, batch: int, processes: int) -> dict[str, Any]:
    import psycopg

    from django_conveyor import protocol

    dsn = fresh_database("conveyor_stmt_run")
    stmts = design.statements(protocol)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in design.ddl:
            conn.execute(statement)
        conn.execute("ALTER TABLE conveyor_job SET (autovacuum_enabled = false)")
        load_jobs(conn, n)
        conn.execute("VACUUM ANALYZE conveyor_job")
        conn.execute("CHECKPOINT")
        conn.execute("SELECT pg_stat_statements_reset()")
        before = counters(conn)
        started, cpu = time.perf_counter(), time.process_time()
        with gil_contention(design.gil_threads):
            cycles, server_cpu, loop_cpu = _drive(
                dsn, stmts, batch, design.pipeline, processes, design.threads, design.session
            )
        window, cpu = time.perf_counter() - started, time.process_time() - cpu
        time.sleep(0.3)  # the loop's backends have exited: their statistics are flushed
        after = counters(conn)
        completed = conn.execute(
            "SELECT count(*) FROM conveyor_job WHERE state = 'completed'"
        ).fetchone()[0]
        if completed != n:
            raise RuntimeError(f"{design.name}: {completed} of {n} jobs completed")
        wal = wal_breakdown(conn, before.lsn, after.lsn)
        stats = statement_stats(conn)
        row_bytes = conn.execute(
            "SELECT avg(pg_column_size(j.*))::int FROM conveyor_job AS j"
        ).fetchone()[0]
        heap_mb, indexes_mb = conn.execute(
            "SELECT pg_relation_size('conveyor_job') / 1048576.0,"
            " pg_indexes_size('conveyor_job') / 1048576.0"
        ).fetchone()
    admin("DROP DATABASE conveyor_stmt_run WITH (FORCE)")
    tables = {k: after.tables[k] - before.tables[k] for k in after.tables}
    server_us = sum(s["exec_ms"] + s["plan_ms"] for s in stats.values()) * 1000 / n
    return {
        "design": design.name,
        "jobs": n,
        "batch": batch,
        "processes": processes,
        "cycles": cycles,
        "jobs_per_s": n / window,
        "server_us_per_job": server_us,
        "server_cpu_us_per_job": server_cpu / n * 1e6,
        "client_cpu_us_per_job": cpu / n * 1e6 if processes == 1 else None,
        # CPU of the loop's own thread(s): what the statements cost the worker's control loop.
        "loop_cpu_us_per_job": loop_cpu / n * 1e6,
        "wal_bytes_per_job": wal["bytes"] / n,
        "wal_bytes_per_job_without_fpi": (wal["bytes"] - wal["fpi_bytes"]) / n,
        "wal_records_per_job": wal["records"] / n,
        "index_entries_per_job": wal["index_entries"] / n,
        "heap_records_per_job": {k: v / n for k, v in wal["heap"].items()},
        "updates_per_job": tables["updated"] / n,
        "hot_updates_per_job": tables["hot_updated"] / n,
        "row_bytes": row_bytes,
        # Without a vacuum: what the table and its indexes grew to for n jobs.
        "heap_mb": float(heap_mb),
        "indexes_mb": float(indexes_mb),
        "statements": per_job(stats, n),
        "wal_kinds": wal["kinds"],
    }


@contextlib.contextmanager
def gil_contention(threads: int) -> Iterator[None]:
    """Threads that run short bursts of Python, as handler slots do, while the loop runs."""
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            sum(range(300))  # a few µs of Python, then the GIL goes round
            time.sleep(0)

    workers = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        done.set()
        for worker in workers:
            worker.join()


def backend_cpu_s(pid: int) -> float:
    """CPU seconds a server process has used (user + system): what load does not inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drive(
    dsn: str,
    stmts: Statements,
    batch: int,
    pipeline: bool,
    processes: int,
    threads: int = 1,
    session: Sequence[str] = (),
) -> tuple[int, float, float]:
    """Run the cycle on `processes` x `threads` connections.

    Returns the cycles, the server backends' CPU seconds and the loop threads' own.
    """

    def loop(owner: str) -> tuple[int, float, float]:
        with limit_cycle.connect(dsn) as conn:
            for statement in session:
                conn.execute(statement)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            cpu, mine = backend_cpu_s(pid), time.thread_time()
            cycles = limit_cycle.run_cycles(
                conn, stmts, owner=owner, batch=batch, pipeline=pipeline
            )
            return cycles, backend_cpu_s(pid) - cpu, time.thread_time() - mine

    if processes == 1 and threads == 1:
        return loop("stmt:0")
    if processes == 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            done = list(pool.map(loop, [f"stmt:{i}" for i in range(threads)]))
        return tuple(sum(d[i] for d in done) for i in range(3))  # type: ignore[return-value]
    ctx = multiprocessing.get_context("fork")
    results = ctx.SimpleQueue()

    def one(i: int) -> None:
        with limit_cycle.connect(dsn) as conn:
            results.put(
                limit_cycle.run_cycles(
                    conn, stmts, owner=f"stmt:{i}", batch=batch, pipeline=pipeline
                )
            )

    procs = [ctx.Process(target=one, args=(i,)) for i in range(processes)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        raise RuntimeError("a limit process failed")
    done = [results.get() for _ in procs]
    return tuple(sum(d[i] for d in done) for i in range(3))  # type: ignore[return-value]


# ---------------------------------------------------------------- enqueue designs


ENQUEUE_VALUES = """
INSERT INTO conveyor_job (
    task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
    run_after, enqueued_run_after, lease_version, idempotency_key, errors, enqueued_at,
    pending_dependencies, dependency_policy
) VALUES (
    %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s, %(backend)s, %(priority)s,
    'available', 0, %(max_attempts)s, COALESCE(%(run_after)s::timestamptz, now()),
    %(run_after)s::timestamptz, 0, %(idempotency_key)s, '[]'::jsonb, now(), 0, 'cancel'
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key, enqueued_at, run_after, state,
          CASE WHEN %(notify)s AND run_after <= now() THEN pg_notify(%(channel)s, queue) END
"""


def enqueue_from(source: str) -> str:
    """protocol.ENQUEUE with its input rows read from `source` instead of its arrays.

    `source` is a FROM item named `input` with ENQUEUE's input columns
    (protocol.ENQUEUE_INPUT) and `ord`; everything else is the shipped statement.
    """
    from django_conveyor import protocol

    head, sep, rest = protocol.ENQUEUE.partition("FROM unnest(")
    _, on, tail = rest.partition("\nORDER BY ord")
    if not sep or not on:
        raise RuntimeError("protocol.ENQUEUE no longer reads the input this design edits")
    return f"{head}FROM {source.strip()}{on}{tail}"


# ENQUEUE before its input became typed arrays: a JSON recordset per call, in
# a CTE, inserted by a second CTE that the outer SELECT read (NOTIFY there).
RECORDSET_ENQUEUE = """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS t(
    task_path text, args jsonb, kwargs jsonb, queue text, backend text, priority int,
    max_attempts int, run_after timestamptz, idempotency_key text, ord int,
    pending int, policy text,
    gate jsonb,
    tags jsonb, meta jsonb,
    unique_key text, unique_period float8, unique_states jsonb, uniqueness jsonb,
    concurrency_key text
)
), inserted AS (
    INSERT INTO conveyor_job (
        task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
        run_after, enqueued_run_after, lease_version, idempotency_key, errors, enqueued_at,
        pending_dependencies, dependency_policy,
        gate, gate_deadline,
        tags, meta,
        unique_key, unique_window, unique_states, uniqueness, concurrency_key
    )
    SELECT task_path, args, kwargs, queue, backend, priority,
           CASE WHEN pending > 0 OR input.gate IS NOT NULL THEN 'blocked' ELSE 'available' END,
           0, max_attempts,
           COALESCE(run_after, now()), run_after, 0, idempotency_key, '[]'::jsonb, now(),
           pending, policy,
           gate, CASE WHEN input.gate IS NOT NULL AND pending = 0
               THEN COALESCE((input.gate ->> 'until')::timestamptz,
                    now() + make_interval(secs => (input.gate ->> 'seconds')::float8))
               ELSE NULL END,
           tags, meta,
           unique_key, CASE WHEN unique_period IS NOT NULL THEN to_timestamp(
               floor(extract(epoch FROM now())::float8 / unique_period) * unique_period) END,
           unique_states, uniqueness, concurrency_key
    FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, idempotency_key, queue, run_after, enqueued_at, state, unique_key
)
SELECT id, idempotency_key, enqueued_at, run_after, state, unique_key,
       CASE WHEN %(notify)s AND state = 'available' AND run_after <= now()
            THEN pg_notify(%(channel)s, queue) END
FROM inserted
"""


COPY_STAGE = """
CREATE TEMPORARY TABLE IF NOT EXISTS conveyor_enqueue_stage (
    ord int, task_path text, args jsonb, kwargs jsonb, queue text, backend text,
    priority int, max_attempts int, run_after timestamptz, idempotency_key text
) ON COMMIT DELETE ROWS
"""

STAGE_INPUT = """
(SELECT task_path, args, kwargs, queue, backend, priority, max_attempts, run_after,
        idempotency_key, ord, 0 AS pending, 'cancel'::text AS policy, NULL::jsonb AS gate,
        NULL::jsonb AS tags, NULL::jsonb AS meta, NULL::text AS unique_key,
        NULL::float8 AS unique_period, NULL::jsonb AS unique_states, NULL::jsonb AS uniqueness,
        NULL::text AS concurrency_key
 FROM conveyor_enqueue_stage) AS input
"""


def _job_rows(lo: int, n: int, keyed: bool) -> list[dict[str, Any]]:
    return [
        {
            "task_path": TASK_PATH,
            "args": [i],
            "kwargs": {},
            "queue": "default",
            "backend": "default",
            "priority": 0,
            "max_attempts": 5,
            "run_after": None,
            "idempotency_key": f"key-{i}" if keyed else None,
        }
        for i in range(lo, lo + n)
    ]


def _new_jobs(rows: list[dict[str, Any]]) -> list[Any]:
    from django_conveyor import protocol

    return [
        protocol.NewJob(
            r["task_path"], r["args"], r["kwargs"], r["queue"], r["backend"], r["priority"],
            r["max_attempts"], idempotency_key=r["idempotency_key"],
        )
        for r in rows
    ]  # fmt: skip


def enqueue_shipped(cur: Any, rows: list[dict[str, Any]]) -> int:
    """protocol.enqueue(), as the backend calls it."""
    from django_conveyor import protocol

    return len(protocol.enqueue(cur, _new_jobs(rows), notify=True))


def enqueue_recordset(cur: Any, rows: list[dict[str, Any]]) -> int:
    """ENQUEUE's logic with its input as one JSON document per call (what it was before)."""
    sent = [
        {**r, "ord": i, "pending": 0, "policy": "cancel", "args": r["args"], "kwargs": r["kwargs"]}
        for i, r in enumerate(rows)
    ]
    statement = tagged("recordset", RECORDSET_ENQUEUE)
    cur.execute(statement, {"rows": json.dumps(sent), "notify": True, "channel": "conveyor"})
    return len(cur.fetchall())


def enqueue_values(cur: Any, rows: list[dict[str, Any]]) -> int:
    (row,) = rows
    params = {**row, "args": json.dumps(row["args"]), "kwargs": json.dumps(row["kwargs"])}
    cur.execute(tagged("values", ENQUEUE_VALUES), {**params, "notify": True, "channel": "conveyor"})
    return len(cur.fetchall())


def enqueue_copy(cur: Any, rows: list[dict[str, Any]]) -> int:
    cur.execute(COPY_STAGE)
    columns = (
        "ord, task_path, args, kwargs, queue, backend, priority, max_attempts, idempotency_key"
    )
    with cur.copy(f"COPY conveyor_enqueue_stage ({columns}) FROM STDIN") as copy:
        for i, r in enumerate(rows):
            copy.write_row(
                (i, r["task_path"], json.dumps(r["args"]), json.dumps(r["kwargs"]), r["queue"],
                 r["backend"], r["priority"], r["max_attempts"], r["idempotency_key"])
            )  # fmt: skip
    statement = tagged("from-stage", enqueue_from(STAGE_INPUT))
    cur.execute(statement, {"notify": True, "channel": "conveyor"})
    return len(cur.fetchall())


def enqueue_arrays(cur: Any, rows: list[dict[str, Any]]) -> int:
    """ENQUEUE from typed arrays, which one job used before ENQUEUE_ONE."""
    from django_conveyor import protocol

    sent = [protocol._row(job, job, 0) for job in _new_jobs(rows)]
    cur.execute(tagged("arrays", protocol.ENQUEUE), protocol._enqueue_params(sent, True))
    return len(cur.fetchall())


def floor_insert(cur: Any, rows: list[dict[str, Any]]) -> int:
    cur.execute(tagged("floor", "INSERT INTO bench_floor (payload) VALUES (%s)"), ["[]"])
    return 1


@dataclass(frozen=True)
class EnqueueDesign:
    name: str
    why: str
    call: Callable[[Any, list[dict[str, Any]]], int]
    bulk: bool
    keyed: bool = False
    transaction: bool = False  # Wrap each call in BEGIN/COMMIT (COPY + INSERT needs it).
    ddl: tuple[str, ...] = field(default=())
    # Client-side binding (psycopg's ClientCursor, as Django's connections use by
    # default: the statement is planned on every call); else server-side binding
    # with prepared statements (Django's OPTIONS server_side_binding).
    client_binding: bool = True


_FLOOR = "bare INSERT + COMMIT, one index (the floor)"
# One claim index, and the admin's queue/task indexes on finished rows only:
# what a new ready job then writes (pkey, queue-led claim index, list index).
LEAN_ENQUEUE = (
    drop("conveyor_job_claim_idx")
    + recreate("conveyor_job_queue_id_idx", "queue, id", FINAL)
    + recreate("conveyor_job_task_id_idx", "task_path, id", FINAL)
)
ENQUEUE_DESIGNS = {
    d.name: d
    for d in (
        EnqueueDesign("floor", _FLOOR, floor_insert, bulk=False),
        EnqueueDesign("recordset-1", "ENQUEUE from a one-row JSON recordset (before)",
                      enqueue_recordset, bulk=False),
        EnqueueDesign("shipped-1", "protocol.enqueue(): ENQUEUE_ONE, a VALUES row",
                      enqueue_shipped, bulk=False),
        EnqueueDesign("shipped-1-prepared", "the same, server-side binding, prepared",
                      enqueue_shipped, bulk=False, client_binding=False),
        EnqueueDesign("values-1", "a single-row INSERT ... VALUES", enqueue_values, bulk=False),
        EnqueueDesign("arrays-1", "ENQUEUE from typed arrays, one job (before ENQUEUE_ONE)",
                      enqueue_arrays, bulk=False),
        EnqueueDesign("values-1-lean",
                      "single-row VALUES; one claim index, admin indexes on finished rows only",
                      enqueue_values, bulk=False, ddl=LEAN_ENQUEUE),
        EnqueueDesign("shipped-bulk-lean", "typed arrays per chunk; the lean indexes",
                      enqueue_shipped, bulk=True, ddl=LEAN_ENQUEUE),
        EnqueueDesign("recordset-1-keyed", "the same, keyed", enqueue_recordset, False, True),
        EnqueueDesign("shipped-1-keyed", "the same, keyed", enqueue_shipped, False, True),
        EnqueueDesign("values-1-keyed", "the same, keyed", enqueue_values, bulk=False, keyed=True),
        EnqueueDesign("recordset-bulk", "ENQUEUE from a JSON recordset per chunk (before)",
                      enqueue_recordset, bulk=True),
        EnqueueDesign("shipped-bulk", "protocol.enqueue(): typed arrays per chunk",
                      enqueue_shipped, bulk=True),
        EnqueueDesign(
            "copy-bulk", "COPY to a stage, INSERT ... SELECT", enqueue_copy, True, False, True
        ),
        EnqueueDesign("recordset-bulk-keyed", "keyed", enqueue_recordset, bulk=True, keyed=True),
        EnqueueDesign("shipped-bulk-keyed", "keyed", enqueue_shipped, bulk=True, keyed=True),
        EnqueueDesign("copy-bulk-keyed", "keyed", enqueue_copy, True, True, True),
    )
}  # fmt: skip


def measure_enqueue(design: EnqueueDesign, calls: int, chunk: int) -> dict[str, Any]:
    import psycopg

    dsn = fresh_database("conveyor_stmt_run")
    per_call = chunk if design.bulk else 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.prepare_threshold = 2
        for statement in design.ddl:
            conn.execute(statement)
        conn.execute("ALTER TABLE conveyor_job SET (autovacuum_enabled = false)")
        conn.execute("CHECKPOINT")
        conn.execute("SELECT pg_stat_statements_reset()")
        before = counters(conn)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        server_cpu = backend_cpu_s(pid)
        written = 0
        started = time.perf_counter()
        cpu = time.process_time()
        cursor = psycopg.ClientCursor(conn) if design.client_binding else conn.cursor()
        with cursor as cur:
            for i in range(calls):
                rows = _job_rows(i * per_call, per_call, design.keyed)
                if design.transaction:
                    with conn.transaction():
                        written += design.call(cur, rows)
                else:
                    written += design.call(cur, rows)
        window = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server_cpu = backend_cpu_s(pid) - server_cpu
        time.sleep(0.3)
        after = counters(conn)
        wal = wal_breakdown(conn, before.lsn, after.lsn)
        stats = statement_stats(conn)
    admin("DROP DATABASE conveyor_stmt_run WITH (FORCE)")
    n = calls * per_call
    if written != n:
        raise RuntimeError(f"{design.name}: {written} of {n} rows came back")
    server_us = sum(s["exec_ms"] + s["plan_ms"] for s in stats.values()) * 1000 / n
    return {
        "design": design.name,
        "jobs": n,
        "per_call": per_call,
        "jobs_per_s": n / window,
        "calls_per_s": calls / window,
        "client_cpu_us_per_job": cpu / n * 1e6,
        "server_us_per_job": server_us,
        "server_cpu_us_per_job": server_cpu / n * 1e6,
        "wal_bytes_per_job": wal["bytes"] / n,
        "wal_bytes_per_job_without_fpi": (wal["bytes"] - wal["fpi_bytes"]) / n,
        "index_entries_per_job": wal["index_entries"] / n,
        "statements": per_job(stats, n),
    }


# ---------------------------------------------------------------- the reaper


def measure_reap(n: int, batch: int) -> dict[str, Any]:
    """n running jobs whose leases expired, taken back by protocol.reap() in batches."""
    import psycopg

    from django_conveyor import protocol

    dsn = fresh_database("conveyor_stmt_run")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE conveyor_job SET (autovacuum_enabled = false)")
        load_jobs(conn, n)
        conn.execute(
            "UPDATE conveyor_job SET state = 'running', attempt = 1, lease_owner = 'dead:1',"
            " lease_version = 1, started_at = now(),"
            " lease_expires_at = now() - interval '1 minute'"
        )
        conn.execute("VACUUM ANALYZE conveyor_job")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        cpu = backend_cpu_s(pid)
        passes, started, per_pass = 0, time.perf_counter(), []
        while True:
            t0 = time.perf_counter()
            with conn.transaction(), conn.cursor() as cur:
                reaped = protocol.reap(cur, limit=batch)
            per_pass.append(time.perf_counter() - t0)
            if not reaped:
                break
            passes += 1
        window = time.perf_counter() - started
        cpu = backend_cpu_s(pid) - cpu
        back = conn.execute(
            "SELECT count(*) FROM conveyor_job WHERE state = 'available' AND isolated"
        ).fetchone()[0]
    admin("DROP DATABASE conveyor_stmt_run WITH (FORCE)")
    if back != n:
        raise RuntimeError(f"reap: {back} of {n} jobs back")
    return {
        "jobs": n,
        "batch": batch,
        "passes": passes,
        "seconds": window,
        "jobs_per_s": n / window,
        "server_cpu_us_per_job": cpu / n * 1e6,
        "pass_ms_median": statistics.median(per_pass) * 1000,
        "server_us_per_job": window / n * 1e6,
        "wal_bytes_per_job": float("nan"),
        "index_entries_per_job": float("nan"),
    }


# ---------------------------------------------------------------- the run


def interleaved(
    names: list[str], rounds: int, run: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            out = run(name)
            out["round"] = r
            out["load"] = os.getloadavg()[0]
            results[name].append(out)
            print(
                f"round {r} {name:22} {out['jobs_per_s']:>9,.0f} jobs/s"
                f"  server {out['server_us_per_job']:6.1f} µs/job"
                f" (CPU {out.get('server_cpu_us_per_job', float('nan')):5.1f})"
                f"  WAL {out['wal_bytes_per_job']:7.0f} B/job"
                f"  index entries {out['index_entries_per_job']:5.2f}/job  load {out['load']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    return results


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, runs in results.items():
        keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and k != "round"]
        out[name] = {k: statistics.median(r[k] for r in runs) for k in keys}
        out[name]["jobs_per_s_runs"] = [round(r["jobs_per_s"]) for r in runs]
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", default="drain,enqueue")
    ap.add_argument("--designs", default="", help="drain designs (default all)")
    ap.add_argument("--enqueue-designs", default="", help="enqueue designs (default all)")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000, help="single enqueue calls per design")
    ap.add_argument("--bulk-calls", type=int, default=10, help="bulk calls per design")
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--pg-dir", type=Path, default=REPO / "var" / "statement-pg")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    os.environ.pop("DATABASE_URL", None)  # our own server, never the suite's or another
    os.environ["CONVEYOR_DATA_DIR"] = str(args.pg_dir.resolve())
    os.environ["CONVEYOR_DB_NAME"] = TEMPLATE
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    ensure_server(args.pg_dir.resolve())
    import django

    django.setup()
    make_template()
    parts = set(args.part.split(","))
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "cpus": os.cpu_count(),
    }
    try:
        if "drain" in parts:
            names = args.designs.split(",") if args.designs else list(DESIGNS)
            runs = interleaved(
                names,
                args.rounds,
                lambda name: measure_drain(DESIGNS[name], args.jobs, args.batch, args.processes),
            )
            result["drain"] = {"runs": runs, "median": summary(runs)}
        if "reap" in parts:
            batches = [500, 1000, 2000]
            runs = interleaved(
                [str(b) for b in batches],
                args.rounds,
                lambda name: measure_reap(args.jobs, int(name)),
            )
            result["reap"] = {"runs": runs, "median": summary(runs)}
        if "enqueue" in parts:
            names = (
                args.enqueue_designs.split(",") if args.enqueue_designs else list(ENQUEUE_DESIGNS)
            )

            def one(name: str) -> dict[str, Any]:
                design = ENQUEUE_DESIGNS[name]
                calls = args.bulk_calls if design.bulk else args.calls
                return measure_enqueue(design, calls, args.chunk)

            runs = interleaved(names, args.rounds, one)
            result["enqueue"] = {"runs": runs, "median": summary(runs)}
    finally:
        admin(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"statement-limit-{result['date'][:19].replace(':', '')}.json"
        path.write_text(text + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
