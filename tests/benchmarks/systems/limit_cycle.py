"""The physical limit's cycle, shared by the `limit` workload and statement_limit.py.

One psycopg connection in a loop: in one transaction, complete the batch
claimed by the previous cycle and claim the next, as the worker's control
loop does, but with no handler, no threads and jsonb/timestamps left as
text, so what is measured is what PostgreSQL needs for the statements.

A `Statements` says which SQL runs. The shipped pair is protocol.CLAIM and
protocol.COMPLETE; the statement harness (tests/benchmarks/statement_limit.py)
passes candidate designs: other statements, other parameter shapes, or one
statement that completes and claims at once (`fused`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Row = Sequence[Any]
# Claimed rows (id first, the fencing version at `version_at`) -> COMPLETE's parameters.
HeldParams = Callable[[Sequence[Row], int], dict[str, Any]]


def held_json(rows: Sequence[Row], version_at: int) -> dict[str, Any]:
    """COMPLETE's shipped parameter: one JSON recordset of (id, version, return_value)."""
    held = [{"id": r[0], "version": r[version_at], "return_value": None} for r in rows]
    # notify/channel: what COMPLETE's unblock of dependents needs (unused by other SQL).
    return {"held": json.dumps(held, separators=(",", ":")), "notify": True, "channel": "conveyor"}


@dataclass(frozen=True)
class Statements:
    claim: str  # Claims up to %(limit)s rows for %(owner)s; with `fused`, completes too.
    complete: str | None = None  # None when `fused`.
    held: HeldParams = held_json
    fused: bool = False  # `claim` also completes the held batch: one statement per cycle.
    after_complete: str | None = None  # A statement run after COMPLETE with %(ids)s (UNBLOCK).
    per_cycle: str | None = None  # One more statement per cycle, with %(owner)s.
    version_at: int = 9  # Column of the fencing version in the claim's rows.


def shipped(protocol: Any, claim: str | None = None) -> Statements:
    return Statements(claim=claim or protocol.CLAIM, complete=protocol.COMPLETE)


def _after_params(held: Sequence[Row]) -> dict[str, Any]:
    return {"ids": sorted(r[0] for r in held), "notify": True, "channel": "conveyor"}


def connect(url: str) -> Any:
    import psycopg
    from psycopg.types.string import TextLoader

    conn = psycopg.connect(url, autocommit=True)
    conn.prepare_threshold = 2  # as the worker's connection
    for name in ("jsonb", "json", "timestamptz"):  # no decoding: the SQL, not Python
        conn.adapters.register_loader(name, TextLoader)
    return conn


def run_cycles(
    conn: Any,
    stmts: Statements,
    *,
    owner: str,
    batch: int,
    pipeline: bool,
    queues: Sequence[str] = ("default",),
    lease: float = 300.0,
) -> int:
    """Claim and complete until nothing is left; returns the cycles run."""
    claim_params: dict[str, Any] = {
        "queues": list(queues),
        "limit": batch,
        "owner": owner,
        "lease": lease,
    }
    held: Sequence[Row] = ()
    cycles = 0
    complete_cur, claim_cur, after_cur = conn.cursor(), conn.cursor(), conn.cursor()
    while True:
        cycles += 1
        done = {"owner": owner, **stmts.held(held, stmts.version_at)} if held else None
        if stmts.fused:
            # One statement is its own transaction in autocommit: no BEGIN/COMMIT.
            params = {**claim_params, **(done or stmts.held((), stmts.version_at))}
            claim_cur.execute(stmts.claim, params)
            rows = [r for r in claim_cur.fetchall() if r[0] is not None]
        elif pipeline:
            with conn.pipeline() as pipe:
                conn.execute("BEGIN")
                if done:
                    complete_cur.execute(stmts.complete, done)
                    if stmts.after_complete:
                        after_cur.execute(stmts.after_complete, _after_params(held))
                claim_cur.execute(stmts.claim, claim_params)
                if stmts.per_cycle:
                    after_cur.execute(stmts.per_cycle, {"owner": owner})
                conn.execute("COMMIT")
                pipe.sync()
                rows = claim_cur.fetchall()
        else:  # what a plain psycopg transaction costs: BEGIN, statements, COMMIT
            with conn.transaction():
                if done:
                    complete_cur.execute(stmts.complete, done)
                    if stmts.after_complete:
                        after_cur.execute(stmts.after_complete, _after_params(held))
                claim_cur.execute(stmts.claim, claim_params)
                rows = claim_cur.fetchall()
        if not rows:
            return cycles
        held = rows
