"""`_core.scan_usage`: the control plane's native read of a usage post agrees with msgspec.

The scan must be sound: whatever it takes, msgspec decodes into the same requests, and
its sums are what the store's Python adds per record. Whatever it declines goes to
msgspec, so declining is always safe; it only must not decline what gateways send.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw import _core
from llmgw.gateway.usage import _Outgoing
from llmgw.protocol.wire import NULL, UsageBatch, UsageOpen, UsageRow
from llmgw.store.usage_post import Post, from_batch, from_json
from llmgw.store.usage_report import hour_of

text = st.text(max_size=30)
maybe = st.none() | text
count = st.integers(min_value=0, max_value=2**53)
millis = st.floats(min_value=0, max_value=1e12, allow_nan=False)
instant = st.floats(min_value=0, max_value=1e11, allow_nan=False)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def rows(draw: st.DrawFn) -> UsageRow:
    route = draw(st.none() | json_value)
    return UsageRow(
        draw(st.sampled_from(["a", "b", "c"]) | text), draw(st.sampled_from(["m", "n"]) | text), draw(text),
        draw(maybe), draw(st.sampled_from(["ok", "upstream_error"]) | text), draw(st.integers(0, 999)),
        draw(st.booleans()), draw(count), draw(count), draw(st.booleans()), draw(st.none() | millis),
        draw(millis), draw(maybe), draw(count), draw(instant),
        NULL if route is None else msgspec.Raw(json.dumps(route).encode()),
        draw(maybe), draw(maybe), draw(maybe), draw(maybe), draw(maybe))


def _sums(recs: list[UsageRow]) -> dict[tuple[Any, ...], list[int]]:
    """What the store's Python adds per record: the first record of an id, by rollup group."""
    out: dict[tuple[Any, ...], list[int]] = {}
    seen: set[str] = set()
    for r in recs:
        if r.request_id in seen:
            continue
        seen.add(r.request_id)
        key = (hour_of(r.started_at), r.org_id or "", r.team_id or "", r.project_id or "",
               r.user_id or "", r.key_id or "", r.model)
        acc = out.setdefault(key, [0, 0, 0, 0])
        for i, v in enumerate((1, r.status != "ok", r.prompt_tokens, r.completion_tokens)):
            acc[i] += v
    return out


def _groups(post: Post) -> dict[tuple[Any, ...], list[int]]:
    return {g[:7]: list(g[7:]) for g in post.groups}


def _texts(r: UsageRow) -> list[str]:
    return [s for s in msgspec.structs.astuple(r) if isinstance(s, str)]


@settings(max_examples=300, deadline=None)
@given(recs=st.lists(rows(), max_size=8))
def test_a_post_msgspec_wrote_is_read_as_msgspec_reads_it(recs: list[UsageRow]) -> None:
    body = msgspec.json.encode(UsageBatch(gateway_id="gw", rows=recs, key_last_used={"k": 2.5}))
    post = from_json(body)
    if any("\x00" in s for r in recs for s in _texts(r)):
        assert post is None  # a NUL is msgspec's path's to replace
        return
    assert post is not None
    decoded = msgspec.json.decode(body, type=UsageBatch)
    assert post.gateway_id == "gw" and post.key_last_used == {"k": 2.5} and post.opens == []
    scan = _core.scan_usage(body)
    assert scan is not None and scan.rows_posted == len(recs)
    assert post.ids == list(dict.fromkeys(r.request_id for r in recs))
    assert _groups(post) == _sums(decoded.rows)
    firsts: dict[str, UsageRow] = {}
    for r in recs:
        firsts.setdefault(r.request_id, r)
    assert post.started_max == max((r.started_at for r in firsts.values()), default=0.0)
    assert msgspec.json.decode(post.rows, type=list[UsageRow]) == decoded.rows
    for i, rid in enumerate(post.ids):
        assert post.record(i) == firsts[rid]
    # msgspec's path (from a decoded batch) adds up the same post.
    other = from_batch(decoded)
    assert (other.ids, _groups(other), other.started_max) == (post.ids, _groups(post), post.started_max)
    assert msgspec.json.decode(other.rows, type=list[UsageRow]) == list(firsts.values())
    assert [other.record(i) for i in range(len(other.ids))] == [post.record(i) for i in range(len(post.ids))]


_TOKENS = ["null", "true", "0", "-0", "1.5", "1e3", "-1", "1000", "9007199254740993", "1e12", "1e400",
           '""', '"ok"', '"\\u0000"', '"\\ud800"', "[]", "{}", '{"a":', "01", "1.", ".5", "tru", '"\x01"',
           "[1,2,]", '{"a":1,}', "NaN", '"\\x"', '"\\ud83d\\ude00"', "1E+2"]


@settings(max_examples=400, deadline=None)
@given(rec=rows(), at=st.integers(0, 22), token=st.sampled_from(_TOKENS) | json_value.map(json.dumps),
       cut=st.booleans())
def test_what_the_scan_takes_msgspec_takes_the_same(rec: UsageRow, at: int, token: str, cut: bool) -> None:
    fields = [msgspec.json.encode(v).decode() for v in msgspec.structs.astuple(rec)]
    fields[at] = token
    row = "[" + ",".join(fields[: at + 1] if cut else fields) + "]"
    body = ('{"gateway_id":"gw","rows":[' + row + "]}").encode()
    post = from_json(body)
    if post is None:
        return  # declined: msgspec decides, as before
    decoded = msgspec.json.decode(body, type=UsageBatch)  # must not raise
    assert post.ids == [decoded.rows[0].request_id]
    assert _groups(post) == _sums(decoded.rows)
    assert msgspec.json.decode(post.rows, type=list[UsageRow]) == decoded.rows
    assert (from_batch(decoded).ids, _groups(from_batch(decoded))) == (post.ids, _groups(post))


def test_what_a_gateway_posts_is_read_natively() -> None:
    native = _core.UsageRows()
    for i in range(3):
        native.finish(f"r{i}", "m", "up", "rep", "ok" if i else "timeout", 200, bool(i), 10 * i, i, False,
                   None if i else 0.0123, 1.5, "stop", 0, 1_764_000_000.0 + i * 1800,
                   '{"policy":"kv","candidates":[{"index":0,"load":3}]}', "key_1", None, "proj", "team", "org")
    opens = [UsageOpen(request_id="r9", model="m", started_at=1.0, prompt_estimate=3)]
    body = msgspec.json.encode(_Outgoing(gateway_id="gw", opens=opens, rows=msgspec.Raw(native.head(3)),
                                         key_last_used={"key_1": 1.0}))
    post = from_json(body)
    assert post is not None and post.opens == opens and post.ids == ["r0", "r1", "r2"]
    hour = hour_of(1_764_000_000.0)
    assert _groups(post) == {
        (hour, "org", "team", "proj", "", "key_1", "m"): [2, 1, 10, 1],
        (hour + 3600, "org", "team", "proj", "", "key_1", "m"): [1, 0, 20, 2],
    }


def test_kept_bodies_and_old_gateways_objects_go_to_msgspec() -> None:
    rec = UsageRow("r1", "m", "m", None, "ok", 200, False, 1, 2, False, None, 3.0, None, 0, 5.0,
                   request_body=msgspec.Raw(b'{"messages":[]}'), response_body=b"data: x")
    assert from_json(msgspec.json.encode(UsageBatch(gateway_id="gw", rows=[rec]))) is None
    assert from_json(msgspec.json.encode(UsageBatch(gateway_id="gw", finals=[rec]))) is None
    post = from_batch(UsageBatch(gateway_id="gw", finals=[rec]))
    assert post.bodies == {"r1": ('{"messages":[]}', "data: x")}
    assert msgspec.json.decode(post.rows, type=list[UsageRow])[0].request_body == NULL


def test_a_nul_in_a_route_is_stored_as_posted_and_in_text_goes_to_msgspec() -> None:
    rec = UsageRow("r1", "m", "m", None, "ok", 200, False, 1, 2, False, None, 3.0, None, 0, 5.0,
                   route=msgspec.Raw(b'{"\\u0000":1}'))
    post = from_json(msgspec.json.encode(UsageBatch(gateway_id="gw", rows=[rec])))
    assert post is not None and '{"\\u0000":1}' in post.rows
    rec.model = "m\x00"
    assert from_json(msgspec.json.encode(UsageBatch(gateway_id="gw", rows=[rec]))) is None
