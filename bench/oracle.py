"""The oracle of the `routing` scenario: a router that knows every replica's prefix cache.

It keeps one mirror of each replica's cache (`llmgw.engines.sim.cache.PrefixCache`,
same block size and capacity) and feeds it the same token ids the simulator
feeds its own: the request body tokenized with the model's tokenizer and chat
template (`ModelTokenizer.tokens(body, True)`, as `llmgw.engines.sim.app` does). Each
request goes to the replica whose mirror holds the longest cached prefix; ties
go to the fewest outstanding requests, then the fewest blocks held, then the
lowest index.

The mirror is exact as long as each replica sees requests in the order the
oracle sent them, which holds while no replica queues (max-num-seqs not
reached); `agreement` in the result compares the mirrors' hits with the
replicas' own counters to show how close it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.engines.sim.cache import PrefixCache, Token, prompt_blocks

Tokenize = Callable[[bytes], tuple[Token, ...]]


class MirrorCache(PrefixCache):
    """A PrefixCache that can also be asked, without changing it, how much of a prompt it holds."""

    def peek(self, tokens: tuple[Token, ...]) -> int:
        """Prompt tokens served from this cache if `tokens` were queried now (no LRU touch)."""
        _, keys = prompt_blocks(tokens, self.block_size)
        if self.capacity == 0:
            return 0
        n = 0
        for key in keys:
            if key not in self._blocks:
                break
            n += 1
        return n * self.block_size


def pick(matched: Sequence[int], outstanding: Sequence[int], held: Sequence[int]) -> int:
    """The replica with the longest match; ties: fewest outstanding, fewest blocks held, lowest index.

    Blocks held break the ties of new prefixes when nothing is outstanding (a slow
    client): without it every new prefix would go to replica 0.
    """
    return min(range(len(matched)), key=lambda i: (-matched[i], outstanding[i], held[i], i))


class Oracle:
    """Routes each body to the replica with the longest cached prefix, and mirrors the result."""

    def __init__(self, replicas: int, block_size: int, capacity: int, tokenize: Tokenize) -> None:
        self.caches = [MirrorCache(block_size, capacity) for _ in range(replicas)]
        self.outstanding = [0] * replicas
        self.sent = [0] * replicas
        self.tokenize = tokenize

    def route(self, body: bytes) -> int:
        """Chooses the replica for `body`, counts it outstanding, and stores its blocks in the mirror."""
        tokens = self.tokenize(body)
        matched = [c.peek(tokens) for c in self.caches]
        i = pick(matched, self.outstanding, [len(c) for c in self.caches])
        # The replica stores every full block of the prompt when it prefills it; so does its mirror.
        self.caches[i].query(tokens)
        self.outstanding[i] += 1
        self.sent[i] += 1
        return i

    def release(self, replica: int) -> None:
        """The request sent to `replica` finished (or failed)."""
        self.outstanding[replica] -= 1

    @property
    def hits(self) -> int:
        """Prompt tokens the mirrors served from cache, over all replicas."""
        return sum(c.hits for c in self.caches)

    @property
    def queries(self) -> int:
        """Prompt tokens queried, over all replicas."""
        return sum(c.queries for c in self.caches)


def sim_tokenizer(model_dir: str) -> Tokenize:
    """Tokenizes a chat body exactly as the simulator does with `--tokenizer model_dir`."""
    from llmgw._core import ModelTokenizer

    tok = ModelTokenizer.from_dir(model_dir)

    def tokenize(body: bytes) -> tuple[Token, ...]:
        ids = tok.tokens(body, True)
        if ids is None:  # the simulator would fall back to per-message encoding: not used here
            raise ValueError("the tokenizer cannot render this chat body")
        return tuple(ids)

    return tokenize
