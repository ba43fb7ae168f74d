"""The OpenAPI 3.1 document of the admin API, generated from the route table.

Paths and their parameters come from each `Route` (`{name}` segments and
`Param`s), bodies and answers from msgspec's JSON schema of the route's
`request` and `response` types, so a field added to a Struct is in the document
at once. Every 4xx/5xx answer is the one error envelope of `answers.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from llmgw import __version__

from .answers import ErrorEnvelope
from .route import Raw, Route

_REF = "#/components/schemas/{name}"

# What each path parameter is, by its name; a route whose parameter is missing
# here gets a plain description (a test lists the ones that do).
PATH_PARAMS = {
    "org": "The organization: its ID (org_...) or its name.",
    "team": "The team: its ID (team_...) or its path with `:` for `/` (acme:ml).",
    "project": "The project: its ID (proj_...) or its path with `:` for `/` (acme:ml:chat).",
    "user": "The user: its ID (user_...) or its name.",
    "id": "The ID, as listing or creating it answered (a node's id as its agent registered it).",
    "name": "The model's name or one of its aliases.",
}

_ERRORS = {
    "400": "The request is not valid: a parameter, the body, or a name.",
    "401": "No bearer token, or not the right one.",
    "403": "The token or actor may not do this.",
    "404": "No such route or no such object.",
    "409": "Conflicts with what is stored (a name taken, not empty).",
    "413": "The body is too large.",
    "500": "The control plane failed; its log has the details under the x-request-id.",
    "503": "The store is not answering.",
}


def operation_id(route: Route) -> str:
    """A stable, unique name of the route: `get_api_v1_orgs_org`."""
    parts = [p.strip("{}").replace("-", "_").replace(".", "_") for p in route.path.split("/") if p]
    return "_".join([route.method.lower(), *parts])


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-ready dict) of `routes`."""
    types: list[Any] = [ErrorEnvelope]
    for r in routes:
        for t in (r.request, r.response):
            if t is not None and t is not Raw:
                types.append(t)
    # One call for every type, so a Struct shared by several routes is one component.
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema_of = dict(zip(map(id, types), schemas, strict=True))
    error = {"description": "An error, in the OpenAI error shape.",
             "content": {"application/json": {"schema": schema_of[id(ErrorEnvelope)]}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, schema_of, error)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw admin API",
            "version": __version__,
            "description": "The control plane's API: tenancy, keys, usage, requests and audit "
                           "(/api/v1, admin token), and what gateways call (/internal/v1, "
                           "gateway token). Generated from the route table; do not edit.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer",
                               "description": "The admin token, from <data-dir>/admin-token."},
                "gatewayToken": {"type": "http", "scheme": "bearer",
                                 "description": "The gateway token, derived from the cluster secret."},
            },
        },
        "security": [{"adminToken": []}],
    }


def _operation(r: Route, schema_of: dict[int, Any], error: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": operation_id(r), "summary": r.summary,
                          "tags": [_tag(r.path)]}
    if r.description:
        op["description"] = r.description
    if r.internal:
        op["security"] = [{"gatewayToken": []}]
    elif r.public:
        op["security"] = []
    params: list[dict[str, Any]] = []
    for seg in r.path.split("/"):
        if seg.startswith("{"):
            name = seg[1:-1]
            params.append({"name": name, "in": "path", "required": True,
                           "description": PATH_PARAMS.get(name, f"The {name}."),
                           "schema": {"type": "string", "minLength": 1}})
    for p in r.query:
        params.append({"name": p.name, "in": "query", "required": p.required,
                       "description": p.description, "schema": {"type": p.type}})
    if params:
        op["parameters"] = params
    if r.request is not None:
        op["requestBody"] = {"required": not r.optional_body,
                             "content": {"application/json": {"schema": schema_of[id(r.request)]}}}
    ok: dict[str, Any] = {"description": r.summary}
    if r.response is not None and r.response is not Raw:
        content: dict[str, Any] = {"application/json": {"schema": schema_of[id(r.response)]}}
        if r.csv:
            content["text/csv"] = {"schema": {"type": "string"}}
        ok["content"] = content
    elif r.response is Raw:
        ok["content"] = {r.media: {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {str(r.status): ok}
    for status, text in _ERRORS.items():
        responses[status] = {**error, "description": text}
    op["responses"] = responses
    return op


def _tag(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    # /api/v1/orgs/{org} -> orgs; /internal/v1/snapshot -> internal
    if parts and parts[0] == "internal":
        return "internal"
    return parts[2] if len(parts) > 2 and "." not in parts[2] else "meta"
