"""The secret helpers and the duration parser (no store needed)."""

from __future__ import annotations

import hashlib
import hmac

import msgspec
import pytest

from llmgw.admin.route import Route
from llmgw.config.units import format_duration, parse_duration, spoken_duration
from llmgw.secrets.keys import HASH_LABEL, Secret, derive, key_hash, key_prefix, new_api_key
from tests.support.admin_routes import ROUTES


def test_derive_and_hash_follow_the_design() -> None:
    secret = b"\x01" * 32
    hk = derive(secret, HASH_LABEL)
    assert hk == hmac.new(secret, b"llmgw api-key hash v1", "sha256").digest()
    assert derive(secret, "llmgw gateway token v1") != hk  # one key per label
    assert key_hash(hk, "sk-llmgw-x") == hashlib.blake2b(b"sk-llmgw-x", key=hk,
                                                         digest_size=32).hexdigest()
    assert key_hash(derive(b"\x02" * 32, HASH_LABEL), "sk-llmgw-x") != key_hash(hk, "sk-llmgw-x")


def test_new_keys_are_long_random_and_never_print() -> None:
    keys = {new_api_key() for _ in range(100)}
    assert len(keys) == 100
    key = keys.pop()
    assert key.reveal().startswith("sk-llmgw-") and len(key) == 49
    assert key_prefix(key) == key.reveal()[:16]
    assert (repr(key), str(key), f"{key}", f"{[key]}") == (
        "Secret('****')", "****", "****", "[Secret('****')]")
    assert key == key.reveal() and isinstance(Secret("x"), str)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90m", 5400.0), ("24h", 86400.0), ("7d", 604800.0), ("2w", 1209600.0), ("30s", 30.0),
    ("1h30m", 5400.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "-1d", "1.5h", "1 d", "7D", "0h", "1y",
                                  "1d; DROP TABLE audit", "9" * 50 + "d"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration|is zero"):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (604800, 5400, 3600, 61, 86400 * 30, 1.5, 0.25, 7776000.0)] == [
        "7d", "90m", "1h", "61s", "30d", "1.5s", "0.25s", "90d"]


def test_every_route_has_a_json_schema() -> None:
    # The OpenAPI document is built from these types; a type msgspec cannot describe
    # would break it at start-up, so find out here.
    types = [t for r in ROUTES for t in (r.request, r.response) if t is not None]
    _, components = msgspec.json.schema_components(types)
    assert {"OrgView", "TeamView", "ProjectView", "UserView", "MemberView", "KeyView", "IssuedKey",
            "AuditEvent", "OrgCreate", "KeyCreate", "Limits"} <= set(components)
    assert components["OrgCreate"]["required"] == ["name"]
    assert components["OrgPatch"].get("required", []) == []
    name = components["OrgCreate"]["properties"]["name"]
    assert (name["maxLength"], name["pattern"][:10]) == (63, "^[a-z0-9](")
    paths = [(r.method, r.path) for r in ROUTES]
    assert len(paths) == len(set(paths))
    assert all(isinstance(r, Route) and r.handler.__doc__ for r in ROUTES)


def test_spoken_duration_reads_as_a_wait() -> None:
    # A 429's `it frees in ...`: a budget's period end is hours away, not 36613.6s.
    got = [spoken_duration(s) for s in (0.04, 59.6, 60, 245, 3600, 36613.6, 86400, 97200, -1.0)]
    assert got == ["0.0s", "59.6s", "1m00s", "4m05s", "1h00m", "10h10m", "1d", "1d3h", "0.0s"]
