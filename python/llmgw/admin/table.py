"""The admin API's one route table: what the app mounts and the OpenAPI document describes.

Each area exports `ROUTES` (or `routes(...)` when it needs something wired in);
adding an area is one line here. A test checks that this table is exactly what
the running server mounts.
"""

from __future__ import annotations

from llmgw.store.tenancy import scope_paths

from . import audit, fleet, internal, joins, keys, leader, meta, requests, tenancy, usage
from .route import Route

ROUTES: list[Route] = [
    *meta.ROUTES,
    *leader.ROUTES,
    *tenancy.ROUTES,
    *keys.ROUTES,
    *audit.ROUTES,
    *usage.routes(names=scope_paths),
    *requests.routes(names=scope_paths),
    *fleet.ROUTES,
    *joins.ROUTES,
    *internal.ROUTES,
]
