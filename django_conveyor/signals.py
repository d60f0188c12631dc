"""Signals of django-conveyor, beside the standard ones of `django.tasks`.

`task_enqueued` (django.tasks) is sent for every new job. An enqueue whose
idempotency key already names a job writes nothing and sends
`task_enqueue_replayed` instead, with the existing job's result, so that
metrics can count replays apart from new jobs.
"""

from django.dispatch import Signal

task_enqueue_replayed = Signal()  # sender: the backend class; task_result: the existing job.
