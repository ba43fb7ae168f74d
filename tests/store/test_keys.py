"""API keys on both backends: shown once, stored hashed, lifetimes, revocation, member removal,
and what gateways are sent (the snapshot)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llmgw.protocol import wire
from llmgw.protocol.wire import Limits
from llmgw.secrets.keys import key_hash
from llmgw.store import Database, audit
from llmgw.store import keys as k
from llmgw.store import tenancy as t
from llmgw.store.errors import Forbidden, Invalid, NotFound
from llmgw.store.removals import delete_user, remove_member
from llmgw.store.snapshot import build_snapshot, snapshot_version, touch_keys
from llmgw.store.usage import ingest
from llmgw.store.users import add_member, create_user
from tests.support.store import HASH_KEY, with_db

A = "admin"
DAY = 86400.0


async def tree(db: Database) -> None:
    """acme/ml/{chat,eval} and acme/web/site."""
    await t.create_org(db, A, "acme")
    await t.create_team(db, A, "acme", "ml")
    await t.create_team(db, A, "acme", "web")
    await t.create_project(db, A, "acme/ml", "chat", limits=Limits(rpm=60), keep_bodies=True)
    await t.create_project(db, A, "acme/ml", "eval")
    await t.create_project(db, A, "acme/web", "site")


async def all_values(db: Database) -> list[str]:
    """Every text value in every table of the store."""
    tables = ["orgs", "teams", "projects", "users", "memberships", "api_keys", "audit", "state"]
    out = []
    for table in tables:
        for row in await db.fetch(f"SELECT * FROM {table}"):
            # sqlite3.Row iterates over values, not names: keys() is needed here.
            out += [str(row[c]) for c in row.keys()]  # noqa: SIM118 - a Row iterates over values
    return out


def test_issued_key_is_shown_once_and_stored_hashed(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        issued = await k.issue_key(db, A, project="acme/ml/chat", name="ci", hash_key=HASH_KEY,
                                   limits=Limits(rpm=10), now=1000.0)
        assert issued.key.startswith("sk-llmgw-") and len(issued.key) == 49
        assert issued.prefix == issued.key[:16]
        assert issued.id.startswith("key_")
        assert (issued.path, issued.expires_at, issued.revoked_at) == ("acme/ml/chat", None, None)
        # Only the keyed hash is kept: the key is in no column of any table, audit included.
        values = await all_values(db)
        assert not [v for v in values if issued.key in v]
        stored = await db.fetchval("SELECT hash FROM api_keys WHERE id = $1", issued.id)
        assert stored == key_hash(HASH_KEY, issued.key)
        assert not [v for v in values if stored in v and v != stored]  # not in audit either
        # Every later read shows the view, never the key or hash.
        view = await k.get_key(db, issued.id)
        assert not hasattr(view, "key") and not hasattr(view, "hash")
        assert [x.id for x in await k.list_keys(db, project="acme/ml/chat")] == [issued.id]
        assert await k.list_keys(db, project="acme/ml/eval") == []

    with_db(store_url, body)


def test_lifetimes_at_each_level(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        p = "acme/ml/chat"

        async def life(ttl: float | None = None, gateway: float | None = None) -> float | None:
            key = await k.issue_key(db, A, project=p, name="x", hash_key=HASH_KEY, ttl=ttl,
                                    max_key_ttl=gateway, now=0.0)
            return key.expires_at

        assert await life() is None  # no maximum anywhere: never expires
        assert await life(ttl=DAY) == DAY
        assert await life(gateway=90 * DAY) == 90 * DAY
        await t.update_org(db, A, "acme", max_key_ttl=60 * DAY)
        assert await life(gateway=90 * DAY) == 60 * DAY
        await t.update_team(db, A, "acme/ml", max_key_ttl=30 * DAY)
        assert await life(gateway=90 * DAY) == 30 * DAY
        await t.update_project(db, A, p, max_key_ttl=7 * DAY)
        assert await life(gateway=90 * DAY) == 7 * DAY
        assert await life(ttl=DAY, gateway=90 * DAY) == DAY
        assert await life(gateway=3600.0) == 3600.0  # the gateway's is now the smallest
        for ttl, gateway, level in [(8 * DAY, None, "project 'acme/ml/chat' allows (7d)"),
                                    (DAY, 3600.0, "gateway's max_key_ttl allows (1h)")]:
            with pytest.raises(Invalid) as e:
                await life(ttl=ttl, gateway=gateway)
            assert e.value.code == "keys.ttl_too_long"
            assert level in e.value.message
        await t.update_project(db, A, p, max_key_ttl=None)
        with pytest.raises(Invalid) as e:
            await life(ttl=31 * DAY)
        assert "team 'acme/ml' allows (30d)" in e.value.message

    with_db(store_url, body)


def test_revoke_is_idempotent_and_drops_the_key_from_the_snapshot(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        v0 = await snapshot_version(db)
        a = await k.issue_key(db, A, project="acme/ml/chat", name="a", hash_key=HASH_KEY)
        b = await k.issue_key(db, A, project="acme/web/site", name="b", hash_key=HASH_KEY,
                              ttl=DAY)
        assert await snapshot_version(db) == v0 + 2
        snap = await build_snapshot(db)
        assert snap.version == v0 + 2
        assert sorted(e.key_id for e in snap.keys) == sorted([a.id, b.id])
        entry = next(e for e in snap.keys if e.key_id == a.id)
        chat = await t.get_project(db, "acme/ml/chat")
        assert (entry.hash, entry.project_id, entry.team_id, entry.org_id, entry.keep_bodies,
                entry.expires_at) == (key_hash(HASH_KEY, a.key), chat.id, chat.team_id,
                                      chat.org_id, True, None)
        assert snap.projects[chat.id] == Limits(rpm=60)
        assert len(snap.projects) == 3
        revoked = await k.revoke_key(db, A, a.id)
        assert revoked.revoked_at is not None
        assert await snapshot_version(db) == v0 + 3
        again = await k.revoke_key(db, A, a.id)
        assert again == revoked and await snapshot_version(db) == v0 + 3
        assert [e.key_id for e in (await build_snapshot(db)).keys] == [b.id]
        # Expired keys are left out too.
        assert [e.key_id for e in (await build_snapshot(db, now=b.created_at + 2 * DAY)).keys] == []
        assert [x.id for x in await k.list_keys(db)] == [b.id]
        assert {x.id for x in await k.list_keys(db, revoked=True)} == {a.id, b.id}
        # A project with a live key cannot go; once revoked it can, with its keys.
        with pytest.raises(Exception, match="still has 1 key"):
            await t.delete_project(db, A, "acme/web/site")
        await k.revoke_key(db, A, b.id)
        await t.delete_project(db, A, "acme/web/site")
        assert len((await build_snapshot(db)).projects) == 2

    with_db(store_url, body)


def test_patch_limits_bumps_and_rename_does_not(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        key = await k.issue_key(db, A, project="acme/ml/chat", name="a", hash_key=HASH_KEY)
        v = await snapshot_version(db)
        assert (await k.update_key(db, A, key.id, name="renamed")).name == "renamed"
        assert await snapshot_version(db) == v
        assert (await k.update_key(db, A, key.id, limits=Limits(tpm=5))).limits == Limits(tpm=5)
        assert await snapshot_version(db) == v + 1
        assert (await build_snapshot(db)).keys[0].limits == Limits(tpm=5)
        assert (await k.update_key(db, A, key.id, limits=None)).limits == Limits()

    with_db(store_url, body)


def test_user_keys_need_membership_and_go_with_it(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        await create_user(db, A, "alice")
        with pytest.raises(Forbidden) as e:
            await k.issue_key(db, A, project="acme/ml/chat", name="a", user="alice",
                              hash_key=HASH_KEY)
        assert e.value.code == "keys.user_not_member"
        await add_member(db, A, "alice", "team:acme/ml", "member")
        await add_member(db, A, "alice", "project:acme/ml/eval", "viewer")
        await add_member(db, A, "alice", "org:acme", "viewer")
        chat = await k.issue_key(db, A, project="acme/ml/chat", name="a", user="alice",
                                 hash_key=HASH_KEY)
        ev = await k.issue_key(db, A, project="acme/ml/eval", name="b", user="alice",
                               hash_key=HASH_KEY)
        site = await k.issue_key(db, A, project="acme/web/site", name="c", user="alice",
                                 hash_key=HASH_KEY)
        other = await k.issue_key(db, A, project="acme/ml/chat", name="d", hash_key=HASH_KEY)
        # Lists name the user, as `ctl keys list` shows them.
        assert {x.name: x.user for x in await k.list_keys(db)} == {"a": "alice", "b": "alice", "c": "alice", "d": None}
        # Leaving the org: the team membership still covers chat and eval, nothing else does
        # site: only site's key goes.
        v = await snapshot_version(db)
        await remove_member(db, A, "alice", "org:acme")
        live = {x.id for x in await k.list_keys(db)}
        assert live == {chat.id, ev.id, other.id} and site.id not in live
        assert await snapshot_version(db) == v + 1
        # Leaving the team: eval is still covered by its own membership.
        await remove_member(db, A, "alice", "team:acme/ml")
        assert {x.id for x in await k.list_keys(db)} == {ev.id, other.id}
        with pytest.raises(NotFound) as e2:
            await remove_member(db, A, "alice", "team:acme/ml")
        assert e2.value.code == "members.not_found"
        # Deleting the user revokes the rest of theirs and only theirs.
        await delete_user(db, A, "alice")
        assert {x.id for x in await k.list_keys(db)} == {other.id}
        assert [e.key_id for e in (await build_snapshot(db)).keys] == [other.id]
        revoked = await k.get_key(db, ev.id)
        assert (revoked.revoked_at is not None, revoked.user_id, revoked.user) == (True, None, None)

    with_db(store_url, body)


def test_touch_keys_records_last_use_and_never_goes_back(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        key = await k.issue_key(db, A, project="acme/ml/chat", name="a", hash_key=HASH_KEY)
        v = await snapshot_version(db)
        await touch_keys(db, {key.id: 500.0, "key_unknownunknownu": 1.0})
        await touch_keys(db, {key.id: 400.0})
        await touch_keys(db, {})
        assert (await k.get_key(db, key.id)).last_used_at == 500.0
        assert await snapshot_version(db) == v

    with_db(store_url, body)


def test_a_usage_post_records_its_keys_last_use(store_url: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        key = await k.issue_key(db, A, project="acme/ml/chat", name="a", hash_key=HASH_KEY)
        await ingest(db, wire.UsageBatch(gateway_id="gw", key_last_used={key.id: 700.0}), 701.0)
        await ingest(db, wire.UsageBatch(gateway_id="gw", key_last_used={key.id: 600.0}), 702.0)
        assert (await k.get_key(db, key.id)).last_used_at == 700.0

    with_db(store_url, body)


@pytest.mark.parametrize("ref", ["x' OR '1'='1", "key_aaaa'; DROP TABLE api_keys; --",
                                 "key_%", "sk-llmgw-abc", ""])
def test_hostile_key_ids_are_plain_data(store_url: str, ref: str) -> None:
    async def body(db: Database) -> None:
        await tree(db)
        await k.issue_key(db, A, project="acme/ml/chat", name="a", hash_key=HASH_KEY)
        for call in (k.get_key(db, ref), k.revoke_key(db, A, ref)):
            with pytest.raises(NotFound):
                await call
        with pytest.raises((NotFound, Invalid)):
            await k.list_keys(db, project=ref)
        assert len(await k.list_keys(db)) == 1

    with_db(store_url, body)


class Counting:
    """A Database that counts the statements sent through it."""

    def __init__(self, db: Database) -> None:
        self.db, self.statements = db, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.db, name)
        if name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
            self.statements += 1
        return attr


def test_revoking_many_keys_is_a_few_statements_with_an_audit_row_each(store_url: str) -> None:
    async def revoke(db: Database, ids: list[str], at: float) -> tuple[int, int]:
        async with db.transaction() as tx:
            counting = Counting(tx)
            done = await k.revoke_ids(counting, A, ids, "user bob deleted", at)  # type: ignore[arg-type]
        return done, counting.statements

    async def body(db: Database) -> None:
        await tree(db)
        one = await k.issue_key(db, A, project="acme/ml/chat", name="one", hash_key=HASH_KEY)
        many = [await k.issue_key(db, A, project=p, name=f"k{i}", hash_key=HASH_KEY, ttl=DAY,
                                  limits=Limits(rpm=i + 1))
                for i, p in enumerate(["acme/ml/chat", "acme/ml/eval", "acme/web/site"] * 3)]
        gone = await k.revoke_key(db, A, many[0].id)  # already revoked: left as it is
        befores = {x.id: await k.get_key(db, x.id) for x in [one, *many]}
        # An id that is no key: NotFound, and the transaction revokes nothing.
        with pytest.raises(NotFound) as e:
            await revoke(db, [one.id, "key_not_there"], 500.0)
        assert (e.value.code, await k.get_key(db, one.id)) == ("keys.not_found", befores[one.id])
        v = await snapshot_version(db)
        done1, n1 = await revoke(db, [one.id], 1000.5)
        ids = [x.id for x in many] + [many[1].id]
        done9, n9 = await revoke(db, ids, 2000.25)
        assert (done1, done9) == (1, 8) and n9 == n1  # the same statements for 1 key and for 9
        assert await snapshot_version(db) == v + 2  # one bump per call
        assert await k.get_key(db, many[0].id) == gone  # not revoked again
        events = [e for e in await audit.query(db, limit=1000, contains="key_")
                  if e.action == "key.revoke" and e.at in (1000.5, 2000.25)]
        assert sorted(e.target for e in events) == sorted([one.id] + [x.id for x in many[1:]])
        for e in events:
            # What `record` wrote before, key by key: the view before, the view after + reason.
            after = await k.get_key(db, e.target)
            assert after.revoked_at == e.at
            assert (e.actor, e.before) == (A, msgspec.to_builtins(befores[e.target]))
            assert e.after == {**msgspec.to_builtins(after), "reason": "user bob deleted"}

    with_db(store_url, body)


def test_the_gateways_key_index_finds_keys_by_the_stored_hash() -> None:
    from llmgw._core import KeyIndex

    keys = ["sk-llmgw-" + "a" * 40, "sk-llmgw-" + "Z9" * 20, "", "sk-llmgw-é" + "x" * 39]
    index = KeyIndex(HASH_KEY, [(key_hash(HASH_KEY, k), k) for k in keys] + [("not a hash", "never")])
    assert (len(index), index.skipped) == (4, 1)
    for key in keys:
        assert index.get(key) == key
        assert index.get(key) == key  # the keyed state is not used up
    assert index.get("sk-llmgw-" + "b" * 40) is None
    assert KeyIndex(b"other key", [(key_hash(HASH_KEY, keys[0]), 1)]).get(keys[0]) is None
