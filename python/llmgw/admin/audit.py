"""Admin route of the audit log: changes made through the admin API, newest first."""

from __future__ import annotations

import time

from llmgw.store import audit
from llmgw.store.errors import shown
from llmgw.store.views import AuditEvent

from .route import ApiError, Param, Request, Route
from .store_errors import mapped
from .usage import since_time

DEFAULT_SINCE = "7d"


def _limit(req: Request) -> int:
    text = req.query.get("limit") or "100"
    if not text.isdigit() or not 1 <= int(text) <= audit.MAX_LIMIT:
        raise ApiError(400, "audit.bad_limit", f"limit={shown(text)} is not a number from 1 to "
                       f"{audit.MAX_LIMIT}; give one like limit=100", "limit")
    return int(text)


@mapped
async def list_audit(req: Request) -> list[AuditEvent]:
    """GET /api/v1/audit?since=&limit=&actor=&contains=."""
    now = time.time()
    since = now - since_time(req.query.get("since") or DEFAULT_SINCE, now, "audit")
    return await audit.query(req.db, since=since, limit=_limit(req), now=now,
                             actor=req.query.get("actor") or None,
                             contains=req.query.get("contains") or None)


ROUTES: list[Route] = [
    Route("GET", "/api/v1/audit", "Changes made, newest first", list_audit,
          query=(Param("since", "How far back: 90m, 24h, 7d, or a date (2026-11-01) or RFC 3339 time; "
                       "7d when absent."),
                 Param("limit", f"The most events to answer with (1 to {audit.MAX_LIMIT}; 100 "
                       "when absent).", type="integer"),
                 Param("actor", "Only changes by this actor."),
                 Param("contains", "Only events whose action or target contains this text.")),
          response=list[AuditEvent]),
]
