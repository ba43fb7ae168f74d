"""How `llmgw ctl` shows answers to a person: aligned tables and `field: value` blocks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from llmgw.config.units import format_duration

from .commands import Column, ColumnKind
from .paths import unprefixed


def cell(value: Any, kind: ColumnKind = "text", field: str = "") -> str:
    """One value as text."""
    if value is None:
        return "-"
    if kind == "time" or (kind == "text" and field.endswith("_at") and isinstance(value, (int, float))):
        return iso(float(value))
    if kind == "duration" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_duration(float(value))
    if kind == "scope" and isinstance(value, str):
        return unprefixed(value)
    if kind == "limits" and isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict):
        return " ".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value) or "-"
    return str(value)


def iso(ts: float) -> str:
    """Unix seconds as an ISO time in UTC, to the second."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Rows under a header, columns aligned; the last column is not padded."""
    grid = [[c.header for c in columns]]
    grid += [[cell(r.get(c.field), c.kind, c.field) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    out = []
    for line in grid:
        parts = [text.ljust(w) for text, w in zip(line[:-1], widths, strict=False)] + [line[-1]]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def block(obj: dict[str, Any], columns: Sequence[Column]) -> str:
    """One object as `field: value` lines: the columns' fields first, then the rest."""
    kinds = {c.field: c.kind for c in columns}
    order = [c.field for c in columns if c.field in obj] + [k for k in obj if k not in kinds]
    width = max((len(k) for k in order), default=0)
    return "\n".join(f"{k + ':':<{width + 1}} {cell(obj[k], kinds.get(k, 'text'), k)}" for k in order)
