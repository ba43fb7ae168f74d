"""_core.patch_request against msgspec's view of the JSON (property test)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from llmgw import _core

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)


@given(
    rest=st.dictionaries(
        st.text(max_size=6).filter(lambda k: k not in ("model", "stream_options")),
        values,
        max_size=4,
    ),
    options=st.none() | st.just({}) | st.fixed_dictionaries({"include_usage": st.booleans()}),
    model=st.text(min_size=1, max_size=10),
    indent=st.sampled_from([None, 1]),
)
def test_patch_sets_exactly_what_was_asked(
    rest: dict[str, Any], options: Any, model: str, indent: int | None
) -> None:
    doc = {"model": "alias", **rest}
    if options is not None:
        doc["stream_options"] = options
    body = json.dumps(doc, indent=indent).encode()
    out = _core.patch_request(body, model, True)
    got = msgspec.json.decode(out)
    assert got["model"] == model
    assert got["stream_options"]["include_usage"] is True
    assert {k: v for k, v in got.items() if k not in ("model", "stream_options")} == rest


def test_unchanged_body_is_the_same_object() -> None:
    body = b'{"model":"m","stream_options":{"include_usage":true}}'
    assert _core.patch_request(body, None, True) is body
