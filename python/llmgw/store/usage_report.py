"""Reading the usage rollups: usage per org, team or project, and the export by period.

Answers come from `usage_hourly` and `usage_daily` only, never from request rows,
so a month answers in milliseconds however many requests it held. Buckets are UTC.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from .db import Database, Row

HOUR = 3600
DAY = 86_400

Period = Literal["hour", "day", "month"]
ScopeKind = Literal["org", "team", "project"]

DIMENSIONS: dict[str, str] = {
    "org": "org_id",
    "team": "team_id",
    "project": "project_id",
    "user": "user_id",
    "key": "key_id",
    "model": "model",
}
"""Export dimension -> its column in the rollups (and its field in ExportRow)."""


class ScopeUsage(msgspec.Struct, kw_only=True):
    """Usage of one org, team or project since a time."""

    scope_id: str
    """The org, team or project id; '' for requests made without a key."""
    path: str | None = None
    """`acme/ml/chat`, filled by the admin API when the scope still exists."""
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


NAMED: dict[str, str] = {
    "org": "org_path",
    "team": "team_path",
    "project": "project_path",
    "key": "key_name",
}
"""Export dimension -> the field of ExportRow that names its id for a person."""


class ExportRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One period and one group of the chosen dimensions; a dimension not chosen is absent,
    and so are the names beside the ids until `name_rows` fills them."""

    period_start: float
    """Unix seconds (UTC) the hour, day or month starts at."""
    org_id: str | None = None
    org_path: str | None = None
    """The organization's name; '' when it no longer exists (or for requests without a key)."""
    team_id: str | None = None
    team_path: str | None = None
    """`acme/ml`; '' when the team no longer exists."""
    project_id: str | None = None
    project_path: str | None = None
    """`acme/ml/chat`; '' when the project no longer exists."""
    user_id: str | None = None
    key_id: str | None = None
    key_name: str | None = None
    """The key's name; '' when the key no longer exists (its project was deleted)."""
    model: str | None = None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int


def hour_of(t: float) -> int:
    """The unix second the UTC hour holding `t` starts at."""
    return int(t // HOUR) * HOUR


_SUMS = (
    "CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT), "
    "CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT)"
)


async def _grouped(
    db: Database, start: float, end: float, cols: list[str], width: int | None
) -> list[Row]:
    """(bucket, *cols, requests, errors, prompt, completion) over the hours from the one holding
    `start` to `end` (exclusive), grouped by `width`-second buckets (HOUR or DAY; None: one
    bucket, 0), ordered. Whole days are read from usage_daily, the hours at either edge from
    usage_hourly: a month is then 30 rows per group, not 720."""
    lo, hi = hour_of(start), math.ceil(end)  # hour < ceil(end) is hour < end for whole hours
    day_lo, day_hi = -(-lo // DAY) * DAY, hi - hi % DAY
    names = "".join(f", {c}" for c in cols)  # fixed column names, never the caller's text
    sums = "requests, errors, prompt_tokens, completion_tokens"
    if width == DAY or (width is None and day_lo < day_hi):
        bucket = "0" if width is None else "t - t % 86400"
        parts = (
            f"SELECT hour AS t{names}, {sums} FROM usage_hourly WHERE hour >= $1 AND hour < $2 "
            f"UNION ALL SELECT day{names}, {sums} FROM usage_daily WHERE day >= $2 AND day < $3 "
            f"UNION ALL SELECT hour{names}, {sums} FROM usage_hourly WHERE hour >= $3 AND hour < $4"
        )
        # no whole day in range: the first two parts are empty, the last one reads it all
        args: tuple[int, ...] = (lo, day_lo, day_hi, hi) if day_lo < day_hi else (lo, lo, lo, hi)
    else:
        bucket = "0" if width is None else "t"
        parts = f"SELECT hour AS t{names}, {sums} FROM usage_hourly WHERE hour >= $1 AND hour < $2"
        args = (lo, hi)
    group = "".join(f", {i}" for i in range(2, len(cols) + 2))
    return await db.fetch(
        f"SELECT {bucket}{names}, {_SUMS} FROM ({parts}) u GROUP BY 1{group} ORDER BY 1{group}",
        *args,
    )


async def usage_by_scope(
    db: Database, by: ScopeKind, since: float, until: float | None = None
) -> list[ScopeUsage]:
    """Usage per org, team or project from the hour holding `since` to `until` (default: all
    recorded), most tokens first."""
    col = DIMENSIONS[by]
    end = float(2**53) if until is None else until
    rows = await _grouped(db, since, end, [col], None)
    out = [
        ScopeUsage(
            scope_id=r[1],
            requests=int(r[2]),
            errors=int(r[3]),
            prompt_tokens=int(r[4]),
            completion_tokens=int(r[5]),
            total_tokens=int(r[4]) + int(r[5]),
        )
        for r in rows
    ]
    out.sort(key=lambda u: (-u.total_tokens, u.scope_id))
    return out


def month_of(t: float) -> float:
    """The unix second the UTC calendar month holding `t` starts at."""
    d = datetime.fromtimestamp(t, UTC)
    return float(calendar.timegm((d.year, d.month, 1, 0, 0, 0)))


async def export(
    db: Database, start: float, end: float, period: Period, by: Iterable[str]
) -> list[ExportRow]:
    """Usage from the hour holding `start` to `end` (exclusive), per period and chosen dimensions.

    Answers from the rollups only (see `_grouped`). Days are bucketed in SQL with integer
    arithmetic that both backends share; months are merged from days here, since
    calendar months are not a fixed number of seconds. Rows come ordered by period then
    dimensions. `by` holds names of DIMENSIONS; unknown ones raise ValueError.
    """
    chosen = list(dict.fromkeys(by))
    unknown = [d for d in chosen if d not in DIMENSIONS]
    if unknown:
        raise ValueError(f"unknown usage dimension {unknown[0]!r}")
    cols = [DIMENSIONS[d] for d in DIMENSIONS if d in chosen]  # the canonical order
    rows = await _grouped(db, start, end, cols, HOUR if period == "hour" else DAY)
    n = len(cols)
    if period != "month":
        return [
            ExportRow(
                period_start=float(r[0]),
                **{c: r[i + 1] for i, c in enumerate(cols)},
                requests=int(r[n + 1]),
                errors=int(r[n + 2]),
                prompt_tokens=int(r[n + 3]),
                completion_tokens=int(r[n + 4]),
            )
            for r in rows
        ]
    merged: dict[tuple[Any, ...], list[int]] = {}
    for r in rows:
        acc = merged.setdefault((month_of(r[0]), *(r[i] for i in range(1, n + 1))), [0, 0, 0, 0])
        for i in range(4):
            acc[i] += int(r[n + 1 + i])
    return [
        ExportRow(
            period_start=k[0],
            **{c: k[i + 1] for i, c in enumerate(cols)},
            requests=v[0],
            errors=v[1],
            prompt_tokens=v[2],
            completion_tokens=v[3],
        )
        for k, v in sorted(merged.items())
    ]


PathResolver = Callable[[Database, list[str]], Awaitable[dict[str, str]]]
"""Ids of orgs, teams or projects -> their paths; ids that no longer exist are left out."""

_IN_CHUNK = 500
"""Ids per `IN (...)` list: under SQLite's smallest limit on parameters (999)."""


async def key_names(db: Database, ids: Iterable[str]) -> dict[str, str]:
    """Key ids -> their names; ids of keys that no longer exist are left out."""
    wanted = sorted({i for i in ids if i})
    out: dict[str, str] = {}
    for at in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[at:at + _IN_CHUNK]
        marks = ", ".join(f"${i + 1}" for i in range(len(chunk)))  # placeholders, never values
        rows = await db.fetch(f"SELECT id, name FROM api_keys WHERE id IN ({marks})", *chunk)
        out.update((r[0], r[1]) for r in rows)
    return out


async def name_rows(db: Database, rows: list[ExportRow], paths: PathResolver) -> None:
    """Fills the path of each chosen org, team and project and the name of each chosen key,
    in place; '' for one that no longer exists, so a deleted key reads as a key without a
    name, not as a dimension that was not chosen."""
    scopes = {v for r in rows for v in (r.org_id, r.team_id, r.project_id) if v}
    found = await paths(db, sorted(scopes)) if scopes else {}
    keys = await key_names(db, (r.key_id for r in rows if r.key_id))
    for r in rows:
        if r.org_id is not None:
            r.org_path = found.get(r.org_id, "")
        if r.team_id is not None:
            r.team_path = found.get(r.team_id, "")
        if r.project_id is not None:
            r.project_path = found.get(r.project_id, "")
        if r.key_id is not None:
            r.key_name = keys.get(r.key_id, "")


async def tokens_used(db: Database, scope: str, since: float) -> int:
    """Prompt and completion tokens of `key:<id>` or `project:<id>` since the hour holding
    `since` (budgets start at a day, week or month, always an hour boundary). Read from the
    hourly rollup, which holds final and interrupted requests: what budgets count."""
    kind, _, ident = scope.partition(":")
    column = {"key": "key_id", "project": "project_id"}.get(kind)
    if column is None or not ident:
        raise ValueError(f"scope {scope!r} is neither key:<id> nor project:<id>")
    # `column` comes from the fixed table above, never from the caller's text.
    total = await db.fetchval(
        f"SELECT CAST(COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS BIGINT) "
        f"FROM usage_hourly WHERE {column} = $1 AND hour >= $2", ident, hour_of(since))
    return int(total or 0)
