"""The `gates` scenario: workflows that wait for signals, under kill -9 and PostgreSQL restarts.

Each workflow is three jobs: `a`, a handler of two checkpointed steps (each
writes a business row labelled with its step) and then the usual effect;
`g`, a gate that waits for the signal `go`; `b`, a step after the gate. A
signaller thread sends each waiting gate its signal (and then the same
signal again, which must be refused) while the injectors kill workers and
restart the server. The run passes only if every workflow completed, no `b`
started before its gate completed, no checkpointed step wrote its row
twice (or a completed `a` missed one), and every second signal was refused.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from . import pg

SIGNAL = "go"
GATE = {"kind": "signal", "signal": SIGNAL, "on_timeout": "fail", "policy": "cancel"}
SHAPE = ("a", "g", "b")
SIGNAL_PAUSE_SECONDS = 0.2

WAITING = """
SELECT id FROM conveyor_job
WHERE state = 'blocked' AND gate IS NOT NULL AND pending_dependencies = 0
ORDER BY id LIMIT 50
"""

CHECKS = """
SELECT
  (SELECT count(*) FROM conveyor_job AS b JOIN conveyor_dependency AS d ON d.job_id = b.id
   JOIN conveyor_job AS g ON g.id = d.depends_on_id
   WHERE g.gate IS NOT NULL AND b.state = 'completed' AND g.state = 'completed'),
  (SELECT count(*) FROM conveyor_job AS b JOIN conveyor_dependency AS d ON d.job_id = b.id
   JOIN conveyor_job AS g ON g.id = d.depends_on_id
   WHERE g.gate IS NOT NULL AND (b.started_at < g.finished_at OR g.finished_at IS NULL)
     AND b.started_at IS NOT NULL),
  (SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM testapp_effect
   WHERE label LIKE 'step-%%' GROUP BY job_id, label) AS s),
  (SELECT count(*) FROM conveyor_job AS a
   WHERE a.task_path = %(step_task)s AND a.state = 'completed'
     AND (SELECT count(DISTINCT label) FROM testapp_effect AS e
          WHERE e.job_id = a.id AND e.label LIKE 'step-%%') <> 2),
  (SELECT count(*) FROM conveyor_ledger WHERE effect_key LIKE 'checkpoint:%%')
"""


def enqueue(cur: Any, *, rng: Any, workflows: int, work: tuple[float, float], queue: str,
            attempts: int) -> None:  # fmt: skip
    from django_conveyor import protocol

    from .tasks import GATED_STEP_PATH, STEP_PATH

    def job(task_path: str, args: list[Any], kwargs: dict[str, Any], after: tuple[int, ...],
            gate: dict[str, Any] | None = None) -> Any:  # fmt: skip
        return protocol.NewJob(
            task_path=task_path, args=args, kwargs=kwargs, queue=queue, backend="default",
            priority=0, max_attempts=attempts, depends_on=after, gate=gate,
        )  # fmt: skip

    def pause() -> float:
        return round(rng.uniform(*work), 3)

    a = protocol.enqueue(
        cur, [job(GATED_STEP_PATH, [pause(), pause()], {"workflow": w}, ())
              for w in range(workflows)], notify=True,
    )  # fmt: skip
    g = protocol.enqueue(
        cur, [job("django_conveyor.workflows.gates.signal", [], {"workflow": w}, (a[w].id,), GATE)
              for w in range(workflows)], notify=True,
    )  # fmt: skip
    protocol.enqueue(
        cur, [job(STEP_PATH, [pause(), 0.0], {"workflow": w, "step": "b"}, (g[w].id,))
              for w in range(workflows)], notify=True,
    )  # fmt: skip


class Signaller(threading.Thread):
    """Sends each waiting gate its signal, then the same signal again; rides out restarts."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        super().__init__(name="signaller", daemon=True)
        self.port = port
        self.stop = stop
        self.sent = 0
        self.refused_again = 0
        self.accepted_again = 0
        self.errors = 0

    def run(self) -> None:
        from django_conveyor import protocol

        while not self.stop.is_set():
            try:
                with pg.connect(self.port) as conn:
                    while not self.stop.is_set():
                        with conn.transaction(), conn.cursor() as cur:
                            ids = [row[0] for row in cur.execute(WAITING).fetchall()]
                        for gate_id in ids:
                            for again in (False, True):
                                with conn.transaction(), conn.cursor() as cur:
                                    state = protocol.signal(
                                        cur, gate_id=gate_id, name=SIGNAL, payload='{"n": 1}',
                                        actor="faults",
                                    )  # fmt: skip
                                if again:
                                    self.refused_again += state is None
                                    self.accepted_again += state is not None
                                else:
                                    self.sent += state is not None
                        time.sleep(SIGNAL_PAUSE_SECONDS)
            except psycopg.Error:
                self.errors += 1  # The server restarted (or the connection dropped): again.
                time.sleep(SIGNAL_PAUSE_SECONDS)


def check(conn: psycopg.Connection, workflows: int, signaller: Signaller) -> dict[str, Any]:
    from .tasks import GATED_STEP_PATH

    done, early, twice, missing, records = conn.execute(
        CHECKS, {"step_task": GATED_STEP_PATH}
    ).fetchone()  # type: ignore[misc]
    return {
        "workflows": workflows,
        "workflows_completed": done,
        "steps_before_their_gate": early,
        "checkpointed_steps_applied_twice": int(twice),
        "completed_steps_missing_a_checkpoint": missing,
        "checkpoint_records": records,
        "signals_sent": signaller.sent,
        "second_signals_refused": signaller.refused_again,
        "second_signals_accepted": signaller.accepted_again,
        "signaller_reconnects": signaller.errors,
    }


def failures(figures: dict[str, Any]) -> list[str]:
    failed = []
    if figures["workflows_completed"] != figures["workflows"]:
        failed.append(f"{figures['workflows'] - figures['workflows_completed']} workflow(s) "
                      "did not complete.")  # fmt: skip
    if figures["steps_before_their_gate"]:
        failed.append(f"{figures['steps_before_their_gate']} step(s) started before their gate.")
    if figures["checkpointed_steps_applied_twice"]:
        failed.append(f"{figures['checkpointed_steps_applied_twice']} checkpointed step(s) wrote "
                      "their effect twice.")  # fmt: skip
    if figures["completed_steps_missing_a_checkpoint"]:
        failed.append("A completed checkpointed job misses a step's effect.")
    if figures["second_signals_accepted"]:
        failed.append(f"{figures['second_signals_accepted']} second signal(s) were accepted.")
    return failed
