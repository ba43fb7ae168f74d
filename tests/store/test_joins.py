"""Join tokens and node certificates on both backends: a token is spent once, refused once
expired or forged, and removing a node revokes its certificates."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.secrets.keys import parse_join_token
from llmgw.store import Database, joins
from llmgw.store import fleet as f
from llmgw.store.audit import query
from llmgw.store.errors import Forbidden
from tests.support.store import with_db

KEY = b"k" * 32
CA = "ab" * 32


def test_a_token_joins_one_node_within_its_ttl(store_url: str) -> None:
    async def body(db: Database) -> None:
        tok = await joins.create_token(db, "admin", KEY, 3600, CA, now=100.0)
        assert tok.expires_at == 3700.0 and tok.ca_sha256 == CA
        tid, secret, ca = parse_join_token(tok.token)
        assert (tid, ca) == (tok.id, CA)
        [event] = await query(db)
        assert event.action == "join_token.create" and secret.reveal() not in str(event)
        # Forged: a right id with a wrong secret; nothing is spent.
        with pytest.raises(Forbidden) as err:
            await joins.redeem(db, KEY, tid, type(secret)("nope"), "n1", "s0", 9e9, now=200.0)
        assert err.value.code == "join.bad_token"
        await joins.redeem(db, KEY, tid, secret, "n1", "s1", 9e9, now=200.0)
        with pytest.raises(Forbidden) as err:
            await joins.redeem(db, KEY, tid, secret, "n2", "s2", 9e9, now=201.0)
        assert err.value.code == "join.token_used" and "used by node n1" in err.value.message
        assert await joins.certificate(db, "s2") is None
        late = await joins.create_token(db, "admin", KEY, 60, CA, now=100.0)
        _, late_secret, _ = parse_join_token(late.token)
        with pytest.raises(Forbidden) as err:
            await joins.redeem(db, KEY, late.id, late_secret, "n3", "s3", 9e9, now=161.0)
        assert err.value.code == "join.token_expired"

    with_db(store_url, body)


def test_two_joins_race_for_one_token(store_url: str) -> None:
    async def body(db: Database) -> None:
        tok = await joins.create_token(db, "admin", KEY, 3600, CA)
        _, secret, _ = parse_join_token(tok.token)
        got = await asyncio.gather(
            *(joins.redeem(db, KEY, tok.id, secret, f"n{i}", f"s{i}", 9e9) for i in range(4)),
            return_exceptions=True)
        assert sum(r is None for r in got) == 1
        assert all(isinstance(r, Forbidden) for r in got if r is not None)

    with_db(store_url, body)


def test_removing_a_node_revokes_its_certificates(store_url: str) -> None:
    async def body(db: Database) -> None:
        for serial, node in (("a1", "n1"), ("a2", "n1"), ("b1", "n2")):
            tok = await joins.create_token(db, "admin", KEY, 3600, CA)
            _, secret, _ = parse_join_token(tok.token)
            await joins.redeem(db, KEY, tok.id, secret, node, serial, 9e9)
        await f.save_node(db, f.NodeRow(id="n1", hostname="h", last_heartbeat=1, registered_at=1))
        await f.delete_node(db, "n1")
        for serial in ("a1", "a2"):
            state = await joins.certificate(db, serial)
            assert state is not None and state.node_id == "n1" and state.revoked_at is not None
        assert await joins.certificate(db, "b1") == joins.CertState(node_id="n2", revoked_at=None)

    with_db(store_url, body)
