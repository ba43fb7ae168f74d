"""Reading the fields of a request body that routing needs, once, and changing the body only where it must.

The body is decoded by msgspec into a Struct of the few fields the gateway
reads; every other field is skipped without building Python objects. The body
itself is forwarded as received unless the gateway must change it: the model
name (an alias) or `stream_options.include_usage`. Those splices happen in Rust
(`_core.patch_request`) on the raw bytes, without a second parse in Python.
"""

from __future__ import annotations

import msgspec


class StreamOptions(msgspec.Struct):
    """`stream_options` of a streamed request."""

    include_usage: bool | None = None


class RequestHead(msgspec.Struct):
    """The fields of an OpenAI request the gateway reads."""

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    no_store: bool | None = None
    """llmgw's own: do not keep this request's bodies, even where the project keeps bodies."""


DECODER = msgspec.json.Decoder(RequestHead)


def param_of(error: msgspec.ValidationError) -> str | None:
    """The field a validation error points at (`$.model` -> `model`)."""
    text = str(error)
    if "missing required field `" in text:
        return text.split("`")[1]
    at = text.rfind("`$.")
    if at < 0:
        return None
    return text[at + 3 :].rstrip("`").split(".")[0].split("[")[0] or None
