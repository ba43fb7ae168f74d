"""_core.Router's Python surface: configuration errors, route reasons, counters."""

from __future__ import annotations

import json

import pytest

from llmgw import _core


def _router() -> _core.Router:
    r = _core.Router()
    r.set_replicas([("a", ["m"]), ("b", ["m"]), ("c", ["m"])])
    return r


def _chat(*turns: tuple[str, str]) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": k, "content": v} for k, v in turns]}).encode()


def test_route_follows_the_conversation_and_explains_itself() -> None:
    r = _router()
    r.configure("m", {"policy": "prefix"})
    first = _chat(("system", "S" * 400), ("user", "hello"))
    got = r.route("m", first, True)
    assert got is not None
    i, reason = got
    assert json.loads(reason)["kind"] == "cache_miss"
    assert r.outstanding(i) == 1
    r.release(i)
    second = _chat(("system", "S" * 400), ("user", "hello"), ("assistant", "hi"), ("user", "more"))
    got = r.route("m", second, True, [])
    assert got is not None and got[0] == i
    why = json.loads(got[1])
    assert (why["policy"], why["kind"], why["unit"], why["guard"]) == ("prefix", "cache_hit", "bytes", False)
    assert why["matched"] < why["total"]
    assert r.route("m", second, True, [0, 1, 2]) is None
    assert r.decisions() == {"m|prefix|cache_hit": 1, "m|prefix|cache_miss": 1}


def test_a_hot_prefix_warms_a_second_replica_and_says_the_guard_fired() -> None:
    r = _router()
    r.configure("m", {"policy": "prefix"})
    body = _chat(("system", "S" * 400), ("user", "hello"))
    kinds, homes = [], []
    for _ in range(3):  # overlapping: none released
        got = r.route("m", body, True)
        assert got is not None
        why = json.loads(got[1])
        kinds.append((why["kind"], why["guard"]))
        homes.append(got[0])
    # Third request: 2 outstanding on the first replica; 3 would pass the bound.
    assert kinds == [("cache_miss", False), ("cache_hit", False), ("guarded", True)]
    assert why["bound"] == pytest.approx(1 + 1.5) and why["matched"] == 0
    assert homes[0] == homes[1] != homes[2]
    got = r.route("m", body, True)
    assert got is not None and got[0] == homes[2]
    assert json.loads(got[1])["kind"] == "cache_hit"
    assert r.decisions() == {"m|prefix|cache_hit": 2, "m|prefix|cache_miss": 1, "m|prefix|guarded": 1}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"polcy": "prefix"}, "polcy"),
        ({"policy": "fastest"}, "policy"),
        ({"guard_rel": 0.5}, "guard_rel"),
        ({"weights": {"queue": "high"}}, "weights.queue"),
    ],
)
def test_configure_names_the_bad_field(config: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f'model "m".*{field}'):
        _router().configure("m", config)


def test_status_says_why_kv_falls_back() -> None:
    r = _router()
    r.configure("m", '{"policy": "kv"}')
    st = r.status("m")
    assert (st["policy"], st["effective"], st["tokenizer"]) == ("kv", "prefix", False)
    assert isinstance(st["why"], str) and "tokenizer" in st["why"]
    r.set_engine_load(0, 1, 2, 0.5)
    with pytest.raises(IndexError):
        r.set_engine_load(7, 1, 2, 0.5)
