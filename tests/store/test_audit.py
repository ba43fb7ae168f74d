"""The audit log on both backends: one row per change, in its transaction, never a secret;
filters that treat their text as data."""

from __future__ import annotations

import pytest

from llmgw.protocol.wire import Limits
from llmgw.store import Database, audit
from llmgw.store import keys as k
from llmgw.store import tenancy as t
from llmgw.store.errors import Invalid, Taken
from llmgw.store.removals import delete_user, remove_member
from llmgw.store.users import add_member, create_user, update_user
from tests.support.store import HASH_KEY, with_db


def test_every_change_is_recorded_with_before_and_after(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, "ann", "acme")
        await t.update_org(db, "ann", "acme", limits=Limits(rpm=5))
        await t.update_org(db, "ann", "acme", limits=Limits(rpm=5))  # no change: no row
        await t.create_team(db, "ann", "acme", "ml")
        await t.update_team(db, "ann", "acme/ml", name="ai")
        await t.create_project(db, "bob", "acme/ai", "chat")
        await t.update_project(db, "bob", "acme/ai/chat", keep_bodies=True)
        await create_user(db, "bob", "carol")
        await update_user(db, "bob", "carol", email="carol@example.com")
        await add_member(db, "bob", "carol", "project:acme/ai/chat", "member")
        await add_member(db, "bob", "carol", "project:acme/ai/chat", "admin")
        key = await k.issue_key(db, "bob", project="acme/ai/chat", name="ci", user="carol",
                                hash_key=HASH_KEY)
        await k.update_key(db, "bob", key.id, name="ci2")
        await k.revoke_key(db, "bob", key.id)
        await k.revoke_key(db, "bob", key.id)  # idempotent: no row
        key2 = await k.issue_key(db, "bob", project="acme/ai/chat", name="k2", user="carol",
                                 hash_key=HASH_KEY)
        await remove_member(db, "bob", "carol", "project:acme/ai/chat")
        await delete_user(db, "bob", "carol")
        await t.delete_project(db, "bob", "acme/ai/chat")
        await t.delete_team(db, "bob", "acme/ai")
        await t.delete_org(db, "bob", "acme")

        events = list(reversed(await audit.query(db, limit=1000)))
        assert [(e.actor, e.action, e.target) for e in events] == [
            ("ann", "org.create", "org:acme"),
            ("ann", "org.update", "org:acme"),
            ("ann", "team.create", "team:acme/ml"),
            ("ann", "team.update", "team:acme/ai"),
            ("bob", "project.create", "project:acme/ai/chat"),
            ("bob", "project.update", "project:acme/ai/chat"),
            ("bob", "user.create", "user:carol"),
            ("bob", "user.update", "user:carol"),
            ("bob", "member.add", "user:carol@project:acme/ai/chat"),
            ("bob", "member.update", "user:carol@project:acme/ai/chat"),
            ("bob", "key.create", key.id),
            ("bob", "key.update", key.id),
            ("bob", "key.revoke", key.id),
            ("bob", "key.create", key2.id),
            ("bob", "member.remove", "user:carol@project:acme/ai/chat"),
            ("bob", "key.revoke", key2.id),
            ("bob", "user.delete", "user:carol"),
            ("bob", "project.delete", "project:acme/ai/chat"),
            ("bob", "team.delete", "team:acme/ai"),
            ("bob", "org.delete", "org:acme"),
        ]
        by = {(e.action, e.target): e for e in events}
        upd = by[("org.update", "org:acme")]
        assert upd.before is not None and upd.after is not None
        assert (upd.before["limits"], upd.after["limits"]) == ({}, {"rpm": 5})
        assert by[("org.create", "org:acme")].before is None
        assert by[("org.delete", "org:acme")].after is None
        assert by[("team.update", "team:acme/ai")].before["path"] == "acme/ml"  # type: ignore[index]
        assert by[("key.revoke", key2.id)].after["reason"] == (  # type: ignore[index]
            "user carol removed from project:acme/ai/chat")
        created = by[("key.create", key.id)].after
        assert created is not None and created["prefix"] == key.key[:16]
        assert "key" not in created and "hash" not in created
        for e in events:
            text = repr(e)
            assert key.key not in text and key2.key not in text

    with_db(store_url, body)


def test_a_refused_change_writes_no_row(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, "ann", "acme")
        await t.create_team(db, "ann", "acme", "ml")
        n = len(await audit.query(db))
        for bad in (t.create_org(db, "ann", "acme"), t.delete_org(db, "ann", "acme")):
            with pytest.raises(Taken):
                await bad
        assert len(await audit.query(db)) == n

    with_db(store_url, body)


def test_filters(store_url: str) -> None:
    async def body(db: Database) -> None:
        await audit.record(db, "ann", "org.create", "org:acme", None, {"name": "acme"}, at=1000.0)
        await audit.record(db, "bob", "team.create", "team:acme/ml", None, None, at=2000.0)
        await audit.record(db, "bob", "org.create", "org:b_c", None, None, at=3000.0)
        await audit.record(db, "x'; DROP TABLE audit; --", "org.create", "org:100%", None, None,
                           at=4000.0)

        async def q(**kw: object) -> list[str]:
            return [e.target for e in await audit.query(db, now=4000.0, **kw)]  # type: ignore[arg-type]

        assert await q() == ["org:100%", "org:b_c", "team:acme/ml", "org:acme"]
        assert await q(limit=2) == ["org:100%", "org:b_c"]
        assert await q(since=2500.0) == ["org:100%", "org:b_c", "team:acme/ml"]
        assert await q(actor="bob") == ["org:b_c", "team:acme/ml"]
        assert await q(contains="TEAM") == ["team:acme/ml"]
        assert await q(contains="acme", actor="ann") == ["org:acme"]
        # LIKE wildcards and quotes in a filter match only themselves.
        assert await q(contains="%") == ["org:100%"]
        assert await q(contains="_") == ["org:b_c"]
        assert await q(contains="b_c") == ["org:b_c"]
        assert await q(contains="\\") == []
        assert await q(contains="' OR '1'='1") == []
        assert await q(actor="x'; DROP TABLE audit; --") == ["org:100%"]
        assert await q(actor="' OR 1=1 --") == []
        assert len(await q()) == 4

    with_db(store_url, body)


@pytest.mark.parametrize("text", ["a\x00b", "\n", "x" * 201])
def test_filters_the_log_cannot_hold_are_refused(store_url: str, text: str) -> None:
    async def body(db: Database) -> None:
        for kw in ({"actor": text}, {"contains": text}):
            with pytest.raises(Invalid) as e:
                await audit.query(db, **kw)  # type: ignore[arg-type]
            assert e.value.code == "audit.bad_filter"

    with_db(store_url, body)


def test_nul_and_control_characters_in_emails_are_refused(store_url: str) -> None:
    async def body(db: Database) -> None:
        for email in ("a\x00@b.c", "a@b\x7f", "a\n@b"):
            with pytest.raises(Invalid):
                await create_user(db, "ann", "carol", email)

    with_db(store_url, body)
