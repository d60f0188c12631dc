"""Settings for the pickup measurement's worker: only a NOTIFY can wake it early.

An idle worker sleeps until the poll interval, its next heartbeat or a
wake-up, whichever comes first; with heartbeats and reaping a minute apart
(and the poll interval set by `--interval`), a pickup faster than the poll
interval can only come from the listener.
"""

from tests.settings import *  # noqa: F403
from tests.settings import CONVEYOR

IDLE_SECONDS = 60.0

CONVEYOR = {
    **CONVEYOR,
    "LEASE_SECONDS": 5 * IDLE_SECONDS,
    "HEARTBEAT_SECONDS": IDLE_SECONDS,
    "REAP_SECONDS": IDLE_SECONDS,
}
