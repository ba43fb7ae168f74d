"""Configuration: loading, validation errors with paths, flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.config import ConfigError, ControlPlaneLink, Endpoint, parse_endpoint
from llmgw.config.file import load_server_file


def test_endpoint_flag() -> None:
    e = parse_endpoint("r1=http://127.0.0.1:9000=a,b")
    assert (e.id, e.host, e.port, e.models) == ("r1", "127.0.0.1", 9000, ["a", "b"])


def test_urls_are_checked_alike() -> None:
    # Endpoint and ControlPlaneLink share one check (config.check_http_url); each names its field.
    with pytest.raises(ValueError) as e:
        Endpoint(id="a", url="ftp://x", models=["m"])
    assert str(e.value) == "endpoint 'a' has url 'ftp://x'; expected http://HOST:PORT"
    with pytest.raises(ValueError) as e:
        ControlPlaneLink(url="http://")
    assert str(e.value) == "control_plane.url is 'http://'; expected http://HOST:PORT"


@pytest.mark.parametrize("spec", ["r1", "r1=http://x:1", "=http://x:1=m", "r1=ftp://x=m"])
def test_bad_endpoint_flag_says_the_form(spec: str) -> None:
    with pytest.raises(ConfigError, match="--endpoint"):
        parse_endpoint(spec)


def test_server_yaml(tmp_path: Path) -> None:
    p = tmp_path / "server.yaml"
    p.write_text(
        "gateway:\n  port: 9999\n  endpoints:\n    - {id: a, url: 'http://127.0.0.1:1', models: [m]}\n"
        "  aliases: {gpt: m}\n  timeouts: {idle: 3}\n"
    )
    cfg = load_server_file(p).gateway
    assert cfg.port == 9999 and cfg.aliases == {"gpt": "m"} and cfg.timeouts.idle == 3
    assert cfg.timeouts.first_byte == 60.0


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("gateway:\n  prot: 1\n", "$.gateway"),
        ("gateway:\n  timeouts: {idle: -1}\n", "$.gateway.timeouts.idle"),
        (
            "gateway:\n  endpoints: [{id: a, url: 'http://h:1', models: []}]\n",
            "$.gateway.endpoints[0]",
        ),
        ("gateway:\n  aliases: {x: nowhere}\n", "alias 'x' points to 'nowhere'"),
    ],
)
def test_invalid_config_names_the_field(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "server.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_server_file(p)
    assert where in str(e.value) and str(p) in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_server_file(tmp_path / "nope.yaml")


def test_with_a_control_plane_aliases_and_routing_may_name_catalog_models(tmp_path: Path) -> None:
    # The catalog reaches the gateway only in its snapshot, after start: names it does not
    # know yet are the control plane's to serve.
    p = tmp_path / "server.yaml"
    p.write_text("gateway:\n  control_plane: {url: 'http://127.0.0.1:1'}\n  aliases: {gpt: placed}\n"
                 "  routing: {placed: {policy: prefix}}\n")
    cfg = load_server_file(p).gateway
    assert cfg.endpoints == [] and cfg.aliases == {"gpt": "placed"}


def test_several_control_planes_as_a_list_or_with_commas(tmp_path: Path) -> None:
    p = tmp_path / "server.yaml"
    p.write_text("gateway:\n  control_plane:\n    url: ['http://10.0.0.1:8081', 'http://10.0.0.2:8081']\n")
    cp = load_server_file(p).gateway.control_plane
    assert cp is not None and cp.urls == ["http://10.0.0.1:8081", "http://10.0.0.2:8081"]
    p.write_text("gateway:\n  control_plane: {url: 'http://10.0.0.1:8081, http://10.0.0.2:8081'}\n")
    cp = load_server_file(p).gateway.control_plane
    assert cp is not None and cp.urls == ["http://10.0.0.1:8081", "http://10.0.0.2:8081"]
    p.write_text("gateway:\n  control_plane: {url: ['http://10.0.0.1:8081', 'ftp://x']}\n")
    with pytest.raises(ConfigError) as e:
        load_server_file(p)
    assert str(e.value) == (f"configuration file {p} is invalid: $.gateway.control_plane: "
                            "control_plane.url is 'ftp://x'; expected http://HOST:PORT")


def test_the_gateway_raises_its_descriptor_limit_or_says_how(tmp_path: Path) -> None:
    # In a child whose hard limit is 2,048, as a container's or a service's may be.
    script = tmp_path / "limit.py"
    script.write_text(
        "import resource\n"
        "from llmgw.cli.gateway import raise_descriptor_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (512, 2048))\n"
        "print(repr(raise_descriptor_limit(1500)), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "print(repr(raise_descriptor_limit(11024)), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    enough, short = out.splitlines()
    assert enough == "None 1500"  # raised to what it needs, within the hard limit
    assert short.endswith(" 2048")  # raised as far as it may
    assert "may open 2048 descriptors" in short and "max_connections" in short and "ulimit -n" in short
