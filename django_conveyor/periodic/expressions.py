"""When a schedule ticks: cron expressions in an IANA time zone, as UTC instants.

Parsing and matching are cronsim's (the `[cron]` extra; docs/cron.md says
why cronsim). This module adds the one rule cron leaves open, how local
times map to instants when the clocks change, so that every tick is a
single UTC instant and ticks strictly increase:

- An expression whose hour field is `*` runs every hour (or more often) and
  follows elapsed time: it is matched against the aware local time, so an
  hour that happens twice runs in both and an hour that does not exist is
  simply not there (`30 * * * *` still runs once an hour).
- Any other expression names local wall-clock times. A time that does not
  exist (spring forward) runs once, at the first valid instant after the
  gap; a time that happens twice (fall back) runs once, at its first
  occurrence. Several non-existent times of one gap collapse into one tick.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ConveyorConfigurationError

MAX_EXPRESSION_LENGTH = 255
INSTALL_HINT = 'Install the cron extra: pip install "django-conveyor[cron]".'


class CronNotInstalled(ConveyorConfigurationError):
    """Schedules need cronsim, which the `[cron]` extra installs."""


class InvalidSchedule(ValueError):
    """A cron expression or time zone that cannot be used."""


def _cronsim() -> tuple[type, type[Exception]]:
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as exc:
        raise CronNotInstalled(
            f"Periodic jobs need the cronsim package, which is not installed. {INSTALL_HINT}"
        ) from exc
    return CronSim, CronSimError


def installed() -> bool:
    try:
        _cronsim()
    except CronNotInstalled:
        return False
    return True


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone, or InvalidSchedule naming it."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise InvalidSchedule(f"{name!r} is not a time zone name.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"{name!r} is not a known IANA time zone.") from exc


def _imaginary(local: datetime) -> bool:
    return local != local.astimezone(UTC).astimezone(local.tzinfo)


@dataclass(frozen=True, slots=True)
class Timing:
    """A cron expression in a time zone: the ticks it makes, as UTC instants."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise InvalidSchedule("The cron expression is empty.")
        if len(self.expression) > MAX_EXPRESSION_LENGTH:
            raise InvalidSchedule(
                f"The cron expression is longer than {MAX_EXPRESSION_LENGTH} characters."
            )
        zone(self.timezone)
        cron_sim, error = _cronsim()
        try:
            cron_sim(self.expression, datetime(2000, 1, 1))
        except error as exc:
            raise InvalidSchedule(f"{self.expression!r} is not a cron expression: {exc}.") from exc
        if self.next_after(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise InvalidSchedule(f"{self.expression!r} never matches a date.")

    @property
    def wall_clock(self) -> bool:
        """True when ticks are local wall-clock times (the DST rule applies)."""
        fields = self.expression.split()
        hour = fields[-4]  # Five fields, or six with seconds first.
        return hour != "*" and self.timezone != "UTC"

    def _local(self, instant: datetime, *, reverse: bool) -> Iterator[datetime]:
        """cronsim's matches from `instant` on (or back), in local time."""
        cron_sim, _ = _cronsim()
        tz = zone(self.timezone)
        local = instant.astimezone(tz)
        # Naive wall-clock iteration: the mapping to instants below is ours,
        # the same forwards and backwards.
        start = local.replace(tzinfo=None) if self.wall_clock else local
        return cron_sim(self.expression, start, reverse=reverse)

    def _instant(self, match: datetime) -> datetime:
        if not self.wall_clock:
            return match.astimezone(UTC)
        tz = zone(self.timezone)
        local = match.replace(tzinfo=tz, fold=0)  # fold=0: the first occurrence.
        if _imaginary(local):
            # In a gap: the first valid instant after it (gaps end on a minute).
            naive = match.replace(second=0)
            while _imaginary(local):
                naive += timedelta(minutes=1)
                local = naive.replace(tzinfo=tz, fold=0)
        return local.astimezone(UTC)

    def ticks_after(self, instant: datetime) -> Iterator[datetime]:
        """Every tick strictly after `instant`, ascending."""
        last = instant
        try:
            for match in self._local(instant, reverse=False):
                tick = self._instant(match)
                if tick > last:
                    last = tick
                    yield tick
        except StopIteration:  # cronsim gives up after 50 years without a match.
            return

    def ticks_before(self, instant: datetime) -> Iterator[datetime]:
        """Every tick strictly before `instant`, descending."""
        last = instant
        try:
            for match in self._local(instant, reverse=True):
                tick = self._instant(match)
                if tick < last:
                    last = tick
                    yield tick
        except StopIteration:
            return

    def next_after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after `instant`, or None if there is none."""
        return next(self.ticks_after(instant), None)

    def between(self, start: datetime, end: datetime, *, limit: int) -> list[datetime]:
        """Up to `limit` ticks in [start, end), the latest ones, ascending."""
        found: list[datetime] = []
        for tick in self.ticks_before(end):
            if tick < start or len(found) >= limit:
                break
            found.append(tick)
        return found[::-1]


@functools.lru_cache(maxsize=4096)
def parsed(expression: str, timezone: str) -> Timing:
    """Timing(expression, timezone), validated once per process."""
    return Timing(expression, timezone)
