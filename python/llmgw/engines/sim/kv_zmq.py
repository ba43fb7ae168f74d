"""vLLM's KV-cache event publisher, for the simulator: ZMQ PUB plus a replay ROUTER.

Wire format, as vLLM ships it (`vllm/distributed/kv_events.py`):
- PUB frames `[topic, seq as 8-byte big-endian, msgpack payload]`, seq from 0;
- the payload is an array-like `EventBatch` `[ts, events, data_parallel_rank]`;
- events are maps tagged by `"type"` (vLLM since mid-2026) or positional arrays
  with the tag first (older vLLM), selectable with `encoding`;
- the replay socket answers `[b"", start_seq]` with one reply per buffered batch
  whose seq >= start, then an end marker with seq -1 and an empty payload;
  replies carry a topic frame (newer vLLM) or not (older vLLM, SGLang).

One batch is published per simulated request (vLLM publishes one per engine
step; a simulated request is one step's worth of cache changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Literal

import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


# -- map encoding (current vLLM): {"type": "BlockStored", ...} -------------------------
class MapStored(msgspec.Struct, tag_field="type", tag="BlockStored", omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


class MapRemoved(msgspec.Struct, tag_field="type", tag="BlockRemoved", omit_defaults=True):
    block_hashes: list[int]
    medium: str | None = "GPU"


class MapCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared"):
    pass


# -- array encoding (older vLLM): ["BlockStored", ...] ---------------------------------
class ArrStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


class ArrRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = "GPU"


class ArrCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[object]
    data_parallel_rank: int | None = 0


Encoding = Literal["map", "array"]


def _signed(h: int) -> int:
    # vLLM's block hashes are 64-bit; msgpack ints are signed or unsigned. Keep
    # them unsigned as the simulator computes them.
    return h & 0xFFFF_FFFF_FFFF_FFFF


class ZmqPublisher:
    """A `KvEventSink` that publishes batches like vLLM's ZmqEventPublisher."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, *, topic: str = "kv-events",
                 encoding: Encoding = "map", replay_topic_frame: bool = True,
                 buffer_steps: int = 10_000) -> None:
        self.topic = topic.encode()
        self.encoding = encoding
        self.replay_topic_frame = replay_topic_frame
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.bind(endpoint)
        # What was bound: `tcp://HOST:*` (or port 0) is a port the kernel picked.
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pending: list[object] = []
        self._seq = 0
        self._enc = msgspec.msgpack.Encoder()
        self._task: asyncio.Task[None] | None = None
        self.dropped_from_replay = False

    # -- KvEventSink --------------------------------------------------------------
    def blocks_stored(self, block_hashes: Sequence[int], parent_hash: int | None,
                      token_ids: Sequence[int], block_size: int) -> None:
        """Queues a BlockStored event for the current batch."""
        cls = MapStored if self.encoding == "map" else ArrStored
        self._pending.append(cls([_signed(h) for h in block_hashes],
                                 None if parent_hash is None else _signed(parent_hash),
                                 list(token_ids), block_size))

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        """Queues a BlockRemoved event."""
        cls = MapRemoved if self.encoding == "map" else ArrRemoved
        self._pending.append(cls([_signed(h) for h in block_hashes]))

    def all_cleared(self) -> None:
        """Queues an AllBlocksCleared event."""
        self._pending.append(MapCleared() if self.encoding == "map" else ArrCleared())

    # -- publishing ---------------------------------------------------------------
    def flush(self) -> None:
        """Publishes the queued events as one batch (no-op when there are none)."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        payload = self._enc.encode(EventBatch(time.time(), events, 0))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        # past the high-water mark vLLM drops too; subscribers see a gap
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)

    def forget(self, below: int) -> None:
        """Drops buffered batches with seq < below (tests: make replay impossible)."""
        while self._buffer and self._buffer[0][0] < below:
            self._buffer.popleft()

    def skip(self, n: int = 1) -> None:
        """Consumes n sequence numbers without sending (tests: a lost batch)."""
        for _ in range(n):
            self._buffer.append((self._seq, self._enc.encode(EventBatch(time.time(), [], 0))))
            self._seq += 1

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts answering replay requests."""
        if self._replay is not None and self._task is None:
            self._task = loop.create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            # DEALER clients send [identity, b"", start]; REQ-style the same.
            ident, start = frames[0], frames[-1]
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart(self._reply(ident, seq.to_bytes(8, "big"), payload))
            await self._replay.send_multipart(self._reply(ident, END_SEQ, b""))

    def _reply(self, ident: bytes, seq: bytes, payload: bytes) -> list[bytes]:
        if self.replay_topic_frame:
            return [ident, b"", self.topic, seq, payload]
        return [ident, b"", seq, payload]

    def close(self) -> None:
        """Closes the sockets."""
        if self._task is not None:
            self._task.cancel()
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
