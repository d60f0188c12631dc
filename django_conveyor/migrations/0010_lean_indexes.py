"""Fewer index writes per state change, and a vacuum that keeps up (issue 15).

Every claim and completion changes `state`, which the partial indexes'
predicates read, so no update of a job is HOT: each one writes a new entry
into every index that covers the row. The idempotency key's unique index
(and the `varchar_pattern_ops` copy Django adds beside it) covered every
row, keyed or not; it now holds keyed rows only. Lookups by key
(`idempotency_key = ...`) imply `IS NOT NULL`, so they still use it, and
`ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL` infers it.

Each job leaves two dead row versions behind (claim, completion). With the
server's defaults autovacuum waits for a fifth of the table to be dead and
then sleeps between pages, so a busy queue's table carries hundreds of
thousands of dead versions that every claim steps over. The table's own
settings start a pass after a fixed number of dead versions, whatever the
table's size, and let it run without the cost delay. Fillfactor stays at
100: with no HOT updates, free space left in a page would never be used by
an update of its own rows.
"""

from django.db import migrations, models

STORAGE = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "20000",
    "autovacuum_vacuum_cost_delay": "0",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "20000",
}


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0009_enqueued_run_after"),
    ]

    operations = [
        # The partial index first, so that keys stay unique throughout.
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(idempotency_key__isnull=False),
                fields=("idempotency_key",),
                name="conveyor_job_idempotency_key_uniq",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="idempotency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.RunSQL(
            "ALTER TABLE conveyor_job SET ("
            + ", ".join(f"{key} = {value}" for key, value in STORAGE.items())
            + ")",
            reverse_sql="ALTER TABLE conveyor_job RESET (" + ", ".join(STORAGE) + ")",
        ),
    ]
