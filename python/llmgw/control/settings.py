"""What the control plane is told at start: where it keeps its files and store, where it listens,
and the settings handlers read (`ControlPlane.settings`).

The settings come from the `control_plane:` section of `server.yaml`; the rest
from `llmgw server`'s flags. All of it crosses to granian's worker as one JSON
object in an environment variable (never a secret: the worker reads those from
the data dir itself).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from llmgw.config import ConfigError, read_server_yaml
from llmgw.durations import parse_duration

CONFIG_ENV = "LLMGW_CONTROL_CONFIG"



class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The control plane's settings, as handlers read them."""

    max_key_ttl: float | None = None
    """The longest lifetime of an API key anywhere in this cluster, in seconds; None: no maximum."""
    gateway_url: str | None = None
    """Where a gateway answers (replays go there); None: replay is not available."""
    request_retention: float = 30 * 86400
    """How long request records are kept, in seconds (the hourly rollups are kept for good)."""
    gateway_silent_for: float = 10.0
    """A gateway worker not heard from for this long is gone: its open requests are settled
    as `interrupted`. Gateways send a batch (empty when idle) every fraction of a second."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Everything one control plane process is started with."""

    data_dir: str
    store: str
    host: str = "127.0.0.1"
    port: int = 8081
    settings: Settings = msgspec.field(default_factory=Settings)


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/llmgw`, or `~/.local/share/llmgw`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmgw"


def seconds(value: Any, where: str) -> float:
    """A duration from YAML: a number of seconds or text like `90m`, `24h`, `7d`."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a duration like 90d or a number of seconds, not {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"{where} must be positive, not {value!r}")
        return float(value)
    try:
        return parse_duration(str(value))
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e


def load_settings(path: str | None) -> Settings:
    """The `control_plane:` section of the server.yaml at `path` (defaults without one)."""
    if path is None:
        return Settings()
    raw = read_server_yaml(path).get("control_plane") or {}
    where = f"configuration file {path}: control_plane"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    raw = dict(raw)
    for name in ("max_key_ttl", "request_retention", "gateway_silent_for"):
        if raw.get(name) is not None:
            raw[name] = seconds(raw[name], f"{where}.{name}")
    try:
        return msgspec.convert(raw, Settings, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{where} is invalid: {e}") from e


def encode_config(cfg: ServerConfig) -> str:
    """The config as JSON text, for the worker's environment."""
    return msgspec.json.encode(cfg).decode()


def decode_config(text: str) -> ServerConfig:
    """Inverse of encode_config."""
    return msgspec.json.decode(text, type=ServerConfig)
