"""The operations console in the Django admin.

Dashboard, jobs, dead letters, waiting gates, queues, workers, the effect ledger and API keys. Jobs
are never edited by form: every change goes through `operations`, and so
through the protocol, like every other state change; every operator action
is recorded in Django's LogEntry and in the job's own history.
"""

from . import apikeys, dashboard, jobs, queues, waiting, workers  # noqa: F401  (registers the pages)
