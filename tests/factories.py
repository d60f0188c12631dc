"""factory-boy factories for jobs in every state (rows as the protocol leaves them)."""

import factory
from django.utils import timezone
from django.utils import timezone as dj_timezone

from django_conveyor.models import Cron, Job, LedgerEntry
from django_conveyor.periodic.expressions import Timing


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    task_path = "tests.testapp.tasks.add"
    args = factory.LazyFunction(lambda: [1, 2])
    kwargs = factory.LazyFunction(dict)
    queue = "default"
    backend = "default"
    priority = 0
    state = "available"
    attempt = 0
    max_attempts = 3
    run_after = factory.LazyFunction(timezone.now)
    enqueued_at = factory.LazyFunction(timezone.now)
    lease_version = 0
    errors = factory.LazyFunction(list)

    class Params:
        running = factory.Trait(
            state="running",
            attempt=1,
            lease_owner="worker-a",
            lease_version=1,
            lease_expires_at=factory.LazyFunction(
                lambda: timezone.now() + timezone.timedelta(seconds=30)
            ),
            started_at=factory.LazyFunction(timezone.now),
        )
        expired = factory.Trait(
            state="running",
            attempt=1,
            lease_owner="worker-a",
            lease_version=1,
            lease_expires_at=factory.LazyFunction(
                lambda: timezone.now() - timezone.timedelta(seconds=1)
            ),
            started_at=factory.LazyFunction(timezone.now),
        )
        completed = factory.Trait(
            state="completed",
            attempt=1,
            lease_owner="worker-a",
            lease_version=1,
            return_value=3,
            started_at=factory.LazyFunction(timezone.now),
            finished_at=factory.LazyFunction(timezone.now),
        )
        failed = factory.Trait(
            state="failed",
            attempt=1,
            lease_owner=None,  # FAIL clears the owner; the error entry names the worker.
            lease_version=1,
            finished_at=factory.LazyFunction(timezone.now),
            errors=factory.LazyFunction(
                lambda: [
                    {
                        "attempt": 1,
                        "worker": "worker-a",
                        "token": 1,
                        "exception_class_path": "django_conveyor.exceptions.Discard",
                        "traceback": "Traceback: discarded",
                        "time": timezone.now().isoformat(),
                    }
                ]
            ),
        )
        dead = factory.Trait(
            state="dead",
            attempt=3,
            lease_owner=None,  # RETRY and REAP to dead clear the owner.
            lease_version=3,
            finished_at=factory.LazyFunction(timezone.now),
            errors=factory.LazyFunction(
                lambda: [
                    {
                        "attempt": n,
                        "worker": "worker-a",
                        "token": n,
                        "exception_class_path": "builtins.ValueError",
                        "traceback": f"Traceback: boom {n}",
                        "time": timezone.now().isoformat(),
                    }
                    for n in (1, 2, 3)
                ]
            ),
        )
        cancelled = factory.Trait(state="cancelled", finished_at=factory.LazyFunction(timezone.now))
        blocked = factory.Trait(state="blocked")


class LedgerEntryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = LedgerEntry

    job = factory.SubFactory(JobFactory, completed=True)
    effect_key = factory.Sequence(lambda n: f"effect-{n}")
    lease_version = 1
    worker = "worker-a"
    applied_at = factory.LazyFunction(timezone.now)


class CronFactory(factory.django.DjangoModelFactory):
    """A schedule as settings sync or the admin leave it: next tick after `created`."""

    class Meta:
        model = Cron
        exclude = ("created",)

    name = factory.Sequence(lambda n: f"schedule-{n}")
    schedule = "* * * * *"
    timezone = "UTC"  # The field; the class body shadows django.utils.timezone.
    task_path = "tests.testapp.tasks.noop"
    queue = "default"
    missed = "latest"
    created = factory.LazyFunction(dj_timezone.now)
    next_tick_at = factory.LazyAttribute(
        lambda o: Timing(o.schedule, o.timezone).next_after(o.created)
    )
