"""Every error the data plane answers with, in one table, in the OpenAI error shape.

Clients (the `openai` package above all) read `error.message`, `error.type`,
`error.param` and `error.code`; the HTTP status decides which exception they raise.
"""

from __future__ import annotations

import enum

import msgspec


class ErrorBody(msgspec.Struct):
    """The inner object of `{"error": {...}}`."""

    message: str
    type: str
    param: str | None
    code: str | int | None


class Envelope(msgspec.Struct):
    """The OpenAI error envelope."""

    error: ErrorBody


class Kind(enum.Enum):
    """Error kinds: value is (HTTP status, OpenAI error type, stable code)."""

    INVALID_JSON = (400, "invalid_request_error", "invalid_json")
    INVALID_REQUEST = (400, "invalid_request_error", "invalid_request")
    NOT_FOUND = (404, "invalid_request_error", "not_found")
    MODEL_NOT_FOUND = (404, "invalid_request_error", "model_not_found")
    UNAUTHORIZED = (401, "invalid_request_error", "invalid_api_key")
    METHOD_NOT_ALLOWED = (405, "invalid_request_error", "method_not_allowed")
    BODY_TIMEOUT = (408, "invalid_request_error", "request_timeout")
    """The request body did not arrive within `timeouts.client_body`."""
    BODY_TOO_LARGE = (413, "invalid_request_error", "body_too_large")
    REPLICAS_BUSY = (429, "rate_limit_error", "replicas_busy")
    RATE_LIMITED = (429, "requests", "rate_limit_exceeded")
    """rpm or concurrency of a key or project (OpenAI's type for request limits)."""
    TOKENS_LIMITED = (429, "tokens", "rate_limit_exceeded")
    """tpm or a token budget of a key or project."""
    INTERNAL = (500, "server_error", "internal_error")
    UPSTREAM_FAILED = (502, "upstream_error", "upstream_failed")
    NO_REPLICA = (503, "service_unavailable", "no_healthy_replica")
    NOT_READY = (503, "service_unavailable", "not_ready")
    SCALING_UP = (503, "service_unavailable", "scale_up_timeout")
    """A model with no replica: one was asked for and was not ready within the model's timeout."""
    NOT_PLACED = (503, "service_unavailable", "no_placement")
    """A model with no replica that the control plane cannot, or will not, start."""
    LIMITS_UNAVAILABLE = (503, "service_unavailable", "limits_unavailable")
    UPSTREAM_TIMEOUT = (504, "timeout", "upstream_timeout")

    @property
    def status(self) -> int:
        """The HTTP status this kind is answered with."""
        return self.value[0]


_ENCODER = msgspec.json.Encoder()

# Truncation of anything a client or an upstream sent that we echo back: an
# error must never become a way to reflect a whole (possibly hostile) body.
MAX_ECHO = 200


def truncate(text: str, limit: int = MAX_ECHO) -> str:
    """Shortens text that is echoed in an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


def error_body(kind: Kind, message: str, param: str | None = None) -> bytes:
    """The JSON body of an error answer."""
    _, etype, code = kind.value
    return _ENCODER.encode(Envelope(ErrorBody(message, etype, param, code)))


def sse_error_event(kind: Kind, message: str) -> bytes:
    """One SSE event carrying an error, for failures after the stream began."""
    return b"data: " + error_body(kind, message) + b"\n\n"
