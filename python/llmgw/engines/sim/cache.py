"""Simulated prefix (KV) cache: chained block hashes in an LRU of fixed capacity.

Like vLLM's automatic prefix caching: the prompt is cut into full blocks of
`block_size` tokens, each block's key hashes its parent's key plus its own
tokens, a lookup counts the leading blocks already present (hit tokens), and
all full blocks are then stored, evicting the least recently used.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache

from llmgw.engines.sim.kv import KvEventSink, NullSink

ROOT_HASH = 0
# Tokens come from str.split(), which treats \x1f as whitespace, so it cannot occur
# inside a token and makes the join unambiguous.
_SEP = "\x1f"


Token = str | int
"""A simulated token: a whitespace word, or a real token id when a tokenizer is loaded."""


def block_hash(parent: int, tokens: Sequence[Token]) -> int:
    """Stable 64-bit key of a block given its parent's key (same in every process)."""
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(_SEP.join(map(str, tokens)).encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "little")


@lru_cache(maxsize=65536)
def token_id(token: str) -> int:
    """Stable 31-bit id of a simulated token, for KV events that carry token ids."""
    digest = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@lru_cache(maxsize=4096)
def prompt_blocks(tokens: tuple[Token, ...], block_size: int) -> tuple[int, tuple[int, ...]]:
    """(token count, chained keys of the full blocks) of a prompt's tokens.

    Cached because benchmarks and chat sessions resend the same prompts, and
    hashing is most of the per-request cost of the cache.
    """
    keys = []
    parent = ROOT_HASH
    for i in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        keys.append(parent)
    return len(tokens), tuple(keys)


class PrefixCache:
    """LRU prefix cache counting queries and hits in tokens, as vLLM's metrics do."""

    def __init__(self, block_size: int, capacity: int, sink: KvEventSink | None = None) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.sink: KvEventSink = sink if sink is not None else NullSink()
        # Skip computing token ids for events when nobody listens (the common case).
        self._emit = not isinstance(self.sink, NullSink)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Fraction of capacity in use, 0..1."""
        return len(self._blocks) / self.capacity if self.capacity else 0.0

    def attach(self, sink: KvEventSink) -> None:
        """Sends the cache's events to `sink` from now on."""
        self.sink = sink
        self._emit = not isinstance(sink, NullSink)

    def query(self, tokens: tuple[Token, ...]) -> tuple[int, int]:
        """Count the cached leading blocks of a prompt, then store all its full blocks.

        Returns (prompt tokens, prompt tokens served from the cache).
        """
        n_tokens, keys = prompt_blocks(tokens, self.block_size)
        self.queries += n_tokens
        if not keys or self.capacity == 0:
            return n_tokens, 0
        blocks = self._blocks
        hit_blocks = 0
        matching = True
        new: list[int] = []  # indices of newly stored blocks
        for i, key in enumerate(keys):
            if key in blocks:
                blocks.move_to_end(key)
                if matching:
                    hit_blocks += 1
            else:
                matching = False
                blocks[key] = None
                new.append(i)
        evicted: list[int] = []
        while len(blocks) > self.capacity:
            evicted.append(blocks.popitem(last=False)[0])
        if self._emit:
            self._report(tokens, keys, new, evicted)
            self.sink.flush()
        hit_tokens = hit_blocks * self.block_size
        self.hits += hit_tokens
        return n_tokens, hit_tokens

    def _report(
        self, tokens: tuple[Token, ...], keys: tuple[int, ...], new: list[int], evicted: list[int]
    ) -> None:
        """Send one `blocks_stored` per contiguous run of new blocks, then the evictions."""
        bs = self.block_size
        start = 0
        while start < len(new):
            end = start
            while end + 1 < len(new) and new[end + 1] == new[end] + 1:
                end += 1
            first, last = new[start], new[end]
            parent = keys[first - 1] if first else None
            ids = [t if isinstance(t, int) else token_id(t) for t in tokens[first * bs : (last + 1) * bs]]
            self.sink.blocks_stored(list(keys[first : last + 1]), parent, ids, bs)
            start = end + 1
        if evicted:
            self.sink.blocks_removed(evicted)

    def clear(self) -> None:
        """Drop every block and tell the sink."""
        self._blocks.clear()
        self.sink.all_cleared()
        self.sink.flush()
