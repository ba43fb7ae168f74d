"""Routes about the control plane itself: its OpenAPI document, a probe and its metrics."""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.control.metrics import CONTENT_TYPE

from .openapi import document
from .route import Raw, Request, Route


class Health(msgspec.Struct, kw_only=True):
    """That this control plane answers, and its role."""

    status: str
    """`ok` whenever it answers at all."""
    role: str
    """`leader` or `standby`."""


async def openapi_json(req: Request) -> Raw:
    """The OpenAPI document of the routes this control plane mounts."""
    return Raw(msgspec.json.encode(document(req.state.routes)), "application/json")


async def health(req: Request) -> Health:
    """A liveness probe: answers without the store, so an outage of the store does not get a
    control plane restarted (GET /api/v1/leader says more, with the admin token)."""
    lead = req.state.leadership
    return Health(status="ok", role="leader" if lead is not None and lead.is_leader else "standby")


async def metrics(req: Request) -> Raw:
    """This control plane's metrics in Prometheus' text format (`llmgw.control.metrics`)."""
    return Raw(req.state.metrics.render(), CONTENT_TYPE)


ROUTES: list[Route] = [
    Route("GET", "/api/v1/openapi.json", "This document", openapi_json,
          description="The admin API in OpenAPI 3.1, generated from the route table.",
          response=dict[str, Any]),
    Route("GET", "/health", "Liveness", health,
          description="Answers 200 while the process serves, leader or standby, without reading "
                      "the store and without a token. Answered by standbys themselves.",
          response=Health, public=True),
    Route("GET", "/metrics", "Prometheus metrics", metrics,
          description="This control plane's metrics in Prometheus' text exposition format: its "
                      "role, usage ingestion, admin answers by route, the fleet, and the process. "
                      "No token (it holds no secret and no tenant's name); like the whole admin "
                      "listener, on loopback unless configured otherwise. Answered by standbys "
                      "themselves.",
          response=Raw, media="text/plain", public=True),
]
