"""`llmgw engine sim`: command-line options and the granian launcher."""

from __future__ import annotations

import argparse
import os
import sys

import msgspec

from llmgw.config import url_host
from llmgw.engines.sim.config import ENV_VAR, SimConfig, to_env
from llmgw.net.serving import bind_port, serve_app

READY_PREFIX = "llmgw-sim listening on"
_D = SimConfig()  # defaults live in SimConfig only


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to `parser`."""
    add = parser.add_argument
    add("--host", default=_D.host, help=f"address to bind (default {_D.host})")
    add("--port", type=int, default=_D.port, help=f"TCP port to bind (default {_D.port}; 0: a free one)")
    add("--model", dest="models", action="append", metavar="NAME",
        help=f"served model name; repeat for several (default {_D.models[0]!r})")  # fmt: skip
    add("--seed", type=int, default=_D.seed, help="seed of the generated text (default 0)")
    add("--ttft-ms", type=float, default=_D.ttft_ms,
        help="base time to first token in ms (default 0)")  # fmt: skip
    add("--itl-ms", type=float, default=_D.itl_ms, help="inter-token latency in ms (default 0)")
    add("--prefill-us-per-token", type=float, default=_D.prefill_us_per_token,
        help="added to TTFT per prompt token not found in the prefix cache, in µs (default 0)")  # fmt: skip
    add("--output-tokens", type=int, default=_D.output_tokens,
        help=f"tokens generated when max_tokens is larger or absent (default {_D.output_tokens})")  # fmt: skip
    add("--block-size", type=int, default=_D.block_size,
        help=f"prefix-cache block size in tokens (default {_D.block_size})")  # fmt: skip
    add("--cache-blocks", type=int, default=_D.cache_blocks,
        help=f"prefix-cache capacity in blocks, LRU (default {_D.cache_blocks})")  # fmt: skip
    add("--max-num-seqs", type=int, default=_D.max_num_seqs,
        help=f"requests running at once; more wait (default {_D.max_num_seqs})")  # fmt: skip
    add("--embedding-dim", type=int, default=_D.embedding_dim,
        help=f"length of embedding vectors (default {_D.embedding_dim})")  # fmt: skip
    add("--tokenizer", metavar="DIR", default=None,
        help="model directory with tokenizer.json: the cache and KV events use its token ids")  # fmt: skip
    add("--kv-events-endpoint", metavar="ZMQ", default=None,
        help="publish vLLM KV-cache events here, e.g. tcp://127.0.0.1:5557 "
             "(port *: a free one, named at the start)")  # fmt: skip
    add("--kv-replay-endpoint", metavar="ZMQ", default=None,
        help="answer replay requests here, e.g. tcp://127.0.0.1:5558 (port *: as above)")  # fmt: skip
    add("--kv-events-encoding", choices=("map", "array"), default=_D.kv_events_encoding,
        help="event encoding: map (current vLLM) or array (older vLLM)")  # fmt: skip
    add("--kv-replay-no-topic", action="store_true",
        help="replay replies without a topic frame (older vLLM, SGLang)")  # fmt: skip
    add("--api-key", default=os.environ.get("VLLM_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on /v1/ (as vLLM; default $VLLM_API_KEY)")  # fmt: skip
    add("--request-log", metavar="FILE", default=None,
        help="append 'REQUEST_ID UNIX_TIME' per inference request received (for tests)")  # fmt: skip
    add("--workers", type=int, default=_D.workers,
        help="granian worker processes; each has its own cache and metrics (default 1)")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build and validate a SimConfig from parsed options."""
    config = SimConfig(
        host=args.host,
        port=args.port,
        models=tuple(args.models) if args.models else _D.models,
        seed=args.seed,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        prefill_us_per_token=args.prefill_us_per_token,
        output_tokens=args.output_tokens,
        block_size=args.block_size,
        cache_blocks=args.cache_blocks,
        max_num_seqs=args.max_num_seqs,
        embedding_dim=args.embedding_dim,
        workers=args.workers,
        tokenizer=args.tokenizer,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_replay_endpoint=args.kv_replay_endpoint,
        kv_events_encoding=args.kv_events_encoding,
        kv_replay_topic_frame=not args.kv_replay_no_topic,
        request_log=args.request_log,
        api_key=args.api_key,
    )
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """Serve the simulator with granian until interrupted; returns an exit status."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"llmgw engine sim: {exc}", file=sys.stderr)
        return 2
    config = msgspec.structs.replace(config, port=bind_port(config.host, config.port))
    # Workers are separate processes: the config travels in the environment.
    os.environ[ENV_VAR] = to_env(config)
    # granian binds on Linux inside each worker (SO_REUSEPORT), so the port refuses
    # connections until a worker is up: the line comes once a connect succeeds.
    serve_app("llmgw.engines.sim.app:create_app", config.host, config.port,
              f"{READY_PREFIX} http://{url_host(config.host)}:{config.port} (SIMULATED engine, no GPU)",
              workers=config.workers)
    return 0
