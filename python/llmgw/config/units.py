"""Durations as people write them (`90m`, `24h`, `7d`, `1h30m`): one parser for queries and bodies."""

from __future__ import annotations

import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_PATTERN = r"^(?:[0-9]{1,9}[smhdw]){1,5}$"
"""What `parse_duration` accepts: one to five `<number><unit>` parts, units s m h d w."""
DURATION_RULE = "a number and a unit (s, m, h, d, w), like 90m, 24h or 30d"
"""What a duration is, in words, for documents and refusals."""
_FULL = re.compile(DURATION_PATTERN)
_PART = re.compile(r"([0-9]+)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in `text` (`90m`, `24h`, `7d`, `2w`, `1h30m`).

    Raises ValueError with a sentence saying what is accepted when the text is
    not a duration or is zero.
    """
    shown = text if len(text) <= 40 else text[:40] + "..."
    if not _FULL.match(text):
        raise ValueError(
            f"{shown!r} is not a duration; write a number and a unit, like 90m, 24h, 7d or 2w "
            "(units: s, m, h, d, w)")
    seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(text))
    if seconds <= 0:
        raise ValueError(f"{shown!r} is zero; give a duration longer than that, like 1h")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest `parse_duration` text for a whole number of seconds (`7d`, `90m`); a
    fraction of a second is shown in seconds (`1.5s`)."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    s = int(seconds)
    for unit in ("d", "h", "m"):  # 7d reads better than 1w
        if s and s % _UNITS[unit] == 0:
            return f"{s // int(_UNITS[unit])}{unit}"
    return f"{s}s"


def spoken_duration(seconds: float) -> str:
    """A wait as a person reads it: tenths of a second under a minute (`59.6s`), else its two
    largest units (`4m05s`, `10h10m`, `2d3h`)."""
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f}s"
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"
