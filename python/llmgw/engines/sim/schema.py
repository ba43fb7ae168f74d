"""OpenAI request shapes (msgspec Structs) and response bodies as vLLM writes them.

Streaming chunks are spliced from prebuilt byte templates: per token the only
varying part is the token's JSON string, so no encoder runs per token.
"""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.engines.sim.text import TOKENS_JSON

encode = msgspec.json.Encoder().encode
DONE = b"data: [DONE]\n\n"


class ContentPart(msgspec.Struct):
    """One part of a message's list content; only `text` parts carry prompt text."""

    type: str = "text"
    text: str | None = None


class Message(msgspec.Struct):
    """A chat message; content may be a string or a list of parts."""

    role: str
    content: str | list[ContentPart] | None = None


UNAUTHORIZED = b'{"error":"Unauthorized"}'  # vLLM's body for a missing or wrong --api-key


class StreamOptions(msgspec.Struct):
    """`stream_options`; `include_usage` adds a final usage chunk."""

    include_usage: bool | None = False


class ChatRequest(msgspec.Struct):
    """POST /v1/chat/completions body (fields the simulator uses; others are ignored)."""

    messages: list[Message]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int | None = 1


class CompletionRequest(msgspec.Struct):
    """POST /v1/completions body; prompt is a string, strings, token ids or lists of ids."""

    prompt: str | list[Any]
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int | None = 1


class EmbeddingRequest(msgspec.Struct):
    """POST /v1/embeddings body."""

    input: str | list[Any]
    model: str | None = None
    encoding_format: str | None = "float"


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> bytes:
    """vLLM's OpenAI error shape."""
    return encode({"error": {"message": message, "type": err_type, "param": param, "code": code}})


def error_type(status: int) -> str:
    """The error `type` vLLM would use for an HTTP status."""
    return _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}

STREAM_ERROR = (
    b'data: {"error": {"message": "simulated engine error", '
    b'"type": "InternalServerError", "code": 500}}\n\n'
)


def usage(prompt: int, completion: int) -> dict[str, int]:
    """OpenAI `usage` object."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


class ChunkTemplates:
    """Byte templates for one streamed response (chat or text completion)."""

    __slots__ = ("chat", "head", "tail")

    def __init__(self, chat: bool, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.chat = chat
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self.head = (
            b'data: {"id":' + encode(rid) + b',"object":"' + obj + b'","created":'
            + str(created).encode() + b',"model":' + encode(model) + b',"choices":['
        )  # fmt: skip
        # OpenAI puts "usage": null on every chunk but the last when usage was asked for.
        self.tail = b"]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"

    def role(self) -> bytes:
        """Chat's first chunk: the assistant role with empty content."""
        return (
            self.head + b'{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}' + self.tail
        )

    def token(self, index: int, token: int, finish: str | None = None) -> bytes:
        """One token event; for text completions `finish` marks the last token."""
        if self.chat:
            return (
                self.head + b'{"index":0,"delta":{"content":' + TOKENS_JSON[token]
                + b'},"logprobs":null,"finish_reason":null}' + self.tail
            )  # fmt: skip
        fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
        return (
            self.head + b'{"index":' + str(index).encode() + b',"text":' + TOKENS_JSON[token]
            + b',"logprobs":null,"finish_reason":' + fin + b"}" + self.tail
        )  # fmt: skip

    def finish(self, reason: str) -> bytes:
        """Chat's closing chunk: empty delta with the finish reason."""
        return (
            self.head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
            + reason.encode() + b'"}' + self.tail
        )  # fmt: skip

    def usage(self, prompt: int, completion: int) -> bytes:
        """The final `include_usage` chunk with no choices."""
        return self.head + b'],"usage":' + encode(usage(prompt, completion)) + b"}\n\n"
