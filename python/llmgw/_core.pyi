"""Types of llmgw._core, the Rust extension (rust/src/lib.rs binds it)."""

from typing import Any, Literal, Self, final

from typing_extensions import disjoint_base

__all__ = [
    "Hold",
    "JsonSummary",
    "KeyIndex",
    "KvIndex",
    "ModelTokenizer",
    "Router",
    "StreamTap",
    "Ticket",
    "TokenLease",
    "UsageRows",
    "UsageScan",
    "__version__",
    "admit",
    "inspect_json",
    "patch_request",
    "scan_usage",
    "silent_connections",
    "take",
]

__version__: str

@final
class StreamTap:
    """Relays one upstream SSE body to the client and extracts what it reports.

    Feed it the upstream body chunks in order, with any chunk boundaries; it returns
    what to send to the client. Only complete SSE events are ever returned, so a
    frame that must be changed is changed whole. When nothing is changed and the
    chunk ends on an event boundary, `feed` returns the very object it was given.
    """

    def __new__(
        cls,
        strip_usage: bool = False,
        rename_from: str | None = None,
        rename_to: str | None = None,
    ) -> Self:
        """`strip_usage` drops the usage-only chunk (`"choices": []` with a usage
        object) that the gateway asked for on the client's behalf; `rename_from`
        and `rename_to` rewrite the `"model"` value of each event (aliases)."""

    def feed(self, data: bytes) -> bytes:
        """Consumes one upstream chunk; returns the bytes to send now (maybe empty)."""

    def finish(self) -> bytes:
        """Returns what is left buffered (an incomplete last event) at end of body."""

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete event held back (the caller bounds it)."""

    @property
    def chunks(self) -> int:
        """Data events with a JSON payload seen so far (`[DONE]` not counted)."""

    @property
    def content_chunks(self) -> int:
        """Events that carried generated output (text, content, reasoning or tool calls)."""

    @property
    def has_token(self) -> bool:
        """True once an event carried generated output: the first token has arrived."""

    @property
    def done(self) -> bool:
        """True once `data: [DONE]` was seen."""

    @property
    def finish_reason(self) -> str | None:
        """The last non-null `finish_reason` of any choice."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def total_tokens(self) -> int | None: ...
    @property
    def error(self) -> str | None:
        """The message of an error event (`data: {"error": ...}`), if one came."""

@final
class JsonSummary:
    """What a non-streamed OpenAI answer reported."""

    @property
    def body(self) -> bytes:
        """The body to send: the input object itself unless the model was renamed."""

    @property
    def finish_reason(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def total_tokens(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...

def inspect_json(
    body: bytes, rename_from: str | None = None, rename_to: str | None = None
) -> JsonSummary:
    """Extracts usage, finish reason and error from a whole JSON answer."""

@final
class Router:
    """The replica table of one gateway worker and its routing policies.

    Replicas are addressed by their index in the list given to `set_replicas`.
    Each model is routed by its own configuration (`configure`); a model never
    configured uses the defaults (least load).
    """

    def __new__(cls) -> Self: ...
    def set_replicas(self, replicas: list[tuple[str, list[str]]]) -> None:
        """Replaces the table with (replica id, served model names) pairs.

        Outstanding counts, health, engine load and cached prefixes of replicas
        whose id stays are kept; a replica that leaves loses its prefixes."""

    def configure(self, model: str, config: dict[str, object] | str) -> None:
        """Sets a model's routing configuration, a dict (or its JSON text) with
        any of: `policy` ("round_robin", "least_load", "power_of_two", "prefix",
        "kv", "scored"), `weights` ({"prefix", "load", "queue", "kv_usage"}),
        `guard_abs`, `guard_rel`, `min_match`, `tree_max_bytes`,
        `tree_max_nodes`, `tree_ttl_s`, `max_prompt_bytes`. Fields left out take
        their defaults (see `status(model)["config"]`). Raises ValueError with a
        sentence naming the bad field."""

    def pick(self, model: str, exclude: list[int] | None = None) -> int | None:
        """Chooses a healthy replica serving `model`, not in `exclude`, without
        looking at the prompt (prompt-aware policies use the least loaded).
        Counts the request as outstanding on it (call `release` when it ends).
        None when there is none."""

    def route(
        self, model: str, body: bytes, chat: bool, exclude: list[int] | None = None
    ) -> tuple[int, str] | None:
        """Like `pick`, for a request body: the prompt (a chat's whole rendered
        conversation when `chat`, else the completion's `prompt`) is read from
        the body in Rust. Returns the index and the reason as compact JSON:
        policy, kind, unit, matched, total, guard, bound, fallback, candidates."""

    def release(self, index: int) -> None:
        """Ends one outstanding request on a replica."""

    def set_healthy(self, index: int, healthy: bool) -> None: ...
    def set_engine_load(self, index: int, running: int, waiting: int, kv_usage: float) -> None:
        """Records what the engine's /metrics said: `vllm:num_requests_running`,
        `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (clamped to 0..1)."""

    def is_healthy(self, index: int) -> bool: ...
    def outstanding(self, index: int) -> int: ...
    def has_model(self, model: str) -> bool:
        """True when any replica (healthy or not) serves `model`."""

    def healthy_count(self) -> int: ...
    def status(self, model: str) -> dict[str, object]:
        """The model's configuration, the policy in force (`effective`) and why it
        differs or matches approximately (`why`), replica counts, tree size, and
        whether a KV oracle and a tokenizer are attached."""

    def set_kv_index(self, model: str, index: KvIndex | None) -> None:
        """Gives a model's precise (`kv`) mode its KV-event index (None detaches it)."""

    def set_tokenizer(self, model: str, tokenizer: ModelTokenizer | None) -> None:
        """Gives a model its tokenizer, which precise (`kv`) mode needs (None detaches it)."""

    def decisions(self) -> dict[str, int]:
        """Decisions so far, keyed "model|policy|kind", for /metrics."""

def patch_request(body: bytes, model: str | None, include_usage: bool) -> bytes:
    """Changes a JSON request body in place of a re-encode: sets the top-level
    `"model"` (when `model` is given) and `stream_options.include_usage: true`
    (when `include_usage`), splicing only those values. Raises ValueError when the
    body is not a JSON object."""

def silent_connections(
    answer: bytes, seq: int, port: int
) -> tuple[list[tuple[int, tuple[tuple[str, int], tuple[str, int]]]], bool]:
    """The established connections of local `port` whose peer has sent no byte yet, in
    `answer` (one part of the answer to sock_diag dump `seq`): (inode, ((local ip, port), (peer ip, port)))
    each, an IPv4-mapped address read as IPv4; and whether the dump goes on (False: its end,
    an error, or another dump's message)."""

@final
class KeyIndex:
    """API keys by the keyed hash they are stored under (BLAKE2b-256 keyed with
    `hash_key`, as `llmgw.secrets.keys.key_hash`); each maps to the object given for it."""

    def __new__(cls, hash_key: bytes, entries: list[tuple[str, Any]]) -> Self:
        """`entries` pairs a stored hash (64 hexadecimal digits) with its object. A pair
        whose hash is not that shape is left out and counted in `skipped`. Raises
        ValueError for a hash key of more than 64 bytes."""

    def get(self, key: str) -> Any | None:
        """The object stored under `key`'s keyed hash, or None."""

    def get_after(self, header: str, scheme: str) -> Any | None:
        """The object of the key `header` carries after `scheme` (`Bearer `), or None when
        the header does not start with it or the key matches no hash."""

    def get_live(self, header: str, scheme: str) -> Any | None:
        """As `get_after`, but only for an object whose `expires_at` (seconds since the epoch,
        or None) has not passed by the wall clock; None sends the caller to its slower path."""

    def __len__(self) -> int: ...
    @property
    def skipped(self) -> int:
        """Entries left out because their hash was not 64 hexadecimal digits (they match no key)."""

@final
class TokenLease:
    """Tokens leased for one scope: requests take their estimates and settle what they used."""

    id: int
    balance: int
    granted: int
    until: float
    in_flight: int

    def __new__(cls, lease_id: int, tokens: int, until: float) -> Self:
        """A lease of `tokens` (the balance and what was granted) that ends at `until`."""

@disjoint_base
class Hold:
    """What one worker holds for one scope, as far as a request takes from it; subclassed
    by `llmgw.gateway.limits.Share`. Every field starts at zero (no limit, nothing held)."""

    has_rpm: bool
    has_conc: bool
    metered: bool
    units: int
    units_until: float
    slots_free: int
    last_used: float
    tok: TokenLease | None

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        """Ignores its arguments (they are the subclass's `__init__`'s)."""

@final
class Ticket:
    """What one admitted request holds; `release` gives it back."""

    def __new__(cls, slotted: list[Hold] = ..., leases: list[TokenLease] = ..., cost: int = 0) -> Self: ...
    def release(self, tokens: int) -> None:
        """The request ended: its slots come back, and its estimate less the `tokens` it
        used goes back to each lease it took from."""

    @property
    def slotted(self) -> tuple[Hold, ...]:
        """The holds whose slot this request took."""

    @property
    def leases(self) -> tuple[TokenLease, ...]:
        """The token leases this request took its estimate from."""

    @property
    def cost(self) -> int:
        """The token estimate taken from each lease."""

def admit(holds: tuple[Hold, ...], now: float, cost: int) -> Ticket | None:
    """Takes a unit (rpm), a slot (concurrency) and `cost` tokens (tpm, budgets) from every
    hold that limits them, or nothing when one of them lacks something at `now` (None)."""

def take(memo: dict[str, Any], entry: Any, project: Any, now: float, cost: int) -> Ticket | Literal[False] | None:
    """`admit` from the shares `memo[entry.key_id]` holds when it is `(entry, project, shares)`
    for this very entry and project, and some share limits it; False otherwise (the caller
    works the shares out)."""

@final
class UsageRows:
    """Finished requests' usage rows (JSON arrays in `llmgw.protocol.wire.UsageRow`'s field order),
    oldest first, waiting for the next post to the control plane."""

    def __new__(cls) -> Self: ...
    dropped: int
    """Records not queued because `max_pending` were waiting (the sink logs and resets it)."""

    def track(self, opens: dict[str, Any], last_used: dict[str, float], max_pending: int) -> None:
        """Keeps `opens` and `last_used` (the sink's dicts) as requests end, and counts records
        past `max_pending` (rows waiting plus opens) as dropped."""

    @property
    def max_pending(self) -> int:
        """The bound set by `track` (0: none)."""

    def ending(self, request_id: str, key_id: str | None, started_at: float) -> bool:
        """A request ended and its record is about to be queued: its open is taken out and its
        key's use noted; False when too many records wait (it is dropped, and counted)."""

    def finish(self, request_id: str, model: str, upstream_model: str, replica: str | None, status: str,
               http_status: int, stream: bool, prompt_tokens: int, completion_tokens: int,
               usage_estimated: bool, ttft_s: float | None, duration_s: float, finish_reason: str | None,
               retries: int, started_at: float, route: str | None, key_id: str | None, user_id: str | None,
               project_id: str | None, team_id: str | None, org_id: str | None) -> bool:
        """A request without kept bodies ended: `ending`, then its row appended unless it was
        dropped (False); without `track`, only the row. `ttft_s` and `duration_s` are seconds,
        written as milliseconds to the microsecond; `route` is the router's JSON, written as is."""

    def push(self, row: bytes) -> None:
        """Appends one record encoded elsewhere (one JSON value: a UsageRow with kept bodies,
        or a UsageRecord object where the gateway sends objects)."""

    def replace_first(self, row: bytes) -> None:
        """Puts `row` (one JSON value) in the place of the first row."""

    def head(self, n: int) -> bytes:
        """The first `n` rows (at most all) as one JSON array."""

    def drop_head(self, n: int) -> None:
        """Drops the first `n` rows (at most all): sent, or refused for good."""

    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Bytes held."""

@final
class KvIndex:
    """Which replica's KV cache holds which prompt prefix, from the engines' KV events.

    Blocks are keyed by llmgw's own chained hash of their token ids (stable across
    processes and versions), so the engines' hash algorithm and seed do not matter.
    State is kept per (replica, data-parallel rank); a stored run whose parent block
    is unknown cannot be keyed and is counted as `unkeyable`.
    """

    def __new__(
        cls, block_size: int = 16, max_blocks_per_replica: int = 4000000, seed: int = 0
    ) -> Self:
        """`block_size` must equal the engines'; `max_blocks_per_replica` bounds the
        blocks kept per replica and rank (tails of the oldest chains go first); `seed`
        must be the same on every gateway of a deployment."""

    def apply(self, replica: str, seq: int, payload: bytes) -> int | None:
        """Applies one batch (the msgpack frame of vLLM's KV-event publisher, `seq`
        from its sequence frame). Returns None when it was applied or ignored (a
        duplicate; a restart at seq 0 drops the replica's blocks first), or the seq to
        replay from when batches were missed: feed the replayed batches through `apply`
        in order, then go on with live ones. Raises ValueError when the payload does
        not decode (nothing is applied; `drop_replica` is then the way out)."""

    def drop_replica(self, replica: str) -> None:
        """Forgets a replica's blocks and sequence state (replay failed, or it went away)."""

    def score(self, tokens: list[int], lora_id: int | None = None) -> dict[str, int]:
        """Matched prefix length in tokens per replica holding at least the prompt's
        first block (the best of its ranks)."""

    def stats(self) -> dict[str, int]:
        """Counters (batches, events by kind, unknown_events, unkeyable,
        removed_unknown, gaps, restarts, ...) and current sizes (blocks, replicas,
        heap_bytes, bytes_per_block)."""

    def block_keys(self, tokens: list[int], lora_id: int | None = None) -> list[int]:
        """llmgw's keys of the prompt's full blocks (for tests and debugging)."""

@final
class ModelTokenizer:
    """A model's tokenizer and chat template, loaded from its Hugging Face files.

    Turns an OpenAI request body into the token ids vLLM will see for it, for
    prefix-cache-aware routing. Thread-safe; long inputs release the interpreter.
    """

    @staticmethod
    def from_dir(path: str) -> ModelTokenizer:
        """Loads `tokenizer.json` (required), `tokenizer_config.json` and
        `chat_template.jinja` from a model directory; raises ValueError with a
        sentence naming the bad file and what to do."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Encodes text to token ids; special tokens as the post-processor adds them."""

    def render_chat(self, body: bytes, add_generation_prompt: bool = True) -> str:
        """Renders a chat completions body with the chat template; raises
        ValueError when there is no template or the template raises."""

    def tokens(self, body: bytes, chat: bool) -> list[int] | None:
        """The prompt's token ids as vLLM will see them (chat: rendered, no
        special tokens added; completions: prompt with special tokens), or None
        when they cannot be known (bad body, no template, tools)."""

    @property
    def has_chat_template(self) -> bool:
        """True when a chat template was found."""

@final
class UsageScan:
    """One gateway usage post (`llmgw.protocol.wire.UsageBatch` JSON) read by `scan_usage`."""

    @property
    def gateway_id(self) -> str: ...
    @property
    def opens(self) -> bytes | None:
        """The `opens` value's JSON, when the post has it."""
    @property
    def key_last_used(self) -> bytes | None:
        """The `key_last_used` value's JSON, when the post has it."""
    @property
    def rows(self) -> str:
        """The `rows` array as posted (`[]` when the post has none): the text stored."""
    @property
    def rows_posted(self) -> int:
        """Rows in the post, repeats of a request id included."""
    @property
    def ids(self) -> list[str]:
        """Request ids in the order posted, each once (its first row is the one counted)."""
    @property
    def started_max(self) -> float:
        """The latest `started_at` of the rows (0.0 when none)."""
    @property
    def groups(self) -> list[tuple[int, str, str, str, str, str, str, int, int, int, int]]:
        """The counted rows summed by rollup group: (hour start, org, team, project, user,
        key, model, requests, errors, prompt tokens, completion tokens), '' for a missing
        id, the hour as the store's `hour_of` gives it."""
    def row(self, i: int) -> bytes:
        """The row of `ids[i]`, as posted."""

def scan_usage(data: bytes) -> UsageScan | None:
    """Reads a usage post in one native pass, or returns None where msgspec must decode it:
    it takes only rows msgspec would decode into `UsageRow`, and declines kept bodies,
    object-shaped finals, unknown keys, a NUL or lone surrogate in a string, and rows
    shorter than a gateway writes them."""
