"""Workflows (issue 12): the dependency table and the job's two workflow columns.

Both columns have database defaults, so adding them rewrites no row and
every existing INSERT statement keeps working; existing jobs have no
dependencies (`pending_dependencies = 0`, policy `cancel`).
"""

import django.db.models.deletion
from django.db import migrations, models

POLICIES = [
    ("cancel", "cancel: the dependent is cancelled"),
    ("run", "run: the dependent runs once every dependency is final"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0005_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="pending_dependencies",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="dependency_policy",
            field=models.CharField(
                choices=POLICIES, db_default="cancel", default="cancel", max_length=8
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(dependency_policy__in=["cancel", "run"]),
                name="conveyor_job_dependency_policy_valid",
            ),
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job",
                        "depends_on",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dependency_edges",
                        to="conveyor.job",
                    ),
                ),
                (
                    "depends_on",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dependent_edges",
                        to="conveyor.job",
                    ),
                ),
            ],
            options={
                "db_table": "conveyor_dependency",
                "indexes": [
                    models.Index(fields=["depends_on", "job"], name="conveyor_dependency_rev_idx")
                ],
            },
        ),
    ]
