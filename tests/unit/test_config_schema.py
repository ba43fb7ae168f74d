"""server.yaml as one schema: every fault said with its path, one duration and one size type
everywhere, and the same refusal from `llmgw config check` and from every command that starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.config import ConfigError
from llmgw.config.file import ServerFile, check_server, defaults_yaml, load_server_file
from llmgw.config.units import (
    DURATION_PATTERN,
    duration_text,
    parse_duration,
    parse_size,
    size_text,
)

THREE_FAULTS = """\
modles: []
control_plane:
  lost_after: 10x
gateway:
  timeouts: {idel: 3}
"""
"""A misspelt section, a bad duration and an unknown nested key."""

SAID = [
    "$.modles: no such section; did you mean `models`?",
    "$.control_plane.lost_after: '10x' is not a duration; write a number and a unit (250ms, "
    "30s, 5m, 2h, 7d, or a sum like 1h30m) or a number of seconds (the default is 2m)",
    "$.gateway.timeouts.idel: no such key; did you mean `idle`?",
]


def llmgw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def faults(text: str) -> list[str]:
    """Every fault the loader finds in the YAML `text`."""
    import yaml

    with pytest.raises(ConfigError) as e:
        check_server(yaml.safe_load(text), "server.yaml")
    return e.value.errors


def test_config_check_says_every_fault_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(THREE_FAULTS)
    r = llmgw("config", "check", str(path))
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    assert r.stderr == (f"error: configuration file {path} has 3 errors:\n"
                        + "".join(f"  {line}\n" for line in SAID))


@pytest.mark.parametrize("command", ["up", "server", "gateway"])
def test_every_command_that_starts_refuses_the_file_as_config_check_does(
        tmp_path: Path, command: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(THREE_FAULTS)
    data = tmp_path / "data"
    args = [command, "--config", str(path)]
    if command != "gateway":
        args += ["--data-dir", str(data)]
    r = llmgw(*args, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""  # nothing started, no ready line
    assert r.stderr == llmgw("config", "check", str(path)).stderr
    assert not data.exists()  # refused before the data dir is made


def test_a_good_file_is_one_line_and_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("gateway:\n  endpoints: [{id: a, url: 'http://127.0.0.1:1', models: [m]}]\n"
                    "control_plane: {lost_after: 5m}\n")
    r = llmgw("config", "check", str(path))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}: OK (1 endpoint, 0 models)\n", "")


def test_config_defaults_is_a_file_config_check_accepts_as_the_defaults(tmp_path: Path) -> None:
    r = llmgw("config", "defaults")
    assert r.returncode == 0 and r.stdout == defaults_yaml()
    for section in ("gateway:", "control_plane:", "models: []", "  timeouts:", "    idle: 30s",
                    "  max_body_bytes: 16MiB", "  request_retention: 30d",
                    "    # Longest silence between two body chunks of an answer."):
        assert f"\n{section}\n" in r.stdout, section
    path = tmp_path / "defaults.yaml"
    path.write_text(r.stdout)
    assert llmgw("config", "check", str(path)).returncode == 0
    assert load_server_file(path) == ServerFile()


def test_each_fault_is_said_once_and_in_the_order_of_the_file() -> None:
    said = faults(
        "gateway:\n"
        "  workers: 0\n"
        "  endpoints:\n"
        "    - {id: a, url: 'http://h:1'}\n"
        "    - {id: b, url: 'ftp://h:1', models: [m]}\n"
        "  health: {max_ejection_percent: 101, probe_interval: true}\n"
        "  control_plane: {url: 'http://x:1', lease_wait: -1}\n"
        "control_plane: {cpu_scheduling: fast, admin_header_timeout: 2m}\n"
        "models: [{name: m, source: {repo: o/m},\n"
        "          profiles: [{name: p, engine: sim, memory: lots}]}]\n")
    assert [s.split(":")[0] for s in said] == [
        "$.gateway.workers", "$.gateway.endpoints[0].models", "$.gateway.endpoints[1]",
        "$.gateway.health.max_ejection_percent", "$.gateway.health.probe_interval",
        "$.gateway.control_plane.lease_wait", "$.control_plane.cpu_scheduling",
        "$.control_plane.admin_header_timeout", "$.models[0].profiles[0].memory"]
    assert said[0] == ("$.gateway.workers: 0 is not a whole number from 1 to 256; give one "
                       "(the default is 1)")
    assert said[1] == "$.gateway.endpoints[0].models: missing; add it (a list of text)"
    assert said[2] == ("$.gateway.endpoints[1]: endpoint 'b' has url 'ftp://h:1'; expected "
                       "http://HOST:PORT")
    assert said[4].startswith("$.gateway.health.probe_interval: true is not a duration above 0s;")
    assert said[6] == ("$.control_plane.cpu_scheduling: 'fast' is not one of batch, normal; "
                       "give one (the default is batch)")
    assert said[7].startswith("$.control_plane.admin_header_timeout: '2m' is not a duration "
                              "above 0s and at most 60s; write a number and a unit")


def test_a_struct_s_own_checks_run_once_its_fields_are_sound() -> None:
    # lost_after below unreachable_after is said only when both are durations.
    assert faults("control_plane: {lost_after: 10s}\n") == [
        "$.control_plane: lost_after (10 s) must be longer than unreachable_after (30 s)"]
    assert faults("control_plane: {lost_after: 10s, unreachable_after: x}\n") == [
        faults("control_plane: {unreachable_after: x}\n")[0]]
    dup = "{name: m, source: {repo: o/m}, profiles: [{name: p, engine: sim}]}"
    assert faults(f"models: [{dup}, {dup}]\n") == [
        "$.models: the name 'm' is used by both model 'm' and model 'm'; a name or alias must "
        "belong to one model"]


def test_sections_may_be_empty_and_misspelt_ones_are_refused() -> None:
    empty = {"gateway": None, "control_plane": None, "models": None}
    assert check_server(empty, "f") == ServerFile()
    assert faults("gatway: {port: 1}\n") == ["$.gatway: no such section; did you mean `gateway`?"]
    assert faults("extra: 1\n") == [
        "$.extra: no such section; the sections are gateway, control_plane, models"]
    assert faults("gateway: {timeouts: {sideways: 1}}\n") == [
        "$.gateway.timeouts.sideways: no such key; remove it (`llmgw config defaults` lists "
        "every key)"]
    assert faults("gateway: [1]\n") == [
        "$.gateway: a list is not a mapping; write its keys under it, one `key: value` a line"]


@pytest.mark.parametrize(("written", "seconds"), [
    ("250ms", 0.25), ("30s", 30.0), ("5m", 300.0), ("2h", 7200.0), ("7d", 604800.0),
    ("2w", 1209600.0), ("1h30m", 5400.0), ("1m500ms", 60.5), (30, 30.0), (0.25, 0.25)])
def test_a_duration_is_the_same_in_every_section(written: Any, seconds: float) -> None:
    link = {"url": "http://h:1", "lease_wait": written}
    loaded = check_server({"gateway": {"timeouts": {"idle": written}, "control_plane": link},
                           "control_plane": {"reconcile_every": written, "max_key_ttl": written},
                           "models": [{"name": "m", "source": {"repo": "o/m"},
                                       "profiles": [{"name": "p", "engine": "sim"}],
                                       "scale_up_timeout": written}]}, "f")
    assert loaded.gateway.timeouts.idle == seconds
    assert loaded.gateway.control_plane is not None
    assert loaded.gateway.control_plane.lease_wait == seconds
    assert loaded.control_plane.reconcile_every == seconds
    assert loaded.control_plane.max_key_ttl == seconds
    assert loaded.models[0].scale_up_timeout == seconds


@pytest.mark.parametrize("written", ["30x", "1.5h", "-1s", "", "30 s", "7D", "1y", "0s", "0", 0,
                                     -1, True, [30], "9" * 50 + "s"])
def test_a_bad_duration_is_refused_with_a_sentence(written: Any) -> None:
    for doc in ({"gateway": {"timeouts": {"idle": written}}},
                {"control_plane": {"drain_timeout": written}}):
        [said] = faults_of(doc)
        path = "$.gateway.timeouts.idle" if "gateway" in doc else "$.control_plane.drain_timeout"
        assert said.startswith(f"{path}: ") and " is not a duration" in said, said
        assert "write a number and a unit (250ms, 30s, 5m, 2h, 7d" in said, said


def test_zero_is_a_duration_only_where_it_means_off() -> None:
    assert check_server({"control_plane": {"placement_settle": "0s"}}, "f").control_plane \
        .placement_settle == 0
    assert faults_of({"control_plane": {"reconcile_every": "0s"}})[0].startswith(
        "$.control_plane.reconcile_every: '0s' is not a duration above 0s;")


@pytest.mark.parametrize(("written", "size"), [
    ("16MiB", 16 * 2**20), ("256KiB", 256 * 2**10), ("1GB", 10**9), ("1.5GiB", 3 * 2**29),
    ("512 MiB", 512 * 2**20), ("2kb", 2000), ("1TiB", 2**40), ("100B", 100), (1024, 1024)])
def test_a_size_is_the_same_in_every_section(written: Any, size: int) -> None:
    loaded = check_server({"gateway": {"max_body_bytes": written, "max_response_bytes": written},
                           "models": [{"name": "m", "source": {"repo": "o/m"}, "profiles": [
                               {"name": "p", "engine": "sim", "memory": written}]}]}, "f")
    assert loaded.gateway.max_body_bytes == loaded.gateway.max_response_bytes == size
    assert loaded.models[0].profiles[0].memory == size


@pytest.mark.parametrize("written", ["lots", "16MB/s", "1XB", "-1", -1, 0, True, "", 1.5])
def test_a_bad_size_is_refused_with_a_sentence(written: Any) -> None:
    [said] = faults_of({"gateway": {"max_body_bytes": written}})
    assert said.startswith("$.gateway.max_body_bytes: ") and " is not a size" in said, said
    assert "KiB, MiB, GiB, TiB (powers of 1024)" in said and "(the default is 16MiB)" in said


def test_the_admin_api_reads_durations_as_the_file_does() -> None:
    import re

    assert parse_duration("250ms") == 0.25 and parse_duration("1h30m") == 5400.0
    assert re.match(DURATION_PATTERN, "250ms") and not re.match(DURATION_PATTERN, "250")
    with pytest.raises(ValueError, match=r"'0ms' is zero; give a duration longer than that"):
        parse_duration("0ms")
    assert parse_size("80GiB") == 80 * 2**30


def test_defaults_are_written_as_people_write_them() -> None:
    assert [duration_text(s) for s in (0.25, 2.0, 60.0, 600.0, 5400.0, 86400 * 30, 0, 1e-4)] == [
        "250ms", "2s", "1m", "10m", "90m", "30d", 0, 1e-4]
    assert [size_text(n) for n in (16 * 2**20, 10**9, 2**40, 1000, 1023, 0)] == [
        "16MiB", "1GB", "1TiB", "1KB", 1023, 0]


def faults_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        check_server(doc, "f")
    return e.value.errors


def test_config_check_asks_the_router_as_the_gateway_does(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("gateway:\n  endpoints: [{id: a, url: 'http://h:1', models: [m]}]\n"
                    "  routing: {m: {policy: fastest}}\n")
    checked = llmgw("config", "check", str(path))
    assert checked.returncode == 1 and checked.stderr.startswith("error: gateway.routing.m: ")
    assert llmgw("gateway", "--config", str(path)).stderr == checked.stderr


def test_up_keeps_the_file_s_sections_with_this_machine_s_wiring_over_them() -> None:
    from llmgw.cli.up import model_entry, up_document

    mine = {"name": "mine", "source": {"repo": "o/m"}, "profiles": [{"name": "p", "engine": "sim"}]}
    given = {"gateway": {"timeouts": {"idle": "5s"}, "control_plane": {"lease_wait": "1s"}},
             "control_plane": {"lost_after": "5m", "agent_port": 1},
             "models": [mine]}
    wiring = {"host": "::1", "port": 9000,
              "control_plane": {"url": "http://127.0.0.1:8081", "data_dir": "/d"}}
    doc = up_document(given, 8082, wiring, model_entry("sim", "sim-model", 20, 10))
    loaded = check_server(doc, "up-server.yaml")
    gateway = loaded.gateway
    assert (gateway.host, gateway.port, gateway.timeouts.idle) == ("::1", 9000, 5)
    link = gateway.control_plane
    assert link is not None and (link.urls, link.data_dir, link.lease_wait) == (
        ["http://127.0.0.1:8081"], "/d", 1.0)
    cp = loaded.control_plane
    assert (cp.lost_after, cp.agent_port, cp.agent_insecure) == (300.0, 8082, True)
    assert cp.gateway_url == "http://[::1]:9000"
    assert [m.name for m in loaded.models] == ["mine", "sim-model"]
    again = up_document({"models": [{**mine, "name": "sim-model"}]}, 8082, wiring,
                        model_entry("sim", "sim-model", 20, 10))
    assert again["models"] == [{**mine, "name": "sim-model"}]  # the file's model of that name wins


def test_config_defaults_shows_the_form_of_what_has_no_default() -> None:
    # Endpoints, the gateway's control plane and the models are none by default; their
    # fields follow, commented, and filled in they check.
    import yaml

    lines = defaults_yaml().splitlines()

    def form(after: str, indent: str) -> Any:
        block = []
        for line in lines[lines.index(after) + 1:]:
            if not line.startswith(indent + "# ") or line[len(indent) + 2:][:1].isupper():
                break
            block.append(line[len(indent) + 2:])
        return yaml.safe_load("\n".join(block))

    [endpoint] = form("  endpoints: []", "  ")["endpoints"]
    assert list(endpoint) == ["id", "url", "models", "kv_events", "kv_replay"]
    link = form("  control_plane: null", "  ")["control_plane"]
    assert (link["snapshot_wait"], link["usage_interval"]) == ("20s", "250ms")
    [model] = form("models: []", "")["models"]
    assert model["scale_up_timeout"] == "5m" and model["profiles"][0]["nvlink"] == "prefer"
    endpoint.update(id="a", url="http://h:1", models=["m"])
    link["url"] = "http://h:2"
    model.update(name="m", source={"repo": "o/m"})
    model["profiles"][0].update(name="p", engine="sim")
    loaded = check_server({"gateway": {"endpoints": [endpoint], "control_plane": link},
                           "models": [model]}, "f")
    assert loaded.gateway.control_plane is not None and loaded.models[0].scale_up_timeout == 300
