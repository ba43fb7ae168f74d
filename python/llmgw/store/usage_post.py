"""A gateway's usage post as the ingest takes it (`Post`), read natively or from msgspec's decode.

A post holds thousands of finished requests. `from_json` reads its JSON with
`_core.scan_usage`: one pass that validates every row, sums the rows by rollup group and
keeps the posted array as the text to store, so the control plane makes no object per
request. The scan takes only what msgspec would decode into `wire.UsageBatch` and
declines the rest (rows with kept bodies, object-shaped finals from old gateways, a NUL
to replace); for those the admin app decodes the batch with msgspec (its words answer a
bad post) and `from_batch` adds up the same `Post` in Python, so one ingest serves both
(tests/unit/test_usage_scan.py holds the two side by side).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmgw import _core
from llmgw.protocol import wire

from .usage_report import hour_of

_json = msgspec.json.Encoder()
_opens = msgspec.json.Decoder(list[wire.UsageOpen])
_last_used = msgspec.json.Decoder(dict[str, wire.Instant])
_row = msgspec.json.Decoder(wire.UsageRow)

_ROW_FIELDS = wire.UsageRecord.__struct_fields__.index("request_body")
"""The fields of a stored row: every one before the bodies."""

Group = tuple[int, str, str, str, str, str, str, int, int, int, int]
"""(hour start, org, team, project, user, key, model, requests, errors, prompt tokens,
completion tokens): finished requests summed by rollup group, '' for a missing id."""


def group_key(r: wire.UsageRecord | wire.UsageOpen) -> tuple[int, str, str, str, str, str, str]:
    """A record's rollup key: the hour it started (`hour_of`), its org, team, project, user
    and key ('' for a missing id), its model. `_core.scan_usage` makes the same."""
    return (hour_of(r.started_at), r.org_id or "", r.team_id or "", r.project_id or "",
            r.user_id or "", r.key_id or "", r.model)


@dataclass(frozen=True, slots=True)
class Post:
    """One usage post: its finished requests counted by group and kept as text to store,
    its opens and keys' last use decoded."""

    gateway_id: str
    ids: list[str]
    """Finished requests' ids in the order posted, each once: the first record of an id
    is the one counted (and the one a reader finds in `rows`)."""
    groups: list[Group]
    """The records of `ids` summed by rollup group."""
    rows: str
    """The JSON array of the records as wire.UsageRow arrays, without kept bodies."""
    started_max: float
    """The latest start of the records of `ids` (0.0 for none)."""
    record: Callable[[int], wire.UsageRecord]
    """The record of `ids[i]` (for the few the ingest must take back)."""
    opens: list[wire.UsageOpen] = field(default_factory=list)
    key_last_used: dict[str, float] = field(default_factory=dict)
    bodies: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    """Request id -> (request, response) body text, for the records that carry them."""


def from_json(data: bytes) -> Post | None:
    """The post read natively, or None where msgspec must decode it (see the module's note)."""
    scan = _core.scan_usage(data)
    if scan is None:
        return None
    try:
        opens = [] if scan.opens is None else _opens.decode(scan.opens)
        last = {} if scan.key_last_used is None else _last_used.decode(scan.key_last_used)
    except msgspec.DecodeError:  # ValidationError included: msgspec's decode words it
        return None
    return Post(scan.gateway_id, scan.ids, scan.groups, scan.rows, scan.started_max,
                lambda i: _row.decode(scan.row(i)), opens, last)


def from_batch(batch: wire.UsageBatch) -> Post:
    """A batch msgspec decoded (or a test built) as the ingest takes it: the same sums,
    added up in Python, its records encoded as rows without their bodies."""
    firsts: dict[str, wire.UsageRecord] = {}
    for r in batch.ended():
        firsts.setdefault(r.request_id, r)  # the first record of an id is the one counted
    recs = list(firsts.values())
    sums: dict[tuple[Any, ...], list[int]] = {}
    for r in recs:
        acc = sums.setdefault(group_key(r), [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += r.status != "ok"
        acc[2] += r.prompt_tokens
        acc[3] += r.completion_tokens
    astuple = msgspec.structs.astuple
    return Post(
        batch.gateway_id,
        list(firsts),
        [(*k, *v) for k, v in sums.items()],
        _json.encode([astuple(r)[:_ROW_FIELDS] for r in recs]).decode(),
        max((r.started_at for r in recs), default=0.0),
        recs.__getitem__,
        batch.opens,
        batch.key_last_used,
        {r.request_id: (_text(r.request_body), _text(r.response_body))
         for r in recs if r.request_body != wire.NULL or r.response_body is not None},
    )


def _text(raw: msgspec.Raw | bytes | None) -> str | None:
    if raw is None or raw == wire.NULL:
        return None
    return bytes(raw).decode("utf-8", "replace")
