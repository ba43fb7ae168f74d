"""Decoded inference requests (`Job`) and request-shape helpers for the app."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Protocol

from granian.rsgi import Scope

from llmgw.engines.sim.faults import Fault
from llmgw.engines.sim.schema import Message


class HttpError(Exception):
    """A request error answered with vLLM's OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class Job:
    """One chat or text completion request, decoded and validated."""

    __slots__ = ("chat", "finish", "include_usage", "model", "n_out", "rid",
                 "scope", "seed", "start", "stream", "texts", "tokens")  # fmt: skip

    def __init__(self, chat: bool, scope: Scope, rid: str, model: str, texts: list[str]) -> None:
        self.chat = chat
        self.scope = scope
        self.rid = rid
        self.model = model
        self.texts = texts
        # What the prefix cache sees: whitespace words, or real token ids when the
        # simulator was given a model's tokenizer (set by the app after decoding).
        self.tokens: list[tuple[str | int, ...]] = [tuple(t.split()) for t in texts]
        self.start = time.perf_counter()
        self.n_out = 0
        self.finish = "stop"
        self.stream = False
        self.include_usage = False
        self.seed = 0


def render_chat(messages: list[Message]) -> str:
    """Render messages as "role: content" lines (the simulated chat template)."""
    lines = []
    for msg in messages:
        content = msg.content
        if isinstance(content, list):
            content = " ".join(p.text for p in content if p.type == "text" and p.text)
        lines.append(f"{msg.role}: {content or ''}")
    return "\n".join(lines)


class Send(Protocol):
    """The shape of `transport.send_bytes`."""

    def __call__(self, data: bytes, /) -> Awaitable[None]: ...


def fault_point(fault: Fault | None) -> tuple[int | None, str]:
    """The streaming fault that fires first: (token events before it, action)."""
    if fault is None:
        return None, ""
    points = [(n, a) for n, a in ((fault.reset_after, "reset"), (fault.hang_after, "hang"),
                                  (fault.error_after, "error")) if n is not None]  # fmt: skip
    if fault.hang:
        points.append((0, "hang"))
    if not points:
        return None, ""
    n, a = min(points, key=lambda p: p[0])
    return n, a


def prompt_texts(value: str | list[object], param: str) -> list[str]:
    """Prompts from a string, strings, token ids, or lists of token ids."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise HttpError(400, f"{param} must not be empty", param)
    if all(isinstance(v, int) for v in value):
        return [" ".join(str(v) for v in value)]
    texts = []
    for v in value:
        if isinstance(v, str):
            texts.append(v)
        elif isinstance(v, list) and all(isinstance(t, int) for t in v):
            texts.append(" ".join(str(t) for t in v))
        else:
            raise HttpError(400, f"{param} must be a string, strings or token ids", param)
    return texts
