"""Fewer index entries per claim, completion and heartbeat (docs/performance.md,
"A cheaper limit: the job table's layout").

A claim or a completion changes `state`, which the partial indexes'
predicates read, so it is never a HOT update: the new row version gets an
entry in every index whose predicate it meets. The admin's and the API's
secondary indexes (queue, task, and the list index of (state, queue, id))
covered every row, so each job wrote into each of them on enqueue, claim and
completion, and again on every heartbeat (a new lease_expires_at is a new
version). They now leave running rows out (`state <> 'running'`), so only
the completion writes there. Running rows are read through the running
index instead, which now leads with the queue, so the reads of one queue's
running jobs (a limit's count, the counts per queue, the lists) stay a
range of that queue, and the reaper reads every running row (there are as
many as leases held) and sorts the expired ones.

Each new index is built (CONCURRENTLY, so enqueues and claims go on) under
a temporary name before the old one is dropped, then takes its name: no
query is ever without its index. Reversible: the reverse builds the old
indexes the same way.

Fillfactor stays at 100 (see the performance page for the figures): free
space in a page lets a new version stay on its page (less WAL, no extra
row lock record), but no state change can be HOT, so it saves no index
entry, and the finished history, most of the table, would keep that space
empty for good.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

NOT_RUNNING = models.Q(("state", "running"), _negated=True)

NEW = {
    "conveyor_job_reap_idx": models.Index(
        models.F("queue"),
        models.F("lease_expires_at"),
        condition=models.Q(("state", "running")),
        name="conveyor_job_reap_idx",
    ),
    "conveyor_job_queue_id_idx": models.Index(
        models.F("queue"), models.F("id"), condition=NOT_RUNNING, name="conveyor_job_queue_id_idx"
    ),
    "conveyor_job_task_id_idx": models.Index(
        models.F("task_path"),
        models.F("id"),
        condition=NOT_RUNNING,
        name="conveyor_job_task_id_idx",
    ),
    "conveyor_job_list_idx": models.Index(
        fields=["state", "queue", "id"], condition=NOT_RUNNING, name="conveyor_job_list_idx"
    ),
}


def replaced(name: str, index: models.Index) -> list[migrations.operations.base.Operation]:
    """Build `index` beside the one named `name`, drop that one, take its name."""
    building = index.clone()
    building.name = f"{name}_new"  # At most 30 characters, as Django's index names.
    return [
        AddIndexConcurrently(model_name="job", index=building),
        RemoveIndexConcurrently(model_name="job", name=name),
        migrations.RenameIndex(model_name="job", new_name=name, old_name=building.name),
    ]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction.

    dependencies = [
        ("conveyor", "0015_flow_control"),
    ]

    operations = [op for name, index in NEW.items() for op in replaced(name, index)]
