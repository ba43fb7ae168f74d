"""Deterministic "tokenizer", text generator and embeddings.

The simulator has no model: a token is a whitespace-separated word of the
prompt, and output words are drawn from a fixed list by a PRNG seeded from a
stable hash (blake2b, never Python's salted `hash()`) of seed + prompt, so the
same request gives the same text in every run and every process.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from collections.abc import Sequence
from functools import lru_cache

import msgspec

WORDS: tuple[str, ...] = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
    "yankee", "zulu", "amber", "basalt", "cobalt", "dune", "ember", "fjord",
    "granite", "harbor", "island", "jade", "kelp", "lagoon", "meadow", "nebula",
    "orbit", "prairie", "quartz", "river", "summit", "tundra", "umber", "valley",
    "willow", "xenon", "yarrow", "zephyr", "the", "a", "of", "and",
    "to", "in", "is", "simulated", "engine", "token", "reply", "gateway",
)  # fmt: skip

# Each output token is " word": the leading space makes joined tokens read as text.
TOKENS: tuple[str, ...] = tuple(" " + w for w in WORDS)
# JSON string literals of each token, prebuilt so streaming splices bytes instead of encoding.
TOKENS_JSON: tuple[bytes, ...] = tuple(msgspec.json.encode(t) for t in TOKENS)
_INDICES = range(len(WORDS))


def tokenize(text: str) -> list[str]:
    """Split text into simulated tokens (whitespace words)."""
    return text.split()


def _stable_seed(seed: int, text: str) -> int:
    h = hashlib.blake2b(digest_size=16)
    h.update(str(seed).encode())
    h.update(b"\x00")
    h.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "little")


@lru_cache(maxsize=4096)
def generate(seed: int, prompt: str, n: int) -> tuple[int, ...]:
    """Return `n` output token indices (into `TOKENS`) for this seed and prompt.

    Cached because benchmarks repeat prompts and the PRNG setup is the costly part.
    """
    rng = random.Random(_stable_seed(seed, prompt))
    return tuple(rng.choices(_INDICES, k=n))


def detokenize(indices: Sequence[int]) -> str:
    """Join output token indices into the completion text."""
    return "".join([TOKENS[i] for i in indices])


def embed(seed: int, text: str, dim: int) -> list[float]:
    """Return a deterministic unit-length vector for `text` (vLLM normalises embeddings)."""
    rng = random.Random(_stable_seed(seed, text))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def embedding_data(seed: int, texts: Sequence[str], dim: int, fmt: str) -> list[dict[str, object]]:
    """The `data` list of an embeddings response, as floats or base64 float32."""
    data: list[dict[str, object]] = []
    for i, text in enumerate(texts):
        vec = embed(seed, text, dim)
        emb: object = vec
        if fmt == "base64":  # the openai client asks for base64 (little-endian float32) by default
            emb = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": emb})
    return data
