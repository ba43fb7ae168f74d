"""Types of llmgw._core, the Rust extension (rust/src/lib.rs binds it)."""

from typing import Self, final

__all__ = [
    "JsonSummary",
    "ModelTokenizer",
    "Router",
    "StreamTap",
    "__version__",
    "inspect_json",
    "patch_request",
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
    """The replica table of one gateway worker and the balancing policy.

    Replicas are addressed by their index in the list given to `set_replicas`.
    """

    def __init__(self) -> None: ...
    def set_replicas(self, replicas: list[tuple[str, list[str]]]) -> None:
        """Replaces the table with (replica id, served model names) pairs.

        Outstanding counts and health of replicas whose id stays are kept."""

    def pick(self, model: str, exclude: list[int] | None = None) -> int | None:
        """Least outstanding requests among healthy replicas serving `model`, not in
        `exclude`; ties go round robin. Counts the request as outstanding on the
        chosen replica (call `release` when it ends). None when there is none."""

    def release(self, index: int) -> None:
        """Ends one outstanding request on a replica."""

    def set_healthy(self, index: int, healthy: bool) -> None: ...
    def is_healthy(self, index: int) -> bool: ...
    def outstanding(self, index: int) -> int: ...
    def has_model(self, model: str) -> bool:
        """True when any replica (healthy or not) serves `model`."""

    def healthy_count(self) -> int: ...

def patch_request(body: bytes, model: str | None, include_usage: bool) -> bytes:
    """Changes a JSON request body in place of a re-encode: sets the top-level
    `"model"` (when `model` is given) and `stream_options.include_usage: true`
    (when `include_usage`), splicing only those values. Raises ValueError when the
    body is not a JSON object."""

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
