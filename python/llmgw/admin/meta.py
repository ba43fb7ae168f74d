"""Routes about the API itself: its OpenAPI document."""

from __future__ import annotations

from typing import Any

import msgspec

from .openapi import document
from .route import Raw, Request, Route


async def openapi_json(req: Request) -> Raw:
    """The OpenAPI document of the routes this control plane mounts."""
    return Raw(msgspec.json.encode(document(req.state.routes)), "application/json")


ROUTES: list[Route] = [
    Route("GET", "/api/v1/openapi.json", "This document", openapi_json,
          description="The admin API in OpenAPI 3.1, generated from the route table.",
          response=dict[str, Any]),
]
