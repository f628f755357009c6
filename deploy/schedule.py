"""The schedule of a config (``schedule.cron`` in ``schedule.timezone``) as Prefect takes it:
one check for ``python -m deploy.serve``, which registers it, and ``dpatlas config check``,
which must refuse what serving would refuse."""

from __future__ import annotations

from typing import Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dpatlas.core.config import ConfigError, ScheduleConfig


def cron_schedule(schedule: ScheduleConfig) -> Optional[object]:
    """The Prefect cron schedule of ``schedule`` (None when ``cron`` is null); a
    :class:`ConfigError` naming the key for an unknown time zone or an invalid cron."""
    from prefect.schedules import Cron

    if not schedule.cron:
        return None
    try:
        ZoneInfo(schedule.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"schedule.timezone: unknown IANA time zone {schedule.timezone!r} "
                          "(e.g. UTC, America/Chicago)") from None
    try:
        return Cron(schedule.cron, timezone=schedule.timezone)
    except ValueError as err:
        raise ConfigError(f"schedule.cron: invalid cron expression {schedule.cron!r}: "
                          f"{' '.join(str(err).split())}") from None
