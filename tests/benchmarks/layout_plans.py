"""EXPLAIN ANALYZE of the reads that the job table's layout (migration 0016) serves.

    .venv-3.12/bin/python tests/benchmarks/admin_scale.py      # builds the data set once
    .venv-3.12/bin/python tests/benchmarks/layout_plans.py [-v]

On admin_scale's database (10^6 finished jobs, 11,000 ready, 50 running), each
read of running rows, and each read of the secondary indexes that leave them
out, with the index it uses, whether any node is a sequential scan, and its
execution time. `-v` prints the plans. Not a test: docs/performance.md
("A cheaper limit") quotes it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# ruff: noqa: E501  (one statement a line, as EXPLAIN prints them)
QUERIES = {
    "admin queue=emails, not running part": "SELECT id FROM conveyor_job WHERE queue='emails' AND NOT (state='running') ORDER BY id DESC LIMIT 100",
    "admin queue=emails, running part": "SELECT id FROM conveyor_job WHERE queue='emails' AND state='running' ORDER BY id DESC LIMIT 100",
    "admin task, not running part": "SELECT id FROM conveyor_job WHERE task_path='tests.testapp.tasks.send_email' AND NOT (state='running') ORDER BY id DESC LIMIT 100",
    "admin task, running part": "SELECT id FROM conveyor_job WHERE task_path='tests.testapp.tasks.send_email' AND state='running' ORDER BY id DESC LIMIT 100",
    "admin count queue=emails not running": "SELECT count(*) FROM (SELECT 1 FROM conveyor_job WHERE queue='emails' AND NOT (state='running') LIMIT 10001) s",
    "admin state=available": "SELECT id FROM conveyor_job WHERE state='available' AND NOT (state='running') ORDER BY id DESC LIMIT 100",
    "CLAIM_LIMITED running count": "SELECT count(*) FROM conveyor_job AS r WHERE r.state = 'running' AND r.queue = 'emails'",
    "REAP": "SELECT id, lease_owner FROM conveyor_job WHERE state = 'running' AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT 100 FOR UPDATE SKIP LOCKED",
    "QUEUES_IN_STATE running (first step)": "SELECT queue FROM conveyor_job WHERE state = 'running' ORDER BY queue LIMIT 1",
    "API state=running&queue=emails": "SELECT id FROM conveyor_job j WHERE j.state='running' AND j.queue='emails' AND j.id < 9223372036854775807 ORDER BY j.id DESC LIMIT 51",
    "API task only, not running part": "SELECT id FROM conveyor_job j WHERE j.id < 9223372036854775807 AND j.state <> 'running' AND j.task_path = 'tests.testapp.tasks.send_email' ORDER BY j.id DESC LIMIT 51",
    "COUNT_LIVE not running": "SELECT queue, state, count(*) FROM conveyor_job WHERE state = ANY(ARRAY['blocked','available','running']) AND state <> 'running' GROUP BY queue, state",
    "COUNT_LIVE running": "SELECT queue, 'running', count(*) FROM conveyor_job WHERE state = 'running' AND 'running' = ANY(ARRAY['blocked','available','running']) GROUP BY queue",
    "prune queues": "SELECT DISTINCT queue FROM conveyor_job WHERE state IN ('completed','failed','dead','cancelled')",
    "dead letters queue=emails": "SELECT id FROM conveyor_job WHERE state IN ('failed','dead') AND queue='emails' AND NOT (state='running') ORDER BY id DESC LIMIT 100",
}


def main() -> int:
    import environ
    import psycopg

    from django_conveyor import embedded

    cfg = environ.Env.db_url_config(embedded.start(REPO / "var" / "pg-admin-bench"))
    params = {"host": cfg["HOST"], "port": cfg["PORT"], "user": cfg["USER"]}
    with psycopg.connect(**params, dbname="conveyor_admin_bench") as conn:
        for name, sql in QUERIES.items():
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) " + sql)
            text = [row[0] for row in rows.fetchall()]
            conn.rollback()
            used = {t.split(" using ")[1].split(" ")[0] for t in text if " using " in t}
            used |= {t.split(" on ")[1].split(" ")[0] for t in text if "Bitmap Index Scan on" in t}
            seq = " SEQ SCAN" if any("Seq Scan" in t for t in text) else ""
            took = next(t for t in text if "Execution Time" in t).strip()
            print(f"{name:42} {', '.join(sorted(used)) or '-':34}{seq} {took}")
            if "-v" in sys.argv:
                print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
