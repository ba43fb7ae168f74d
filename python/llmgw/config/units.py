"""Durations and sizes as people write them: one parser each, for server.yaml and the admin API.

A duration is a number and a unit, `250ms`, `30s`, `5m`, `2h`, `7d` or `2w`, or a sum of them
(`1h30m`); in server.yaml a plain number is seconds too (`0.25`, `30`). A size is a number of
bytes, or a number and a unit: decimal `KB` `MB` `GB` `TB` (powers of 1000) or binary `KiB`
`MiB` `GiB` `TiB` (powers of 1024), as in `256KiB`, `16MiB` or `1.5GB`.

In a Struct, `Duration` and `Size` are plain floats and ints marked for the loader
(`llmgw.config.file`), which turns the text forms into numbers before msgspec sees them; so the
Structs encode anywhere (JSON to granian's workers) without a hook.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

DURATION: dict[str, Any] = {"unit": "duration"}
"""The `extra` of a Meta that marks a field as a duration (text or seconds)."""
SIZE: dict[str, Any] = {"unit": "size"}
"""The `extra` of a Meta that marks a field as a size (text or bytes)."""

Duration = Annotated[float, msgspec.Meta(gt=0, extra=DURATION)]
"""Seconds, longer than zero: `250ms`, `30s`, `5m`, `2h`, `7d` or a number of seconds."""
DurationOrZero = Annotated[float, msgspec.Meta(ge=0, extra=DURATION)]
"""A duration that may be zero (`0` turns the wait off)."""
Size = Annotated[int, msgspec.Meta(ge=0, extra=SIZE)]
"""Bytes: `16MiB`, `256KiB`, `1GB` or a number of bytes."""
PositiveSize = Annotated[int, msgspec.Meta(gt=0, extra=SIZE)]
"""A size that may not be zero (msgspec refuses a second bound on `Size`)."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_PATTERN = r"^(?:[0-9]{1,9}(?:ms|[smhdw])){1,5}$"
"""What `parse_duration` accepts: one to five `<number><unit>` parts, units ms s m h d w."""
DURATION_RULE = "a number and a unit (ms, s, m, h, d, w), like 90m, 24h or 30d"
"""What a duration is, in words, for documents and refusals."""
DURATION_FORMS = ("a number and a unit (250ms, 30s, 5m, 2h, 7d, or a sum like 1h30m) "
                  "or a number of seconds")
"""What a duration in server.yaml may be, in words."""
_FULL = re.compile(DURATION_PATTERN)
_PART = re.compile(r"([0-9]+)(ms|[smhdw])")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
SIZE_FORMS = ("a number of bytes, or a number and a unit: KB, MB, GB, TB (powers of 1000) or "
              "KiB, MiB, GiB, TiB (powers of 1024), like 256KiB, 16MiB or 1GB")
"""What a size may be, in words."""


def duration_seconds(text: str) -> float | None:
    """Seconds in `text` (`250ms`, `1h30m`, `0s`), or None when it is not a duration."""
    if not _FULL.match(text):
        return None
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(text))


def parse_duration(text: str) -> float:
    """Seconds in `text` (`90m`, `24h`, `7d`, `2w`, `1h30m`, `250ms`).

    Raises ValueError with a sentence saying what is accepted when the text is
    not a duration or is zero.
    """
    shown = text if len(text) <= 40 else text[:40] + "..."
    seconds = duration_seconds(text)
    if seconds is None:
        raise ValueError(
            f"{shown!r} is not a duration; write a number and a unit, like 90m, 24h, 7d or 2w "
            "(units: ms, s, m, h, d, w)")
    if seconds <= 0:
        raise ValueError(f"{shown!r} is zero; give a duration longer than that, like 1h")
    return seconds


def parse_size(text: str) -> int:
    """`80GiB` -> 85899345920; raises ValueError with the accepted forms."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size; write bytes, or e.g. 80GiB, 512MiB, 24GB")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def duration_text(seconds: float) -> str | float:
    """The shortest duration text for `seconds` (`7d`, `90m`, `250ms`), as `llmgw config
    defaults` writes it; the number itself when it is not a whole number of milliseconds."""
    millis = round(seconds * 1000)
    if abs(millis - seconds * 1000) > 1e-6:
        return seconds
    if millis == 0:
        return 0
    for unit in ("d", "h", "m", "s", "ms"):  # 7d reads better than 1w
        step = round(_UNITS[unit] * 1000)
        if millis % step == 0:
            return f"{millis // step}{unit}"
    return seconds  # not reached: every whole number of milliseconds has a unit


def size_text(size: int) -> str | int:
    """The shortest exact size text for `size` (`16MiB`, `1GB`), or the number of bytes."""
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        step = _SIZE_UNITS[unit.lower()]
        if size and size % step == 0:
            return f"{size // step}{unit}"
    return size


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
