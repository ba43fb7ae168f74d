"""The simulator's KV-event publisher speaks vLLM's wire format (PUB + replay ROUTER)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import msgspec
import openai
import pytest
import zmq

from tests.support.procs import Proc, start_process
from tests.support.sim import KV_ANY, kv_endpoints

END = (-1).to_bytes(8, "big", signed=True)
LONG = " ".join(f"w{i}" for i in range(40))  # 2 full blocks of 16 plus the chat roles


def start(encoding: str, topic_frame: bool) -> tuple[Proc, str, str]:
    args = [sys.executable, "-m", "llmgw.engines.sim", "--port", "0", "--kv-events-endpoint",
            KV_ANY, "--kv-replay-endpoint", KV_ANY, "--kv-events-encoding", encoding]
    if not topic_frame:
        args.append("--kv-replay-no-topic")
    proc = start_process(args, "llmgw-sim listening on")
    return (proc, *kv_endpoints(proc))


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


def chat(proc: Proc, text: str) -> None:
    c = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0)
    c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": text}], max_tokens=1)


def replay(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, start_seq: int) -> list[list[bytes]]:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out = []
    while True:
        assert sock.poll(5000), "no replay answer"
        frames = sock.recv_multipart()
        out.append(frames)
        if frames[-2] == END:
            break
    sock.close(linger=0)
    return out


@pytest.mark.parametrize(("encoding", "topic_frame"), [("map", True), ("array", False)])
def test_published_batches_and_replay(ctx: zmq.Context[zmq.Socket[bytes]], encoding: str, topic_frame: bool) -> None:
    proc, pub, rep = start(encoding, topic_frame)
    with proc:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub)
        # A SUB socket misses what is published before it has joined: send
        # distinct prompts until one arrives (bounded), then check exact frames.
        deadline = time.monotonic() + 10
        n = 0
        while not sub.poll(100):
            assert time.monotonic() < deadline, "no KV event reached the subscriber"
            chat(proc, f"warm{n} " + LONG)
            n += 1
        frames = sub.recv_multipart()
        sub.close(linger=0)
        assert len(frames) == 3 and frames[0] == b"kv-events" and len(frames[1]) == 8
        ts, events, rank = msgspec.msgpack.decode(frames[2])
        assert isinstance(ts, float) and rank == 0
        stored = events[0]
        if encoding == "map":
            assert stored["type"] == "BlockStored" and stored["parent_block_hash"] is None
            hashes, tokens, size = stored["block_hashes"], stored["token_ids"], stored["block_size"]
        else:
            assert stored[0] == "BlockStored" and stored[2] is None
            hashes, tokens, size = stored[1], stored[3], stored[4]
        assert size == 16 and len(tokens) == 16 * len(hashes) and len(hashes) == 2
        replies = replay(ctx, rep, 0)
        body = replies[:-1]
        assert len(body) == n  # every batch since seq 0, in order, then the end marker
        for i, r in enumerate(body):
            assert r[0] == b"" and r[-2] == i.to_bytes(8, "big")
            assert (r[1] == b"kv-events") if topic_frame else (len(r) == 3)
        assert replies[-1][-1] == b""
