"""The shared-prefix multi-turn chat workload of the `routing` scenario.

A few long system prompts are shared by many users; each user holds one
conversation that grows turn by turn (turn k sends the system prompt, the first
k user messages and the k - 1 assistant replies before them). Everything is
drawn from one seed, so every target of a run, in every round, receives
byte-identical request bodies in the same per-user order.

The assistant replies are written by the workload, not taken from the answers:
the bodies are then fixed before the run (the oracle can tokenize and mirror
exactly what each replica will see) and do not depend on which target answered.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import msgspec

MODEL = "sim-model"

# Plain lowercase words: with the tiny BPE fixture (a 420-entry vocabulary) this
# comes to about one token per two characters.
_TEXT = (
    "the a of to and in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up "
    "use your how said an each she which do their time if will way about many then them "
    "write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little "
    "only round man year came show every good me give our under name very through just "
    "form sentence great think say help low line differ turn cause much mean before move "
    "right boy old too same tell does set three want air well also play small end put home "
    "read hand port large spell add even land here must big high such follow act why ask "
    "men change went light kind "
)
WORDS = tuple(_TEXT.split())


@dataclass(frozen=True)
class WorkloadSpec:
    """The workload's shape; sizes are in words (about 3.5 tiny-BPE tokens each).

    The defaults follow the public shared-prefix benchmarks (SGLang's
    `generated-shared-prefix`: 64 groups of 16 prompts over a 2,048-token system
    prompt; llm-d's inference-perf `shared_prefix`: 32 groups of 32, 2,048-token
    prompt, 256-token question and answer), scaled down to what two cores can
    drive in a bounded run, and made multi-turn: many more system prompts than
    replicas, each shared by several users whose conversations grow by a
    question (~100 tokens) and an answer (~250 tokens) per turn. Unlike those
    benchmarks, groups are not all alike: how many users share a prompt follows
    a Zipf law (`tenant_skew`) and conversations differ in length
    (`turns` +- `turns_spread`), because real tenants and chats do, and equal
    groups would make any sticky policy balanced by construction.
    bench/README.md says why each figure is what it is.
    """

    seed: int = 7
    users: int = 64
    turns: int = 6  # per user on average: drawn uniformly from turns +- turns_spread (at least 1)
    turns_spread: int = 4
    tenant_skew: float = 1.0  # Zipf exponent of prompt popularity; 0: user u gets prompt u mod S
    system_prompts: int = 16
    system_words: int = 600
    user_words: int = 30
    reply_words: int = 75
    max_tokens: int = 16
    model: str = MODEL


@dataclass
class Workload:
    """The generated requests: `bodies[u][k]` is user u's turn k+1, as sent (JSON bytes)."""

    spec: WorkloadSpec
    systems: list[str]
    user_system: list[int]  # the system prompt each user shares
    bodies: list[list[bytes]] = field(default_factory=list)

    @property
    def requests(self) -> int:
        """Requests in the whole workload."""
        return sum(len(b) for b in self.bodies)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build(spec: WorkloadSpec) -> Workload:
    """The workload for `spec`: the same spec always gives the same bytes."""
    if min(spec.users, spec.turns, spec.system_prompts) < 1:
        raise ValueError("users, turns and system_prompts must be at least 1")
    if spec.turns_spread < 0 or spec.tenant_skew < 0:
        raise ValueError("turns_spread and tenant_skew must be at least 0")
    rng = random.Random(spec.seed)
    # Each system prompt opens with its own words: prompts that differ only after a common
    # preamble would share their first cache block, and a longest-prefix router would
    # then treat every prompt as one.
    systems = [_text(rng, spec.system_words) for _ in range(spec.system_prompts)]
    if spec.tenant_skew == 0:
        # User u shares system prompt u mod S: every prompt has users, in a fixed order.
        user_system = [u % spec.system_prompts for u in range(spec.users)]
    else:
        # Prompt i is drawn with weight 1 / (i + 1)^skew: prompt 0 is the busiest tenant,
        # and users arrive in a random order of tenants, as they would.
        weights = [1 / (i + 1) ** spec.tenant_skew for i in range(spec.system_prompts)]
        user_system = rng.choices(range(spec.system_prompts), weights, k=spec.users)
    lo = max(1, spec.turns - spec.turns_spread)
    user_turns = [rng.randint(lo, spec.turns + spec.turns_spread) for _ in range(spec.users)]
    bodies = []
    for u in range(spec.users):
        msgs: list[dict[str, str]] = [{"role": "system", "content": systems[user_system[u]]}]
        turns = []
        for k in range(user_turns[u]):
            # The user's name opens each of its messages, so no two users' turns coincide.
            msgs.append(
                {"role": "user", "content": f"User {u} asks: {_text(rng, spec.user_words)}"}
            )
            turns.append(_body(spec, msgs))
            msgs.append(
                {"role": "assistant", "content": f"Reply {k}: {_text(rng, spec.reply_words)}"}
            )
        bodies.append(turns)
    return Workload(spec=spec, systems=systems, user_system=user_system, bodies=bodies)


def _body(spec: WorkloadSpec, msgs: list[dict[str, str]]) -> bytes:
    # Streamed, so that time to first token is measured on every request.
    return msgspec.json.encode(
        {"model": spec.model, "messages": msgs, "max_tokens": spec.max_tokens, "stream": True}
    )


def messages(body: bytes) -> list[dict[str, str]]:
    """The messages of a body built here (for tests and the report)."""
    doc: dict[str, list[dict[str, str]]] = msgspec.json.decode(body)
    return doc["messages"]
