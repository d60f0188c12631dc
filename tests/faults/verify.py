"""What a run proved: the database's final word, and what the workers logged.

Everything here reads the harness's own PostgreSQL directly (not through
the fault proxy) after the workers have stopped.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

FINAL_STATES = ("completed", "failed", "dead", "cancelled")

STATES = "SELECT state, count(*) FROM conveyor_job GROUP BY state"

ATTEMPTS = """
SELECT coalesce(sum(attempt), 0), coalesce(max(attempt), 0),
       count(*) FILTER (WHERE attempt > max_attempts)
FROM conveyor_job
"""

# Rows beyond the first, per job: in the ledger and in the business table (the
# handler's effect; the gates scenario's checkpointed steps are checked by gates.py).
DUPLICATES = """
SELECT
  (SELECT coalesce(sum(n - 1), 0) FROM
     (SELECT count(*) AS n FROM conveyor_ledger WHERE effect_key = 'fault-effect'
      GROUP BY job_id) AS l),
  (SELECT coalesce(sum(n - 1), 0) FROM
     (SELECT count(*) AS n FROM testapp_effect WHERE label = 'fault-effect'
      GROUP BY job_id) AS e)
"""

# Completed jobs that lack their effect (a completion without its commit).
MISSING = """
SELECT count(*) FROM conveyor_job AS j
WHERE j.state = 'completed' AND j.gate IS NULL
  AND (NOT EXISTS (SELECT 1 FROM conveyor_ledger AS l
                   WHERE l.job_id = j.id AND l.effect_key = 'fault-effect')
       OR NOT EXISTS (SELECT 1 FROM testapp_effect AS e
                      WHERE e.job_id = j.id AND e.label = 'fault-effect'))
"""

# Jobs with an effect written under a token that was not the one that
# completed the job: a different version or owner, or a job not completed.
FENCING = """
SELECT count(DISTINCT j.id) FROM conveyor_job AS j
LEFT JOIN conveyor_ledger AS l ON l.job_id = j.id AND l.effect_key = 'fault-effect'
LEFT JOIN testapp_effect AS e ON e.job_id = j.id AND e.label = 'fault-effect'
WHERE (l.id IS NOT NULL OR e.id IS NOT NULL)
  AND (j.state <> 'completed'
       OR (l.id IS NOT NULL AND (l.lease_version <> j.lease_version OR l.worker <> j.lease_owner))
       OR (e.id IS NOT NULL AND (e.token <> j.lease_version OR e.worker <> j.lease_owner)))
"""

# Edges whose dependent wrote its effect before its dependency wrote its own
# (or without it). Ids come from a sequence at insert time, and a dependent
# inserts only after it was claimed, after its dependency's commit. Attempts
# that ran early and were rolled back are caught by the handler itself: it
# is discarded when its dependency_results show an unfinished dependency.
EARLY_STEPS = """
WITH firsts AS (
    SELECT job_id, min(id) AS first, max(id) AS last FROM testapp_effect GROUP BY job_id
)
SELECT count(*) FROM conveyor_dependency AS d
JOIN firsts AS j ON j.job_id = d.job_id
LEFT JOIN firsts AS p ON p.job_id = d.depends_on_id
WHERE p.last IS NULL OR j.first < p.last
"""

WORKFLOWS_COMPLETED = """
SELECT count(*) FROM (
    SELECT kwargs->>'workflow' FROM conveyor_job
    GROUP BY kwargs->>'workflow'
    HAVING bool_and(state = 'completed') AND count(*) = %(steps)s
) AS done
"""

FINAL_TOKENS = "SELECT id, state, lease_version FROM conveyor_job WHERE id = ANY(%(ids)s)"

# A refused outcome: the fence rejected it, or the worker knew its lease was gone,
# or the guarded transaction found another token. "done_in_atomic" is not one:
# that commit held (older workers mislabelled it when a heartbeat raced it).
STALE_LINE = re.compile(
    r"job=(\d+) .*?token=(\d+) (?:stale outcome \((?!done_in_atomic)|raised LeaseLost)"
)
LEASE_LOST_LINE = re.compile(r"job=(\d+) .*?token=(\d+) lease lost")
STATS_LINE = re.compile(r"worker (\S+) stopped: (\{.*\})\s*$")
RECONNECT_LINE = re.compile(r"database unavailable")


@dataclass(slots=True)
class LogFacts:
    stale: set[tuple[int, int]] = field(default_factory=set)  # (job, token) refused
    leases_lost: set[tuple[int, int]] = field(default_factory=set)
    reconnects: int = 0
    stats: Counter[str] = field(default_factory=Counter)  # summed final stats lines
    clean_exits: int = 0


def read_logs(paths: Iterable[Path]) -> LogFacts:
    facts = LogFacts()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if match := STALE_LINE.search(line):
                facts.stale.add((int(match[1]), int(match[2])))
            elif match := LEASE_LOST_LINE.search(line):
                facts.leases_lost.add((int(match[1]), int(match[2])))
            elif RECONNECT_LINE.search(line):
                facts.reconnects += 1
            elif match := STATS_LINE.search(line):
                facts.clean_exits += 1
                facts.stats.update(ast.literal_eval(match[2]))
    return facts


def check(conn: psycopg.Connection, jobs: int, facts: LogFacts) -> dict[str, Any]:
    """The figures of the run and the pass criteria they meet or fail."""
    states = dict(conn.execute(STATES).fetchall())
    attempts, max_attempt, over_max = conn.execute(ATTEMPTS).fetchone()  # type: ignore[misc]
    dup_ledger, dup_effects = conn.execute(DUPLICATES).fetchone()  # type: ignore[misc]
    (missing,) = conn.execute(MISSING).fetchone()  # type: ignore[misc]
    (fencing,) = conn.execute(FENCING).fetchone()  # type: ignore[misc]
    confirmed = confirm_stale(conn, facts.stale)
    completed = states.get("completed", 0)
    lost = sum(n for state, n in states.items() if state not in FINAL_STATES)
    figures: dict[str, Any] = {
        "jobs": jobs,
        "completed": completed,
        "lost": lost,
        "duplicate_effects": int(dup_ledger) + int(dup_effects),
        "stale_outcomes_rejected": len(facts.stale),
        "fencing_violations": fencing,
        "missing_effects": missing,
        "states": states,
        "duplicate_ledger_entries": int(dup_ledger),
        "duplicate_business_rows": int(dup_effects),
        "stale_outcomes_confirmed_by_db": confirmed,
        "leases_lost_seen_by_workers": len(facts.leases_lost),
        "attempts_total": int(attempts),
        "attempts_max": max_attempt,
        "attempts_over_max": over_max,
        "worker_reconnects_logged": facts.reconnects,
        "worker_clean_exits": facts.clean_exits,
        "worker_stats_of_clean_exits": dict(sorted(facts.stats.items())),
    }
    return figures


HEADLINE = (
    "jobs",
    "completed",
    "lost",
    "duplicate_effects",
    "stale_outcomes_rejected",
    "fencing_violations",
)


def headline(figures: dict[str, Any]) -> dict[str, Any]:
    """Take the counts every run's JSON opens with out of figures, in their order."""
    return {k: figures.pop(k) for k in HEADLINE}


def check_workflows(conn: psycopg.Connection, workflows: int) -> dict[str, Any]:
    """Workflow mode: every workflow completed, and no step ran before its dependencies."""
    steps = conn.execute("SELECT count(*) FROM conveyor_job").fetchone()[0] // workflows  # type: ignore[index]
    (completed,) = conn.execute(WORKFLOWS_COMPLETED, {"steps": steps}).fetchone()  # type: ignore[misc]
    (early,) = conn.execute(EARLY_STEPS).fetchone()  # type: ignore[misc]
    (edges,) = conn.execute("SELECT count(*) FROM conveyor_dependency").fetchone()  # type: ignore[misc]
    return {
        "workflows": workflows,
        "workflows_completed": completed,
        "dependency_edges": edges,
        "steps_before_their_dependencies": early,
    }


def confirm_stale(conn: psycopg.Connection, stale: set[tuple[int, int]]) -> int:
    """Refusals the data agrees with: a newer token took the job, or it was already final.

    The second case is a commit whose acknowledgement was lost with the
    connection: the job completed under that token, and the worker's
    fallback retry write was (rightly) refused.
    """
    if not stale:
        return 0
    rows = conn.execute(FINAL_TOKENS, {"ids": sorted({job for job, _ in stale})}).fetchall()
    final = {id_: (state, version) for id_, state, version in rows}
    agreed = 0
    for job, token in stale:
        state, version = final.get(job, (None, -1))
        agreed += version > token or (version == token and state in FINAL_STATES)
    return agreed


def failures(figures: dict[str, Any], *, require_stale: bool) -> list[str]:
    """The pass criteria this run failed, as sentences (empty: it passed)."""
    failed = []
    if figures["completed"] != figures["jobs"]:
        failed.append(f"{figures['jobs'] - figures['completed']} job(s) did not complete.")
    if figures["lost"]:
        failed.append(f"{figures['lost']} job(s) were not final at the deadline.")
    if figures["duplicate_effects"]:
        failed.append(f"{figures['duplicate_effects']} effect(s) were applied twice.")
    if figures["fencing_violations"]:
        failed.append(f"{figures['fencing_violations']} job(s) have an effect from a stale token.")
    if figures["missing_effects"]:
        failed.append(f"{figures['missing_effects']} completed job(s) have no effect.")
    if (flows := figures.get("workflows")) is not None:
        if flows["workflows_completed"] != flows["workflows"]:
            failed.append(
                f"{flows['workflows'] - flows['workflows_completed']} workflow(s) did not complete."
            )
        if flows["steps_before_their_dependencies"]:
            failed.append(
                f"{flows['steps_before_their_dependencies']} step(s) ran before a dependency "
                "completed."
            )
    if require_stale and not figures["stale_outcomes_rejected"]:
        failed.append("No stale outcome was rejected: the zombies never came back to write.")
    return failed


LEASE_LOST = "django_conveyor.exceptions.LeaseLost"
FROZEN_JOBS = "SELECT id, state, lease_version, errors FROM conveyor_job WHERE id = ANY(%(ids)s)"


def frozen_inside_atomic(conn: psycopg.Connection, freezes: list[dict[str, Any]]) -> dict[str, Any]:
    """For each worker frozen inside its guarded transaction: was the job taken back, and when?

    `at` is the database's clock at the freeze; the reaper's error entry for
    the frozen token carries the database's clock when it took the job back.
    """
    ids = sorted({f["job"] for f in freezes})
    rows = {r[0]: r[1:] for r in conn.execute(FROZEN_JOBS, {"ids": ids}).fetchall()}
    reaped_after: list[float] = []
    committed, not_reaped = [], []
    for f in freezes:
        state, final_token, errors = rows[f["job"]]
        if state == "completed" and final_token == f["token"]:
            committed.append(f["job"])  # The frozen attempt's own commit landed.
            continue
        entry = next(
            (e for e in errors if e.get("token") == f["token"]
             and e.get("exception_class_path") == LEASE_LOST), None,
        )  # fmt: skip
        if entry is None:
            not_reaped.append(f["job"])
            continue
        taken = datetime.fromisoformat(entry["time"]) - f["at"]
        reaped_after.append(round(taken.total_seconds(), 2))
    reaped_after.sort()
    return {
        "freezes": len(freezes),
        "reaped": len(reaped_after),
        "frozen_attempt_committed": committed,
        "not_reaped": not_reaped,
        "reaped_after_s": {
            "min": reaped_after[0] if reaped_after else None,
            "median": reaped_after[len(reaped_after) // 2] if reaped_after else None,
            "max": reaped_after[-1] if reaped_after else None,
        },
    }


def atomic_failures(frozen: dict[str, Any]) -> list[str]:
    failed = []
    if not frozen["freezes"]:
        failed.append("No worker was frozen inside context.atomic().")
    if frozen["frozen_attempt_committed"]:
        failed.append(
            f"Jobs {frozen['frozen_attempt_committed']} waited for their frozen worker and were "
            "completed by it when it was continued: the guarded transaction was not bounded."
        )
    if frozen["not_reaped"]:
        failed.append(f"Jobs frozen inside context.atomic() never reaped: {frozen['not_reaped']}.")
    return failed
