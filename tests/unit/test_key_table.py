"""`KeyTable.resolve`: the header shapes it takes, and what it refuses, without a gateway."""

from __future__ import annotations

import time

import pytest

from llmgw.gateway.auth import IN_QUERY, MALFORMED, NO_KEY, SCHEME, UNKNOWN, KeyTable, Unauthorized
from llmgw.protocol.wire import KeyEntry, Snapshot
from llmgw.secrets.keys import HASH_LABEL, derive, key_hash

HASH_KEY = derive(b"s" * 32, HASH_LABEL)
KEY = "sk-llmgw-" + "a1B2_-" * 6 + "zzzz"


def _table(expires_at: float | None = None, replay_token: str | None = None) -> KeyTable:
    entry = KeyEntry(key_id="key_1", hash=key_hash(HASH_KEY, KEY), org_id="o", team_id="t", project_id="p",
                     expires_at=expires_at)
    table = KeyTable(HASH_KEY, replay_token)
    table.load(Snapshot(version=1, keys=[entry], projects={}))
    return table


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY} ",
                                    f"Bearer {KEY}\t"])
def test_the_usual_header_and_its_variants_find_the_key(header: str) -> None:
    assert _table().resolve(header, "").key_id == "key_1"


@pytest.mark.parametrize(("header", "why"), [
    (None, NO_KEY), ("", NO_KEY), ("Bearer", MALFORMED), (f"Basic {KEY}", MALFORMED),
    (f"Bearer {KEY}x", MALFORMED), (f"Bearer {KEY[:-1]}", MALFORMED), (f"Token {KEY}", MALFORMED),
    # The usual length and prefix, another key: the fast path hashes it and finds nothing.
    (f"Bearer {KEY[:-1]}y", UNKNOWN), (f"Bearer{KEY} ", MALFORMED),
])
def test_other_headers_are_refused_with_their_reason(header: str | None, why: str) -> None:
    with pytest.raises(Unauthorized) as e:
        _table().resolve(header, "")
    assert str(e.value) == why


def test_an_expiring_key_works_until_it_expires_and_then_says_when() -> None:
    table = _table(expires_at=1_000.0)
    assert table.resolve(f"Bearer {KEY}", "", now=999.0).key_id == "key_1"
    with pytest.raises(Unauthorized, match="key_1 expired at 1970-01-01 00:16:40Z"):
        table.resolve(f"Bearer {KEY}", "", now=1_000.0)


def test_a_key_in_the_query_is_refused_even_beside_a_good_header() -> None:
    with pytest.raises(Unauthorized) as e:
        _table().resolve(f"Bearer {KEY}", f"api_key={KEY}")
    assert str(e.value) == IN_QUERY


def test_get_after_looks_up_only_what_follows_the_scheme() -> None:
    keys = _table().keys
    assert keys.get_after(f"Bearer {KEY}", "Bearer ").key_id == "key_1"
    for header in (f"bearer {KEY}", f"Bearer  {KEY}", KEY, "Bearer ", ""):
        assert keys.get_after(header, "Bearer ") is None


def test_get_live_finds_only_a_key_that_has_not_expired() -> None:
    """The gateway's one-call path: a key whose expiry passed (by the wall clock) is not
    found there, so that `resolve` says why."""
    now = time.time()
    assert _table().keys.get_live(f"Bearer {KEY}", SCHEME).key_id == "key_1"
    assert _table(expires_at=now + 60).keys.get_live(f"Bearer {KEY}", SCHEME).key_id == "key_1"
    assert _table(expires_at=now - 1).keys.get_live(f"Bearer {KEY}", SCHEME) is None
    for header in (f"bearer {KEY}", f"Bearer {KEY[:-1]}y", ""):
        assert _table().keys.get_live(header, SCHEME) is None


def test_the_control_planes_replay_runs_as_the_key_it_names() -> None:
    table = _table(replay_token="gw-token")
    assert table.resolve("Bearer gw-token", "", replay_key="key_1").key_id == "key_1"
    with pytest.raises(Unauthorized, match="key key_2 is revoked or expired, or was removed with its user or project"):
        table.resolve("Bearer gw-token", "", replay_key="key_2")
    with pytest.raises(Unauthorized, match="must name the original request's key in x-llmgw-replay-key"):
        table.resolve("Bearer gw-token", "")
    # The header names a key only beside the gateway token: a client's key stays its own.
    assert table.resolve(f"Bearer {KEY}", "", replay_key="key_2").key_id == "key_1"
    with pytest.raises(Unauthorized) as e:
        table.resolve("Bearer gw-tokeN", "", replay_key="key_1")
    assert str(e.value) == MALFORMED
    # A gateway without the token (no control plane secret) takes no replay.
    with pytest.raises(Unauthorized) as e:
        _table().resolve("Bearer gw-token", "", replay_key="key_1")
    assert str(e.value) == MALFORMED
    # The replayed key's expiry holds as for the key itself.
    with pytest.raises(Unauthorized, match="key_1 expired"):
        _table(expires_at=1_000.0, replay_token="gw-token").resolve("Bearer gw-token", "", now=1_000.0,
                                                                    replay_key="key_1")
