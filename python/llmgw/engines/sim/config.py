"""Simulator configuration: one msgspec Struct holding every default.

The CLI process builds a `SimConfig`, serialises it to JSON in the
`LLMGW_SIM_CONFIG` environment variable, and each granian worker decodes it
again (workers are separate processes, so the environment is the channel).
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

ENV_VAR = "LLMGW_SIM_CONFIG"


class SimConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every simulator setting; the defaults here are the only defaults."""

    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[str, ...] = ("sim-model",)
    seed: int = 0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    prefill_us_per_token: float = 0.0
    output_tokens: int = 16
    block_size: int = 16
    cache_blocks: int = 4096
    max_num_seqs: int = 256
    embedding_dim: int = 64
    workers: int = 1
    tokenizer: str | None = None
    """A model directory (tokenizer.json, tokenizer_config.json): the prefix cache and
    the KV events then use its token ids and chat template, as a real engine would."""
    kv_events_endpoint: str | None = None
    """Publish vLLM KV-cache events on this ZMQ endpoint (e.g. tcp://127.0.0.1:5557)."""
    kv_replay_endpoint: str | None = None
    kv_events_encoding: Literal["map", "array"] = "map"
    """`map` (vLLM since mid-2026) or `array` (older vLLM)."""
    kv_replay_topic_frame: bool = True
    api_key: str | None = None
    """Requests to /v1/ must carry `Authorization: Bearer API_KEY` (vLLM's --api-key and
    VLLM_API_KEY); others get vLLM's 401. None: no check."""
    request_log: str | None = None
    """Append `REQUEST_ID UNIX_TIME` for every inference request received (tests use it to know
    exactly which requests reached an engine)."""

    @property
    def zero_latency(self) -> bool:
        """True when no simulated delay exists, so the hot path never sleeps."""
        return self.ttft_ms == 0 and self.itl_ms == 0 and self.prefill_us_per_token == 0

    def validate(self) -> None:
        """Raise ValueError on settings that cannot work."""
        if not self.models:
            raise ValueError("at least one --model is needed")
        for name, value in (
            ("output-tokens", self.output_tokens),
            ("block-size", self.block_size),
            ("max-num-seqs", self.max_num_seqs),
            ("embedding-dim", self.embedding_dim),
            ("workers", self.workers),
        ):
            if value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        if not 0 <= self.port < 65536:
            # 0: `bind_port` picks one before the workers start (each binds the port itself).
            raise ValueError(f"--port must be 0..65535, got {self.port}")
        if self.kv_events_encoding not in ("map", "array"):
            raise ValueError(f"--kv-events-encoding must be map or array, got {self.kv_events_encoding!r}")
        if self.kv_events_endpoint and self.workers != 1:
            raise ValueError("KV events need --workers 1: each worker has its own cache and publisher")
        if self.cache_blocks < 0:
            raise ValueError(f"--cache-blocks must be >= 0, got {self.cache_blocks}")
        for name, fvalue in (
            ("ttft-ms", self.ttft_ms),
            ("itl-ms", self.itl_ms),
            ("prefill-us-per-token", self.prefill_us_per_token),
        ):
            if fvalue < 0:
                raise ValueError(f"--{name} must be >= 0, got {fvalue}")


def to_env(config: SimConfig) -> str:
    """Serialise a config for the `LLMGW_SIM_CONFIG` variable."""
    return msgspec.json.encode(config).decode()


def from_env() -> SimConfig:
    """Decode the config from `LLMGW_SIM_CONFIG`, or return defaults if unset."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return SimConfig()
    return msgspec.json.decode(raw, type=SimConfig)
