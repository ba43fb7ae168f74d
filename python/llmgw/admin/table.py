"""The admin API's one route table: what the app mounts and the OpenAPI document describes.

Each area exports `ROUTES`; adding an area is one line here. A test checks that
this table is exactly what the running server mounts.
"""

from __future__ import annotations

from . import audit, keys, meta, tenancy
from .route import Route

ROUTES: list[Route] = [
    *meta.ROUTES,
    *tenancy.ROUTES,
    *keys.ROUTES,
    *audit.ROUTES,
]
