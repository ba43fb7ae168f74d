"""The tenancy tree on both backends: life cycle, name rules, duplicates, moves, deletes."""

from __future__ import annotations

import pytest

from llmgw.protocol.wire import Limits
from llmgw.store import Database
from llmgw.store import tenancy as t
from llmgw.store.errors import Invalid, NotFound, Taken
from llmgw.store.snapshot import snapshot_version
from llmgw.store.users import add_member, create_user, list_members
from tests.support.store import with_db

A = "admin"


def test_tree_life_cycle(store_url: str) -> None:
    async def body(db: Database) -> None:
        org = await t.create_org(db, A, "acme", max_key_ttl=90 * 86400.0, limits=Limits(rpm=100))
        assert org.id.startswith("org_") and len(org.id) == 20
        assert (org.name, org.teams, org.max_key_ttl, org.limits) == ("acme", 0, 7776000.0,
                                                                       Limits(rpm=100))
        team = await t.create_team(db, A, "acme", "ml")
        assert (team.path, team.org_id) == ("acme/ml", org.id)
        proj = await t.create_project(db, A, "acme/ml", "chat", keep_bodies=True,
                                      limits=Limits(tpm=1000))
        assert (proj.path, proj.team_id, proj.org_id, proj.keep_bodies, proj.keys) == (
            "acme/ml/chat", team.id, org.id, True, 0)
        # By ID or by path, everywhere.
        assert await t.get_project(db, proj.id) == await t.get_project(db, "acme/ml/chat")
        assert await t.get_team(db, team.id) == await t.get_team(db, "acme/ml")
        assert (await t.get_org(db, org.id)).teams == 1
        assert [x.path for x in await t.list_teams(db, "acme")] == ["acme/ml"]
        assert [x.path for x in await t.list_projects(db, team.id)] == ["acme/ml/chat"]
        # Renames keep ids and show up in paths.
        await t.update_org(db, A, "acme", name="acme2")
        await t.update_team(db, A, "acme2/ml", name="research", limits=None)
        renamed = await t.update_project(db, A, proj.id, name="bot", keep_bodies=False)
        assert (renamed.id, renamed.path, renamed.keep_bodies) == (proj.id, "acme2/research/bot",
                                                                   False)
        # Deleting from the bottom up.
        await t.delete_project(db, A, renamed.id)
        await t.delete_team(db, A, "acme2/research")
        await t.delete_org(db, A, "acme2")
        assert await t.list_orgs(db) == []
        with pytest.raises(NotFound) as e:
            await t.get_org(db, "acme2")
        assert e.value.code == "tenancy.not_found"

    with_db(store_url, body)


BAD_NAMES = ["", "../x", "a/b", "%2e", "%2e%2e", ".", "..", "a..b", "Acme", "a b", "-a", "a-",
             "x" * 64, "a;drop table orgs", "a'--", "org_aaaaaaaaaaaaaaaa", "ä", "a\x00b", "a:b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused(store_url: str, name: str) -> None:
    async def body(db: Database) -> None:
        with pytest.raises(Invalid) as e:
            await t.create_org(db, A, name)
        assert e.value.code == "tenancy.bad_name"
        assert "1 to 63 lowercase letters" in e.value.message
        org = await t.create_org(db, A, "acme")
        for make in (lambda: t.create_team(db, A, "acme", name),
                     lambda: t.update_org(db, A, org.id, name=name),
                     lambda: create_user(db, A, name)):
            with pytest.raises(Invalid):
                await make()
        # As a reference, a bad name is a 400 too, never a lookup.
        with pytest.raises(Invalid):
            await t.get_team(db, f"acme/{name}")
        assert [o.name for o in await t.list_orgs(db)] == ["acme"]

    with_db(store_url, body)


def test_good_edge_names(store_url: str) -> None:
    async def body(db: Database) -> None:
        for name in ["a", "0", "a.b_c-d", "x" * 63, "org_short"]:
            assert (await t.create_org(db, A, name)).name == name

    with_db(store_url, body)


def test_duplicates_conflict(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, A, "acme")
        await t.create_org(db, A, "other")
        with pytest.raises(Taken) as e:
            await t.create_org(db, A, "acme")
        assert e.value.code == "tenancy.name_taken"
        await t.create_team(db, A, "acme", "ml")
        await t.create_team(db, A, "other", "ml")  # same name, other parent: fine
        with pytest.raises(Taken):
            await t.create_team(db, A, "acme", "ml")
        with pytest.raises(Taken):
            await t.update_org(db, A, "other", name="acme")
        await t.create_project(db, A, "acme/ml", "chat")
        await t.create_project(db, A, "acme/ml", "chat2")
        with pytest.raises(Taken):
            await t.update_project(db, A, "acme/ml/chat2", name="chat")
        await create_user(db, A, "alice")
        with pytest.raises(Taken):
            await create_user(db, A, "alice")

    with_db(store_url, body)


def test_delete_non_empty_conflicts_naming_what_is_left(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, A, "acme")
        await t.create_team(db, A, "acme", "ml")
        await t.create_team(db, A, "acme", "web")
        await t.create_project(db, A, "acme/ml", "chat")
        with pytest.raises(Taken) as e:
            await t.delete_org(db, A, "acme")
        assert (e.value.code, e.value.message) == (
            "tenancy.not_empty",
            "organization 'acme' still has 2 team(s) (ml, web); delete or move them first")
        with pytest.raises(Taken) as e:
            await t.delete_team(db, A, "acme/ml")
        assert "still has 1 project(s) (chat)" in e.value.message
        await t.delete_team(db, A, "acme/web")
        assert (await t.get_org(db, "acme")).teams == 1

    with_db(store_url, body)


def test_moves(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, A, "acme")
        await t.create_org(db, A, "beta")
        ml = await t.create_team(db, A, "acme", "ml")
        await t.create_team(db, A, "beta", "ml")
        web = await t.create_team(db, A, "acme", "web")
        chat = await t.create_project(db, A, "acme/ml", "chat")
        await t.create_project(db, A, "acme/web", "chat")
        v0 = await snapshot_version(db)
        # A team into an org where its name is taken: 409, nothing moved.
        with pytest.raises(Taken) as e:
            await t.update_team(db, A, ml.id, org="beta")
        assert e.value.code == "tenancy.name_taken"
        assert (await t.get_team(db, ml.id)).org_id == ml.org_id
        # A project into a team that has its name: 409.
        with pytest.raises(Taken):
            await t.update_project(db, A, chat.id, team="acme/web")
        # To a missing parent: 404; to something that is not a team reference: 400.
        with pytest.raises(NotFound):
            await t.update_team(db, A, ml.id, org="nope")
        with pytest.raises(NotFound):
            await t.update_project(db, A, chat.id, team="acme/nope")
        with pytest.raises(Invalid):
            await t.update_project(db, A, chat.id, team=chat.id)
        assert await snapshot_version(db) == v0
        # Moves that work carry the children; gateways hear of it.
        moved = await t.update_team(db, A, web.id, org="beta")
        assert moved.path == "beta/web"
        assert (await t.get_project(db, "beta/web/chat")).org_id == moved.org_id
        assert await snapshot_version(db) == v0 + 1
        p = await t.update_project(db, A, chat.id, team="beta/ml", name="chat-ml")
        assert p.path == "beta/ml/chat-ml"
        assert await snapshot_version(db) == v0 + 2

    with_db(store_url, body)


def test_deleting_a_scope_drops_its_memberships(store_url: str) -> None:
    async def body(db: Database) -> None:
        await t.create_org(db, A, "acme")
        await t.create_team(db, A, "acme", "ml")
        await create_user(db, A, "alice")
        await add_member(db, A, "alice", "team:acme/ml", "member")
        await add_member(db, A, "alice", "org:acme", "viewer")
        assert [m.scope for m in await list_members(db)] == ["org:acme", "team:acme/ml"]
        await t.delete_team(db, A, "acme/ml")
        assert [m.scope for m in await list_members(db)] == ["org:acme"]

    with_db(store_url, body)


def test_concurrent_changes_serialize(store_url: str) -> None:
    import asyncio

    from llmgw.secrets.keys import HASH_LABEL, derive
    from llmgw.store.keys import issue_key
    from llmgw.store.snapshot import build_snapshot

    async def body(db: Database) -> None:
        assert (await build_snapshot(db)).version == await snapshot_version(db) == 1
        results = await asyncio.gather(*(t.create_org(db, A, "acme") for _ in range(8)),
                                       return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 1
        assert all(isinstance(r, Taken) for r in results if isinstance(r, BaseException))
        await t.create_team(db, A, "acme", "ml")
        await t.create_project(db, A, "acme/ml", "chat")
        v = await snapshot_version(db)
        hk = derive(b"x" * 32, HASH_LABEL)
        issued = await asyncio.gather(*(issue_key(db, A, project="acme/ml/chat", name=f"k{i}",
                                                  hash_key=hk) for i in range(10)))
        # Every issue bumped the version exactly once, none lost to a race.
        assert await snapshot_version(db) == v + 10
        assert len({x.id for x in issued}) == len((await build_snapshot(db)).keys) == 10

    with_db(store_url, body)
