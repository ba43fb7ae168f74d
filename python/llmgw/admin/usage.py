"""The usage routes: what each org, team or project used, and the export by period (CSV or JSON)."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, get_args

from llmgw.config.units import parse_duration
from llmgw.store import Database
from llmgw.store.tenancy import scope_paths
from llmgw.store.usage import (
    DIMENSIONS,
    ExportRow,
    Period,
    ScopeKind,
    ScopeUsage,
    export,
    month_of,
    usage_by_scope,
)
from llmgw.store.usage_report import NAMED, name_rows

from .route import ApiError, Param, Raw, Request, Route

NameResolver = Callable[[Database, list[str]], Awaitable[dict[str, str]]]
"""Ids of orgs, teams or projects -> their paths (`acme`, `acme/ml`, `acme/ml/chat`); ids
that no longer exist are left out. The tenancy store's `scope_paths` by default; it takes
the store because the route table is built at import, before any store is open."""

_MAX_ECHO = 60


def _echo(text: str) -> str:
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def parse_time(text: str, param: str, *, end: bool = False) -> float:
    """Unix seconds of a date (`2026-11-01`, UTC midnight) or an RFC 3339 time.

    With `end`, a bare date means the end of that day, so `to=2026-11-30` includes
    November 30th. A time without an offset is taken as UTC.
    """
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return (start + timedelta(days=1) if end else start).timestamp()
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            400,
            "usage.bad_time",
            f"{param}={_echo(text)!r} is neither a date (2026-11-01) nor an RFC 3339 "
            "time (2026-11-01T08:00:00Z); give one of those",
            param,
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def since_time(text: str, now: float, area: str = "usage") -> float:
    """Unix seconds of a `since`: `24h`/`7d` back from now, or a date or time. Refusals are
    coded `{area}.bad_since` (a duration that is not one) or `{area}.bad_time`."""
    if text[:1].isdigit() and text[-1:] in "smhdw" and "-" not in text:
        try:
            return now - parse_duration(text)
        except ValueError as e:
            raise ApiError(400, f"{area}.bad_since", f"since: {e}", "since") from None
    try:
        return parse_time(text, "since")
    except ApiError:
        raise ApiError(400, f"{area}.bad_time", f"since={_echo(text)!r} is neither a duration back from now "
                       "(90m, 24h, 7d) nor a date (2026-11-01) nor an RFC 3339 time (2026-11-01T08:00:00Z); "
                       "give one of those", "since") from None


def _choice(req: Request, name: str, allowed: tuple[str, ...], default: str, code: str) -> str:
    value = req.query.get(name) or default
    if value not in allowed:
        raise ApiError(
            400,
            code,
            f"{name}={_echo(value)!r} is not one of {', '.join(allowed)}; "
            f"give one of those (default {default})",
            name,
        )
    return value


def routes(names: NameResolver | None = scope_paths) -> list[Route]:
    """The usage routes; `names` fills each scope's path (None: paths stay empty)."""

    async def get_export(req: Request) -> Raw | list[ExportRow]:
        """GET /api/v1/usage/export."""
        return await _export(req, names)

    async def get_usage(req: Request) -> list[ScopeUsage]:
        by: ScopeKind = _choice(
            req,
            "by",
            get_args(ScopeKind),
            "team",  # type: ignore[assignment]
            "usage.bad_scope_kind",
        )
        since = since_time(req.query.get("since") or "24h", time.time())
        rows = await usage_by_scope(req.db, by, since)
        if names is not None and rows:
            paths = await names(req.db, [u.scope_id for u in rows if u.scope_id])
            for u in rows:
                u.path = paths.get(u.scope_id)
        return rows

    return [
        Route(
            "GET",
            "/api/v1/usage",
            "Usage per org, team or project",
            get_usage,
            description=(
                "Requests, errors and tokens of each org, team or project since a time, "
                "most tokens first, from the hourly rollups (the hour holding `since` is "
                "counted whole). Requests made without a key have the scope id ''."
            ),
            query=(
                Param("by", "org, team or project (default team)"),
                Param(
                    "since",
                    "how far back: a duration (24h, 7d) or a date or RFC 3339 time (default 24h)",
                ),
            ),
            response=list[ScopeUsage],
        ),
        Route(
            "GET",
            "/api/v1/usage/export",
            "Usage by period, as CSV or JSON",
            get_export,
            description=(
                "One row per period and group of the chosen dimensions, from the "
                "rollups; CSV with a header row unless format=json. CSV writes "
                "period_start as an RFC 3339 UTC time, JSON as unix seconds. The rollups "
                "are hourly: a time inside an hour counts that whole hour. Beside the ids "
                "of the chosen org, team, project and key dimensions, each row names them: "
                "org_path, team_path, project_path (`acme/ml/chat`) and key_name, '' for "
                "one that no longer exists. CSV columns: period_start, the chosen "
                "dimensions' ids, requests, errors, prompt_tokens, completion_tokens, "
                "then those names, so that a reader of the columns by position keeps working."
            ),
            query=(
                Param(
                    "from",
                    "a date (2026-11-01) or RFC 3339 time (default: the first of this month, UTC)",
                ),
                Param("to", "a date (included whole) or RFC 3339 time (default now)"),
                Param("period", "hour, day or month (default day)"),
                Param(
                    "by",
                    "dimensions, comma-separated: org,team,project,user,key,model "
                    "(default none: one row per period)",
                ),
                Param("format", "csv (default) or json"),
            ),
            response=list[ExportRow],
            csv=True,
        ),
    ]


async def _export(req: Request, names: NameResolver | None) -> Raw | list[ExportRow]:
    now = time.time()
    fmt = _choice(req, "format", ("csv", "json"), "csv", "usage.bad_format")
    period: Period = _choice(
        req,
        "period",
        get_args(Period),
        "day",  # type: ignore[assignment]
        "usage.bad_period",
    )
    by = [d.strip() for d in (req.query.get("by") or "").split(",") if d.strip()]
    for d in by:
        if d not in DIMENSIONS:
            raise ApiError(
                400,
                "usage.bad_dimension",
                f"by: {_echo(d)!r} is not a usage dimension; give a comma-separated "
                f"list of {', '.join(DIMENSIONS)}",
                "by",
            )
    start = parse_time(req.query["from"], "from") if req.query.get("from") else month_of(now)
    end = parse_time(req.query["to"], "to", end=True) if req.query.get("to") else now
    if end <= start:
        raise ApiError(
            400,
            "usage.bad_range",
            "`to` is not after `from`; give a `from` earlier than `to` (the default "
            "`from` is the first of this month, UTC)",
            "to",
        )
    rows = await export(req.db, start, end, period, by)
    await name_rows(req.db, rows, names or _no_paths)
    if fmt == "json":
        return rows
    return Raw(export_csv(rows, by), "text/csv; charset=utf-8")


async def _no_paths(db: Database, ids: list[str]) -> dict[str, str]:
    return {}


def export_csv(rows: list[ExportRow], by: list[str]) -> bytes:
    """The export as CSV: period_start (RFC 3339, UTC), the chosen dimensions' columns in
    their canonical order, then requests, errors, prompt_tokens, completion_tokens, then the
    names of the chosen org, team, project and key (org_path ... key_name). The names come
    last so that the columns before them stay where a reader by position expects them."""
    cols = [DIMENSIONS[d] for d in DIMENSIONS if d in by]
    named = [NAMED[d] for d in NAMED if d in by]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")  # \n, as the admin app's other CSV answers
    w.writerow(["period_start", *cols, "requests", "errors", "prompt_tokens", "completion_tokens",
                *named])
    for r in rows:
        start = datetime.fromtimestamp(r.period_start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        dims: list[Any] = [getattr(r, c) for c in cols]
        names = [getattr(r, c) or "" for c in named]
        w.writerow([start, *dims, r.requests, r.errors, r.prompt_tokens, r.completion_tokens,
                    *names])
    return out.getvalue().encode()


ROUTES: list[Route] = routes()
"""With the paths of the tenancy store, as the control plane mounts them."""
