"""worker/backoff.py: the job retry delay and the ladders of reconnect and restart delays."""

import random

from django.test import override_settings

from django_conveyor.worker import backoff
from tests.testapp import tasks


def test_full_jitter_stays_under_the_doubling_ceiling_and_the_cap():
    random.seed(7)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 30.0)]:
        delays = [backoff.full_jitter(attempt, 1.0, 30.0) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # spread over the whole range, not pinned low


@override_settings(CONVEYOR={"BACKOFF_BASE_SECONDS": 0.5, "BACKOFF_CAP_SECONDS": 0.75})
def test_retry_delay_uses_the_settings_unless_the_task_sets_its_bounds():
    assert all(backoff.retry_delay(None, 5) <= 0.75 for _ in range(100))
    assert all(backoff.retry_delay(tasks.add, 1) <= 0.5 for _ in range(100))
    slow = tasks.fails_slowly  # backoff_base=30 on the task itself
    assert max(backoff.retry_delay(slow, 1) for _ in range(200)) > 0.75


def test_ladder_climbs_one_step_per_failure_and_starts_over_after_reset():
    ladder = backoff.Ladder((0.2, 0.5, 1.0))
    assert [ladder.next_delay() for _ in range(5)] == [0.2, 0.5, 1.0, 1.0, 1.0]
    ladder.reset()
    assert ladder.next_delay() == 0.2


def test_no_attempt_number_overflows_the_backoff():
    for attempt in (1024, 1025, 10**6):
        assert 0 <= backoff.full_jitter(attempt, 1.0, 600.0) <= 600.0


def test_delays_past_the_maximum_are_capped_and_say_so():
    top = backoff.MAX_SECONDS
    assert backoff.capped_delay(30.0) == (30.0, False)
    assert backoff.capped_delay(top) == (top, False)
    assert backoff.capped_delay(1.7e12) == (top, True)
    assert backoff.capped_delay(float("inf")) == (top, True)
    assert backoff.capped_delay(float("nan")) == (0.0, True)
    assert backoff.capped_delay(-1.0) == (0.0, True)
