"""The llama.cpp engine's RSGI application: the OpenAI surface the gateway uses, over `llama_cpp.Llama`.

This is llmgw's own adapter, not `python -m llama_cpp.server`: that server needs
FastAPI, uvicorn and three more packages, has no `/health` (the gateway probes
every replica there) and sends no usage when streaming (the gateway accounts
tokens from the final chunk that `stream_options.include_usage` asks for). Here:

- `GET /health`: 200 once the model is loaded (it loads before the port opens).
- `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`, plain
  or streamed (SSE), with the usage chunk when `stream_options.include_usage`.
- `GET /metrics`: vLLM's `num_requests_running` and `num_requests_waiting`
  gauges, which the gateway's `scored` policy reads.
- `Authorization: Bearer` on /v1 when the engine has a key, as vLLM does.

One `Llama` holds one context, so requests run one at a time, each in a worker
thread (generation is blocking C code); the others wait their turn and count
as waiting. A client that goes away stops its generation at the next token.
"""

from __future__ import annotations

import asyncio
import faulthandler
import hmac
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import msgspec
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian.rsgi import Scope

from llmgw.engines.llamacpp.config import LlamaConfig, from_env
from llmgw.engines.sim.jobs import HttpError
from llmgw.engines.sim.metrics import escape_label
from llmgw.engines.sim.schema import (
    DONE,
    UNAUTHORIZED,
    StreamOptions,
    error_body,
    error_type,
    usage,
)
from llmgw.net.serving import read_body

JSON = "application/json"
SSE = "text/event-stream"
MAX_BODY = 16 * 2**20
_END = object()


class Body(msgspec.Struct, kw_only=True):
    """The fields of a chat or text completion request this engine honours; others are ignored."""

    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of `Llama.create_*completion` the request sets."""
        out: dict[str, Any] = {}
        for name in ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if limit is not None:
            out["max_tokens"] = limit
        return out


class Counter:
    """Counts the tokens of the current generation, for the usage of streamed answers.

    llama-cpp-python reports usage only for whole answers; this wraps the model's
    `generate` (which every completion calls once, with the whole prompt) and
    counts what it evaluates and samples. A sampled end-of-generation token ends
    the answer and is not part of it, as in llama-cpp-python's own count.
    """

    def __init__(self, llm: Any, is_eog: Callable[[int], bool]) -> None:
        self.prompt = 0
        self.completion = 0
        original = llm.generate

        def generate(tokens: Any, *args: Any, **kwargs: Any) -> Iterator[int]:
            self.prompt, self.completion = len(tokens), 0
            for token in original(tokens, *args, **kwargs):
                if not is_eog(token):
                    self.completion += 1
                yield token

        llm.generate = generate


class LlamaApp:
    """RSGI app serving one GGUF model on the CPU."""

    def __init__(self, config: LlamaConfig, llm: Any, counter: Counter) -> None:
        self.cfg = config
        self.llm = llm
        self.counter = counter
        self.name = config.served_name
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self._bearer = f"Bearer {config.api_key}".encode() if config.api_key else None
        card = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "llmgw-llamacpp"}
        self._models_body = msgspec.json.encode({"object": "list", "data": [card]})

    # ---- plumbing -------------------------------------------------------------------

    @staticmethod
    def _send(protocol: HTTPProtocol, status: int, body: bytes, ctype: str = JSON) -> None:
        protocol.response_bytes(status, [("content-type", ctype)], body)

    def _metrics(self) -> bytes:
        labels = f'{{model_name="{escape_label(self.name)}"}}'
        return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {self.running}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {self.waiting}\n"
                ).encode()

    def _turn(self) -> None:
        """Waits for the model (in the worker thread); `_done` gives it back."""
        self.waiting += 1
        self._lock.acquire()
        self.waiting -= 1
        self.running += 1

    def _done(self) -> None:
        self.running -= 1
        self._lock.release()

    # ---- entry point ------------------------------------------------------------------

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        """Route one HTTP request."""
        if scope.proto != "http":
            return
        path, method = scope.path, scope.method
        if path == "/health" and method == "GET":
            return self._send(protocol, 200, b"")
        if path == "/metrics" and method == "GET":
            return self._send(protocol, 200, self._metrics(), "text/plain; version=0.0.4")
        if self._bearer is not None and path.startswith("/v1"):
            given = (scope.headers.get("authorization") or "").encode()
            if not hmac.compare_digest(given, self._bearer):
                return self._send(protocol, 401, UNAUTHORIZED)
        try:
            if path == "/v1/models" and method == "GET":
                return self._send(protocol, 200, self._models_body)
            if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                return await self._complete(protocol, await self._body(protocol, path == "/v1/chat/completions"))
            raise HttpError(404, f"{method} {path} is not a route of this engine")
        except HttpError as e:
            self._send(protocol, e.status, error_body(str(e), error_type(e.status), e.status, e.param))

    async def _body(self, protocol: HTTPProtocol, chat: bool) -> tuple[bool, Body]:
        raw = await read_body(protocol, MAX_BODY)
        if raw is None:
            raise HttpError(413, f"the request body is over {MAX_BODY} bytes")
        try:
            body = msgspec.json.decode(raw, type=Body)
        except msgspec.DecodeError as e:
            raise HttpError(400, f"the request body is not a valid completion request: {e}") from None
        if body.model is not None and body.model != self.name:
            raise HttpError(404, f"The model `{body.model}` does not exist.", "model")
        if chat and not body.messages:
            raise HttpError(400, "messages must be a non-empty list", "messages")
        for m in body.messages or ():
            # llama-cpp-python's chat formats take text; OpenAI's list of parts becomes its text.
            if isinstance(m.get("content"), list):
                m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
        if not chat and body.prompt is None:
            raise HttpError(400, "prompt must be a string", "prompt")
        return chat, body

    def _call(self, chat: bool, body: Body, stream: bool) -> Any:
        kw = body.sampling()
        if chat:
            return self.llm.create_chat_completion(messages=body.messages, model=self.name, stream=stream, **kw)
        return self.llm.create_completion(body.prompt, model=self.name, stream=stream, **kw)

    async def _complete(self, protocol: HTTPProtocol, request: tuple[bool, Body]) -> None:
        chat, body = request
        if body.stream:
            return await self._stream(protocol, chat, body)

        def whole() -> Any:
            self._turn()
            try:
                return self._call(chat, body, False)
            finally:
                self._done()

        try:
            answer = await asyncio.to_thread(whole)
        except (ValueError, TypeError) as e:  # llama-cpp-python's word for a bad request
            raise HttpError(400, str(e)) from None
        self._send(protocol, 200, msgspec.json.encode(answer))

    async def _stream(self, protocol: HTTPProtocol, chat: bool, body: Body) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        gone = threading.Event()
        put = queue.put_nowait

        def produce() -> None:
            self._turn()
            try:
                if gone.is_set():  # went away while waiting for its turn
                    return
                chunks = self._call(chat, body, True)
                try:
                    for chunk in chunks:
                        loop.call_soon_threadsafe(put, chunk)
                        if gone.is_set():
                            break
                finally:
                    chunks.close()
                loop.call_soon_threadsafe(put, (_END, self.counter.prompt, self.counter.completion))
            except Exception as e:  # noqa: BLE001 - whatever llama.cpp raised reaches the client as the stream's error event
                loop.call_soon_threadsafe(put, e)
            finally:
                self._done()

        worker = loop.run_in_executor(None, produce)
        transport = protocol.response_stream(200, [("content-type", SSE)])
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid4().hex}"
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    err = {"error": {"message": f"the engine failed: {item}", "type": "InternalServerError",
                                     "code": 500}}  # fmt: skip
                    await transport.send_bytes(b"data: " + msgspec.json.encode(err) + b"\n\n" + DONE)
                    return
                if isinstance(item, tuple) and item[0] is _END:
                    if body.stream_options is not None and body.stream_options.include_usage:
                        kind = "chat.completion.chunk" if chat else "text_completion"
                        last: dict[str, Any] = {"id": rid, "object": kind, "created": int(time.time()),
                                                "model": self.name, "choices": [], "usage": usage(item[1], item[2])}
                        await transport.send_bytes(b"data: " + msgspec.json.encode(last) + b"\n\n")
                    await transport.send_bytes(DONE)
                    return
                item["id"] = rid
                await transport.send_bytes(b"data: " + msgspec.json.encode(item) + b"\n\n")
        except Exception:
            gone.set()  # the client went away: stop generating at the next token
            raise
        finally:
            gone.set()
            await worker


def load(config: LlamaConfig) -> LlamaApp:
    """Loads the model (seconds for a small one), evaluates one token, and builds the app over it."""
    import llama_cpp

    kw: dict[str, Any] = {"n_ctx": config.n_ctx, "verbose": False}
    if config.threads:
        kw["n_threads"] = config.threads
    if config.chat_format:
        kw["chat_format"] = config.chat_format
    llm = llama_cpp.Llama(model_path=config.model_path, **kw)
    # One token through the model before the port opens. A llama-cpp-python built for
    # instructions this CPU refuses (AMX on some VMs: docs/troubleshooting.md) faults on
    # its first evaluation: here the engine then dies at start, with faulthandler's
    # traceback ending on this line, and no client request dies with it.
    faulthandler.enable()
    llm.eval([llm.token_bos()])
    llm.reset()  # type: ignore[no-untyped-call]  # llama-cpp-python leaves reset() unannotated
    vocab = llm._model.vocab  # the end-of-generation test llama-cpp-python itself uses
    counter = Counter(llm, lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token)))
    return LlamaApp(config, llm, counter)


def create_app() -> LlamaApp:
    """granian factory: the config from the environment, the model loaded."""
    return load(from_env())
