"""The simulator's RSGI application: vLLM's OpenAI HTTP surface, no GPU.

Hot path rule: in zero-latency mode (no TTFT, ITL or prefill cost) a request
never sleeps and never spawns tasks; client disconnects are then noticed only
when `send_bytes` raises. With latency (or a waiting fault, or a full batch)
the work runs in a task raced against `client_disconnect()`, so a client that
goes away cancels it at once.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import sys
import time
from collections import deque
from typing import TYPE_CHECKING
from uuid import uuid4

import msgspec
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian._granian import RSGIProtocolClosed as ProtocolClosed
from granian.rsgi import Scope

from llmgw.engines.sim.cache import PrefixCache
from llmgw.engines.sim.config import SimConfig, from_env
from llmgw.engines.sim.faults import HEADER, Fault, FaultError, parse, reset_connection
from llmgw.engines.sim.jobs import HttpError, Job, Send, fault_point, prompt_texts, render_chat
from llmgw.engines.sim.kv import KvEventSink

if TYPE_CHECKING:
    from llmgw._core import ModelTokenizer
    from llmgw.engines.sim.kv_zmq import ZmqPublisher
from llmgw.engines.sim.metrics import CONTENT_TYPE as METRICS_TYPE
from llmgw.engines.sim.metrics import SimMetrics
from llmgw.engines.sim.schema import (
    DONE,
    STREAM_ERROR,
    UNAUTHORIZED,
    ChatRequest,
    ChunkTemplates,
    CompletionRequest,
    EmbeddingRequest,
    encode,
    error_body,
    error_type,
    usage,
)
from llmgw.engines.sim.text import detokenize, embedding_data, generate

JSON = "application/json"
SSE = "text/event-stream"
# Give granian time to write queued chunks before the socket is cut (fault path only).
RESET_FLUSH_S = 0.05
POST_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/embeddings"))
NOT_FOUND = b'{"detail":"Not Found"}'
NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
KV_LINE = "llmgw-sim publishes KV events on"
"""Starts the line naming the KV-event endpoints bound (tests read the ports from it)."""


class SimApp:
    """RSGI app simulating one vLLM engine (per granian worker)."""

    def __init__(self, config: SimConfig, sink: KvEventSink | None = None) -> None:
        config.validate()
        self.cfg = config
        self.models = frozenset(config.models)
        self.default_model = config.models[0]
        self.cache = PrefixCache(config.block_size, config.cache_blocks, sink)
        self.metrics = SimMetrics(self.default_model, self.cache)
        self._zero = config.zero_latency
        self._queue: deque[asyncio.Future[None]] = deque()
        self._chat_dec = msgspec.json.Decoder(ChatRequest)
        self._cmpl_dec = msgspec.json.Decoder(CompletionRequest)
        self._emb_dec = msgspec.json.Decoder(EmbeddingRequest)
        created = int(time.time())
        self._model_cards = {
            m: {"id": m, "object": "model", "created": created, "owned_by": "llmgw-sim",
                "root": m, "parent": None}
            for m in config.models
        }  # fmt: skip
        self._models_body = encode({"object": "list", "data": list(self._model_cards.values())})
        self.tokenizer: ModelTokenizer | None = None
        if config.tokenizer:
            from llmgw._core import ModelTokenizer  # the Rust core: only when asked for

            self.tokenizer = ModelTokenizer.from_dir(config.tokenizer)
        self.publisher: ZmqPublisher | None = None
        self._bearer = f"Bearer {config.api_key}".encode() if config.api_key else None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Per worker, after granian forked it: open the KV-event sockets, and print where
        (`KV_LINE`, before the ready line: a worker serves only after this returns), so an
        endpoint of port `*` is found by the port it got."""
        cfg = self.cfg
        if cfg.kv_events_endpoint:
            from llmgw.engines.sim.kv_zmq import ZmqPublisher

            self.publisher = pub = ZmqPublisher(
                cfg.kv_events_endpoint, cfg.kv_replay_endpoint, encoding=cfg.kv_events_encoding,
                replay_topic_frame=cfg.kv_replay_topic_frame,
            )
            self.cache.attach(pub)
            pub.start(loop)
            replay = f", replays them on {pub.replay_endpoint}" if pub.replay_endpoint else ""
            os.write(sys.stdout.fileno(), f"{KV_LINE} {pub.endpoint}{replay}\n".encode())

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Closes the KV-event sockets."""
        if self.publisher is not None:
            self.publisher.close()

    # ---- plumbing -------------------------------------------------------------------

    def _log_request(self, rid: str) -> None:
        assert self.cfg.request_log is not None
        # One O_APPEND write per line keeps lines whole across workers; a test
        # helper, so a synchronous write per request is fine.
        fd = os.open(self.cfg.request_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{rid} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)

    @staticmethod
    def _headers(rid: str, ctype: str) -> list[tuple[str, str]]:
        return [("content-type", ctype), ("x-request-id", rid), ("x-llmgw-simulated", "true")]

    def _send(self, protocol: HTTPProtocol, status: int, rid: str, body: bytes,
              ctype: str = JSON) -> None:  # fmt: skip
        protocol.response_bytes(status, self._headers(rid, ctype), body)

    def _error(self, protocol: HTTPProtocol, rid: str, err: HttpError) -> None:
        body = error_body(str(err), error_type(err.status), err.status, err.param)
        self._send(protocol, err.status, rid, body)

    def _aborted(self) -> None:
        self.metrics.aborted += 1
        self.metrics.finished["abort"] += 1

    def _check_model(self, model: str | None) -> str:
        if model is None:
            return self.default_model
        if model not in self.models:
            raise HttpError(404, f"The model `{model}` does not exist.", "model")
        return model

    def _budget(self, job: Job, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        out = self.cfg.output_tokens
        if max_tokens is not None and max_tokens < out:
            job.n_out, job.finish = max_tokens, "length"
        else:
            job.n_out, job.finish = out, "stop"

    # ---- entry point ------------------------------------------------------------------

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        """Route one HTTP request."""
        if scope.proto != "http":
            return
        headers = scope.headers
        rid = headers.get("x-request-id") or uuid4().hex
        path, method = scope.path, scope.method
        if path == "/metrics":  # never faulted, so tests can always scrape
            self._send(protocol, 200, rid, self.metrics.render(), METRICS_TYPE)
            return
        if self._bearer is not None and path.startswith("/v1") and method != "OPTIONS":
            # As vLLM's middleware: every /v1 route, checked before anything else.
            given = (headers.get("authorization") or "").encode()
            if not hmac.compare_digest(given, self._bearer):
                self._send(protocol, 401, rid, UNAUTHORIZED)
                return
        fault: Fault | None = None
        raw_fault = headers.get(HEADER)
        try:
            if raw_fault:
                fault = parse(raw_fault)
                if fault.fail is not None:
                    msg = f"simulated failure ({HEADER}: {raw_fault})"
                    raise HttpError(fault.fail, msg)
            if path.startswith("/v1/") and method == "POST":
                if self.cfg.request_log is not None:
                    self._log_request(rid)
                if path == "/v1/chat/completions":
                    return await self._serve_job(
                        protocol, await self._chat(scope, protocol, rid), fault
                    )
                if path == "/v1/completions":
                    return await self._serve_job(
                        protocol, await self._cmpl(scope, protocol, rid), fault
                    )
                if path == "/v1/embeddings":
                    if fault is None or not await self._plain_fault(scope, protocol, fault):
                        await self._embeddings(protocol, rid)
                    return
            is_get = path in ("/health", "/v1/models") or path.startswith("/v1/models/")
            if method != "GET" or not is_get:
                # FastAPI's (vLLM's) answers for a wrong method or an unknown route.
                known = is_get or path in POST_PATHS
                status, body = (405, NOT_ALLOWED) if known else (404, NOT_FOUND)
                self._send(protocol, status, rid, body)
                return
            if fault is not None and await self._plain_fault(scope, protocol, fault):
                return
            if path == "/health":
                protocol.response_empty(200, self._headers(rid, "text/plain"))
            elif path == "/v1/models":
                self._send(protocol, 200, rid, self._models_body)
            else:
                card = self._model_cards.get(path[len("/v1/models/") :])
                if card is None:
                    raise HttpError(404, f"The model `{path[11:]}` does not exist.", "model")
                self._send(protocol, 200, rid, encode(card))
        except HttpError as err:
            self._error(protocol, rid, err)
        except FaultError as err:
            self._error(protocol, rid, HttpError(400, str(err)))

    async def _plain_fault(self, scope: Scope, protocol: HTTPProtocol, fault: Fault) -> bool:
        """Apply hang/reset to a non-streaming endpoint; True if the request is done."""
        if fault.hang or fault.hang_after is not None:
            await protocol.client_disconnect()
            self.metrics.aborted += 1
            return True
        if fault.reset_after is not None:
            reset_connection(scope.client, scope.server)
            return True
        return False

    # ---- request decoding ---------------------------------------------------------

    async def _chat(self, scope: Scope, protocol: HTTPProtocol, rid: str) -> Job:
        body = await protocol()
        try:
            req = self._chat_dec.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise HttpError(400, f"Invalid request body: {exc}") from None
        job = Job(True, scope, "chatcmpl-" + rid, self._check_model(req.model),
                  [render_chat(req.messages)])  # fmt: skip
        self._tokenize(job, body)
        mt = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return self._finish_job(job, mt, req.stream, req.stream_options, req.seed)

    async def _cmpl(self, scope: Scope, protocol: HTTPProtocol, rid: str) -> Job:
        body = await protocol()
        try:
            req = self._cmpl_dec.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise HttpError(400, f"Invalid request body: {exc}") from None
        model = self._check_model(req.model)
        job = Job(False, scope, "cmpl-" + rid, model, prompt_texts(req.prompt, "prompt"))
        self._tokenize(job, body)
        return self._finish_job(job, req.max_tokens, req.stream, req.stream_options, req.seed)

    def _tokenize(self, job: Job, body: bytes) -> None:
        """With a model tokenizer, the cache sees the token ids the engine would."""
        tok = self.tokenizer
        if tok is None:
            return
        if len(job.texts) == 1:
            ids = tok.tokens(body, job.chat)
            if ids is not None:
                job.tokens = [tuple(ids)]
                return
        job.tokens = [tuple(tok.encode(t)) for t in job.texts]

    def _finish_job(self, job: Job, max_tokens: int | None, stream: bool | None,
                    opts: object, seed: int | None) -> Job:  # fmt: skip
        self._budget(job, max_tokens)
        job.stream = bool(stream)
        job.include_usage = bool(job.stream and opts is not None
                                 and getattr(opts, "include_usage", False))  # fmt: skip
        job.seed = self.cfg.seed if seed is None else seed
        return job

    async def _embeddings(self, protocol: HTTPProtocol, rid: str) -> None:
        try:
            req = self._emb_dec.decode(await protocol())
        except (msgspec.DecodeError, RecursionError) as exc:
            raise HttpError(400, f"Invalid request body: {exc}") from None
        model = self._check_model(req.model)
        texts = prompt_texts(req.input, "input")
        fmt = req.encoding_format or "float"
        if fmt not in ("float", "base64"):
            raise HttpError(400, f"unsupported encoding_format {fmt!r}", "encoding_format")
        data = embedding_data(self.cfg.seed, texts, self.cfg.embedding_dim, fmt)
        tokens = sum(len(t.split()) for t in texts)
        self.metrics.prompt_tokens += tokens
        body = {"id": "embd-" + rid, "object": "list", "created": int(time.time()),
                "model": model, "data": data, "usage": usage(tokens, 0)}  # fmt: skip
        self._send(protocol, 200, rid, encode(body))

    # ---- scheduling -----------------------------------------------------------------

    async def _serve_job(self, protocol: HTTPProtocol, job: Job, fault: Fault | None) -> None:
        watched = (not self._zero or (fault is not None and fault.needs_watch)
                   or self.metrics.running >= self.cfg.max_num_seqs)  # fmt: skip
        if not watched:
            await self._run(protocol, job, fault)
            return
        task = asyncio.ensure_future(self._run(protocol, job, fault))
        gone = asyncio.ensure_future(protocol.client_disconnect())
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():  # the client left (or we were cancelled): stop generating now
                task.cancel()
                await asyncio.wait((task,))
            gone.cancel()
        if not task.cancelled():
            task.result()

    async def _run(self, protocol: HTTPProtocol, job: Job, fault: Fault | None) -> None:
        m = self.metrics
        admitted = False
        try:
            if m.running < self.cfg.max_num_seqs:
                m.running += 1
            else:
                await self._wait_slot()
            admitted = True
            if job.stream:
                await self._stream(protocol, job, fault)
            else:
                await self._unary(protocol, job, fault)
        except ProtocolClosed:
            self._aborted()
        except asyncio.CancelledError:
            self._aborted()
            raise
        finally:
            if admitted:
                self._release()

    async def _wait_slot(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        self.metrics.waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if not fut.cancelled():  # a slot was handed over just as we were cancelled
                self._release()
            raise
        finally:
            self.metrics.waiting -= 1

    def _release(self) -> None:
        # Hand the slot straight to the oldest live waiter; running stays the same.
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.metrics.running -= 1

    def _prefill(self, job: Job) -> tuple[int, float]:
        """Query the prefix cache; return prompt tokens and the TTFT delay in seconds."""
        prompt_tokens = 0
        hit = 0
        for tokens in job.tokens:
            n, h = self.cache.query(tokens)
            prompt_tokens += n
            hit += h
        delay = self.cfg.ttft_ms / 1e3 + self.cfg.prefill_us_per_token * (prompt_tokens - hit) / 1e6
        return prompt_tokens, delay

    def _first_token(self, job: Job, prompt_tokens: int) -> None:
        self.metrics.prompt_tokens += prompt_tokens
        self.metrics.observe_ttft(time.perf_counter() - job.start)

    def _itl(self, fault: Fault | None) -> float:
        if fault is not None and fault.slow_ms is not None:
            return fault.slow_ms / 1e3
        return self.cfg.itl_ms / 1e3

    async def _unary(self, protocol: HTTPProtocol, job: Job, fault: Fault | None) -> None:
        if fault is not None:
            if fault.hang or fault.hang_after is not None:
                await asyncio.get_running_loop().create_future()  # until cancelled by disconnect
            if fault.reset_after is not None:
                reset_connection(job.scope.client, job.scope.server)
                return
        prompt_tokens, delay = self._prefill(job)
        if delay > 0:
            await asyncio.sleep(delay)
        self._first_token(job, prompt_tokens)
        itl = self._itl(fault)
        if itl > 0 and job.n_out > 1:
            await asyncio.sleep(itl * (job.n_out - 1))
        outs = [generate(job.seed, text, job.n_out) for text in job.texts]
        completion = job.n_out * len(outs)
        self.metrics.generation_tokens += completion
        rid = job.rid.partition("-")[2]
        if fault is not None and fault.error_after is not None:
            self._send(
                protocol, 500, rid, error_body("simulated engine error", "InternalServerError", 500)
            )
            return
        if job.chat:
            choices: list[dict[str, object]] = [{
                "index": 0, "message": {"role": "assistant", "content": detokenize(outs[0])},
                "logprobs": None, "finish_reason": job.finish}]  # fmt: skip
        else:
            choices = [{"index": i, "text": detokenize(o), "logprobs": None,
                        "finish_reason": job.finish} for i, o in enumerate(outs)]  # fmt: skip
        body = {"id": job.rid, "object": "chat.completion" if job.chat else "text_completion",
                "created": int(time.time()), "model": job.model, "choices": choices,
                "usage": usage(prompt_tokens, completion)}  # fmt: skip
        self.metrics.finished[job.finish] += 1
        self._send(protocol, 200, rid, encode(body))

    async def _stream(self, protocol: HTTPProtocol, job: Job, fault: Fault | None) -> None:
        rid = job.rid.partition("-")[2]
        transport = protocol.response_stream(200, self._headers(rid, SSE))
        send = transport.send_bytes
        tpl = ChunkTemplates(job.chat, job.rid, int(time.time()), job.model, job.include_usage)
        # The fault that fires first (smallest N): (N, action).
        stop_at, action = fault_point(fault)
        prompt_tokens, delay = self._prefill(job)
        if delay > 0:
            await asyncio.sleep(delay)
        itl = self._itl(fault)
        self._first_token(job, prompt_tokens)
        if job.chat:
            await send(tpl.role())
        sent = 0
        last = job.n_out - 1
        for index, text in enumerate(job.texts):
            for k, token in enumerate(generate(job.seed, text, job.n_out)):
                if sent == stop_at:
                    return await self._stream_fault(job, action, send)
                if itl > 0 and sent:
                    await asyncio.sleep(itl)
                await send(tpl.token(index, token, job.finish if k == last else None))
                self.metrics.generation_tokens += 1
                sent += 1
        if stop_at is not None:  # N was past the last token: break before the end
            return await self._stream_fault(job, action, send)
        if job.chat:
            await send(tpl.finish(job.finish))
        if job.include_usage:
            await send(tpl.usage(prompt_tokens, sent))
        await send(DONE)
        self.metrics.finished[job.finish] += 1

    async def _stream_fault(self, job: Job, action: str, send: Send) -> None:
        if action == "hang":
            await asyncio.get_running_loop().create_future()  # until cancelled by disconnect
        elif action == "reset":
            await asyncio.sleep(RESET_FLUSH_S)
            reset_connection(job.scope.client, job.scope.server)
        else:  # "200 + data: error", then a normal end as vLLM does
            await send(STREAM_ERROR)
            await send(DONE)


def create_app() -> SimApp:
    """granian factory: build the app from the `LLMGW_SIM_CONFIG` environment variable."""
    return SimApp(from_env())
