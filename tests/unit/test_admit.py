"""`_core.admit`, `_core.take` and `Ticket.release`: the limiter's request path, on shares built by hand."""

from __future__ import annotations

import pytest

from llmgw import _core
from llmgw.gateway.limits import FREE, Denied, Share, TokenLease
from llmgw.protocol.wire import KeyEntry, Limits

NOW = 100.0


def _share(units: int = 0, slots: int = 0, tokens: int | None = None, *, rpm: int | None = 600,
           concurrency: int | None = 4, tpm: int | None = 10_000) -> Share:
    s = Share("key:k", Limits(rpm=rpm, concurrency=concurrency, tpm=tpm))
    s.units, s.units_until, s.slots_free = units, NOW + 10, slots
    if tokens is not None:
        s.tok = TokenLease(7, tokens, NOW + 10)
    return s


def test_takes_a_unit_a_slot_and_the_estimate_from_every_share() -> None:
    key, project = _share(5, 2, 1_000), _share(3, 1, 500)
    ticket = _core.admit((key, project), NOW, 120)
    assert ticket is not None
    assert (key.units, key.slots_free, project.units, project.slots_free) == (4, 1, 2, 0)
    assert key.tok is not None and project.tok is not None
    assert (key.tok.balance, key.tok.in_flight, project.tok.balance, project.tok.in_flight) == (880, 1, 380, 1)
    assert key.last_used == project.last_used == NOW
    assert ticket.slotted == (key, project) and ticket.leases == (key.tok, project.tok) and ticket.cost == 120


def test_release_gives_back_the_slots_and_what_the_estimate_overshot() -> None:
    key = _share(5, 2, 1_000)
    ticket = _core.admit((key,), NOW, 120)
    assert ticket is not None
    ticket.release(100)
    assert key.tok is not None
    assert (key.slots_free, key.tok.balance, key.tok.in_flight) == (2, 900, 0)
    # A request that used more than its estimate takes the difference from the lease.
    ticket = _core.admit((key,), NOW, 120)
    assert ticket is not None
    ticket.release(300)
    assert (key.slots_free, key.tok.balance) == (2, 600)


@pytest.mark.parametrize("lacking", [
    {"units": 0}, {"slots": 0}, {"tokens": None}, {"tokens": 0},
])
def test_takes_nothing_from_any_share_when_one_lacks_something(lacking: dict[str, int | None]) -> None:
    fine = _share(5, 2, 1_000)
    poor = _share(**{"units": 5, "slots": 2, "tokens": 1_000, **lacking})  # type: ignore[arg-type]
    assert _core.admit((fine, poor), NOW, 120) is None
    assert fine.tok is not None
    assert (fine.units, fine.slots_free, fine.tok.balance, fine.tok.in_flight) == (5, 2, 1_000, 0)


def test_expired_units_and_tokens_do_not_admit() -> None:
    s = _share(5, 2, 1_000)
    assert _core.admit((s,), NOW + 10, 1) is None  # units_until and the lease's until are NOW + 10


def test_a_positive_balance_admits_one_request_larger_than_it() -> None:
    s = _share(5, 2, 10)
    assert _core.admit((s,), NOW, 500) is not None
    assert s.tok is not None and s.tok.balance == -490
    assert _core.admit((s,), NOW, 1) is None


def test_limits_that_do_not_apply_are_not_counted() -> None:
    s = _share(0, 0, None, rpm=None, concurrency=None, tpm=None)
    ticket = _core.admit((s,), NOW, 50)
    assert ticket is not None and ticket.slotted == () and ticket.leases == ()
    assert (s.units, s.slots_free) == (0, 0)


def test_the_free_ticket_releases_nothing() -> None:
    FREE.release(1_000)
    assert FREE.slotted == () and FREE.leases == () and FREE.cost == 0


def test_only_holds_are_admitted() -> None:
    with pytest.raises(TypeError):
        _core.admit((object(),), NOW, 1)  # type: ignore[arg-type]


def test_take_admits_from_the_memo_only_for_the_entry_and_project_it_was_worked_out_for() -> None:
    """`_core.take` is `admit` on `memo[entry.key_id]`'s shares when that holds this very entry
    and project; anything else (another snapshot's entry or project, nothing yet, no share)
    is False, for the limiter to work out."""
    entry = KeyEntry(key_id="k", hash="0" * 64, org_id="o", team_id="t", project_id="p")
    project = Limits(rpm=600)
    key = _share(5, 2, 1_000)
    memo: dict[str, object] = {"k": (entry, project, (key,))}
    ticket = _core.take(memo, entry, project, NOW, 120)
    assert ticket is not None and ticket is not False and ticket.slotted == (key,)
    assert key.units == 4
    key.units = 0
    assert _core.take(memo, entry, project, NOW, 120) is None  # the share lacks a unit: a lease call
    other = KeyEntry(key_id="k", hash="0" * 64, org_id="o", team_id="t", project_id="p")
    assert _core.take(memo, other, project, NOW, 120) is False  # equal, but another snapshot's
    assert _core.take(memo, entry, Limits(rpm=600), NOW, 120) is False
    assert _core.take({}, entry, project, NOW, 120) is False
    assert _core.take({"k": (entry, project, ())}, entry, project, NOW, 120) is False
    assert _core.take({"k": "garbage"}, entry, project, NOW, 120) is False


def test_a_refusal_says_when_the_limit_frees_as_a_person_reads_it() -> None:
    assert str(Denied("key:key_1", "rpm", 12.34)) == \
        "the requests per minute limit of key key_1 is reached; it frees in 12.3s"
    assert str(Denied("project:proj_1", "budget", 36613.6)) == \
        "the token budget limit of project proj_1 is reached; it frees in 10h10m"
