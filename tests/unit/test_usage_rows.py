"""`_core.UsageRows`: a row written natively decodes to the UsageRow the gateway built in Python.

The control plane decodes both kinds the same way (`UsageBatch.rows`), so the native
writer must agree with msgspec on every field: order, escaping, None, rounding.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw import _core
from llmgw.gateway.proxy import _millis
from llmgw.protocol.wire import NULL, UsageBatch, UsageRow

_ROWS = msgspec.json.Decoder(list[UsageRow])
ROUTE = '{"policy":"least_load","kind":"least_load","matched":0,"candidates":[{"index":0,"load":3}]}'

text = st.text(max_size=40)
maybe = st.none() | text
count = st.integers(min_value=0, max_value=2**53)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


def _args(rid: str = "r1", *, ttft: float | None = 0.0123456, route: str | None = ROUTE,
          key: str | None = "key_1") -> tuple[object, ...]:
    return (rid, "model \"x\"", "up/model", "replica-1", "ok", 200, True, 12, 30, False, ttft, 1.25,
            "stop", 1, 1_764_000_000.123456, route, key, None, "proj", "team", "org")


def _python_row(args: tuple[object, ...]) -> UsageRow:
    """The row as the proxy built it before the rows were written natively."""
    (rid, model, up, replica, status, http, stream, prompt, completion, est, ttft, duration, finish,
     retries, started, route, key, user, project, team, org) = args
    return UsageRow(rid, model, up, replica, status, http, stream, prompt, completion, est,  # type: ignore[arg-type]
                    None if ttft is None else _millis(ttft), _millis(duration), finish, retries,  # type: ignore[arg-type]
                    started, NULL if route is None else msgspec.Raw(route), key, user, project, team, org)  # type: ignore[arg-type]


def _native(*rows: tuple[object, ...]) -> _core.UsageRows:
    out = _core.UsageRows()
    for args in rows:
        out.finish(*args)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("args", [
    _args(), _args(ttft=None), _args(route=None), _args(key=None), _args("ünïcødé \u2028 \x01 \\ \"")])
def test_a_native_row_decodes_to_the_row_python_built(args: tuple[object, ...]) -> None:
    got = _ROWS.decode(_native(args).head(1))
    assert got == [_python_row(args)]
    assert msgspec.json.encode(got[0]) == msgspec.json.encode(_python_row(args))


@settings(max_examples=200, deadline=None)
@given(rid=text, model=text, replica=maybe, status=text, http=st.integers(0, 999), stream=st.booleans(),
       prompt=count, completion=count, est=st.booleans(), ttft=st.none() | seconds, duration=seconds,
       finish=maybe, retries=count, started=st.floats(min_value=0, max_value=1e11), ids=st.lists(maybe, min_size=5,
                                                                                             max_size=5))
def test_any_row_agrees_with_msgspec(rid: str, model: str, replica: str | None, status: str, http: int,
                                     stream: bool, prompt: int, completion: int, est: bool, ttft: float | None,
                                     duration: float, finish: str | None, retries: int, started: float,
                                     ids: list[str | None]) -> None:
    args = (rid, model, model, replica, status, http, stream, prompt, completion, est, ttft, duration, finish,
            retries, started, None, *ids)
    assert _ROWS.decode(_native(args).head(1)) == [_python_row(args)]


def test_head_drop_and_replace_keep_the_order() -> None:
    rows = _native(*(_args(f"r{i}") for i in range(5)))
    rows.push(msgspec.json.encode(_python_row(_args("pushed"))))
    assert len(rows) == 6
    assert [r.request_id for r in _ROWS.decode(rows.head(2))] == ["r0", "r1"]
    rows.drop_head(2)
    rows.replace_first(msgspec.json.encode(_python_row(_args("r2b"))))
    assert [r.request_id for r in _ROWS.decode(rows.head(99))] == ["r2b", "r3", "r4", "pushed"]
    rows.drop_head(99)
    assert len(rows) == 0 and rows.nbytes == 0 and rows.head(3) == b"[]"


def test_a_batch_of_native_rows_decodes_as_a_usage_batch() -> None:
    from llmgw.gateway.usage import _Outgoing

    rows = _native(_args("a"), _args("b"))
    body = msgspec.json.encode(_Outgoing(gateway_id="gw", opens=[], rows=msgspec.Raw(rows.head(2)),
                                          key_last_used={"key_1": 1.0}))
    batch = msgspec.json.decode(body, type=UsageBatch)
    assert [r.request_id for r in batch.ended()] == ["a", "b"] and batch.key_last_used == {"key_1": 1.0}


def test_finish_keeps_the_sinks_account_as_each_request_ends() -> None:
    """Tracked, `finish` takes the request's open out, notes its key's use and queues its row,
    or, with `max_pending` records waiting (rows and opens), drops it and counts it."""
    opens: dict[str, object] = {"r1": object(), "long": object()}
    last_used: dict[str, float] = {}
    rows = _core.UsageRows()
    rows.track(opens, last_used, 3)
    assert rows.max_pending == 3
    assert rows.finish(*_args("r1")) is True
    assert list(opens) == ["long"] and last_used == {"key_1": 1_764_000_000.123456}
    assert rows.finish(*_args("r2", key=None)) is True  # 1 row + 1 open waited: room for one more
    assert rows.finish(*_args("r3")) is False  # 2 rows + 1 open: full
    assert rows.dropped == 1 and len(rows) == 2
    assert [r.request_id for r in _ROWS.decode(rows.head(9))] == ["r1", "r2"]
    assert rows.ending("long", None, 0.0) is True and not opens  # its open frees its place first
    rows.dropped = 0
    assert rows.dropped == 0


def test_untracked_rows_only_queue() -> None:
    rows = _core.UsageRows()
    assert rows.max_pending == 0
    assert rows.finish(*_args("r1")) is True and rows.ending("r1", "key_1", 1.0) is True
    assert len(rows) == 1 and rows.dropped == 0
