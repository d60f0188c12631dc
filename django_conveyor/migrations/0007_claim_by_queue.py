"""A claim index led by the queue, for workers that serve one queue.

`conveyor_job_claim_idx` orders ready rows by priority, run_after and id
across every queue, so a worker of one queue walked past every ready row of
other queues that came first in that order (10^6 of them made each claim
O(10^6)). Led by the queue, the same order within one queue is a range of
this index, and CLAIM names a lone queue as a constant so the planner can
use it. Partial on `available`, like the claim index: a row enters it when
it becomes ready and is left behind when it is claimed, so it costs one
index entry per enqueue (and per retry or requeue), nothing at completion.

Built CONCURRENTLY, so a busy conveyor_job keeps taking writes; that cannot
run inside a transaction.
"""

import django.db.models.expressions
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conveyor", "0006_workflows"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                django.db.models.expressions.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("state", "available")),
                name="conveyor_job_claim_queue_idx",
            ),
        ),
    ]
