"""Placement: bin packing, spreading, multi-GPU sets, NVLink, classes, memory, and explain."""

from __future__ import annotations

from collections.abc import Sequence

from inline_snapshot import snapshot

from llmgw.control.capacity import Capacity
from llmgw.control.catalog import Model
from llmgw.control.inventory import Node, Replica
from llmgw.control.placement import BinPacking, explain, headroom
from tests.support.inventory import A100, GiB, gpus, model, node, profile, replica, where


def place(
    m: Model, nodes: list[Node], replicas: Sequence[Replica] = ()
) -> tuple[str, str, tuple[int, ...]] | None:
    return where(BinPacking().place(m, Capacity(nodes, replicas)))


def test_the_fullest_node_that_fits_comes_first() -> None:
    m = model("m", profile(mem=30 * GiB))
    other = model("other", profile(mem=60 * GiB))
    # b already runs something on GPU 0, so it has less room left than a.
    nodes = [node("a", 2), node("b", 2)]
    assert place(m, nodes, [replica("o", other, "b", [0])]) == ("default", "b", (1,))
    # On one node, the GPU with the least room that still fits: 50 GiB free beats 80.
    assert place(
        m, [node("a", 2)], [replica("o", model("o", profile(mem=30 * GiB)), "a", [1])]
    ) == ("default", "a", (1,))


def test_replicas_of_a_model_spread_before_they_pack() -> None:
    m = model("m", profile(mem=10 * GiB))
    nodes = [node("a", 8), node("b", 1)]
    # a is emptier, and b already holds one: the second replica still goes to a.
    assert place(m, nodes, [replica("r1", m, "b")]) == ("default", "a", (0,))
    # Only when every node holds one does a node get a second.
    assert place(m, nodes, [replica("r1", m, "b"), replica("r2", m, "a")]) == ("default", "b", (0,))
    # A draining replica is on its way out and does not count.
    assert place(m, nodes, [replica("r1", m, "b", state="draining")]) == ("default", "b", (0,))


def test_spreading_outranks_the_profile_order() -> None:
    m = model("m", profile("h100", mem=40 * GiB), profile("a100", cls=A100, mem=30 * GiB))
    nodes = [node("h", 2), node("x", 2, A100)]
    assert place(m, nodes) == ("h100", "h", (0,))
    assert place(m, nodes, [replica("r1", m, "h")]) == ("a100", "x", (0,))


def test_a_multi_gpu_replica_stays_on_one_node() -> None:
    m = model("m", profile(count=4, mem=70 * GiB))
    other = model("o", profile(count=1, mem=70 * GiB))
    # a and b have 3 usable GPUs each (6 in all); neither can take 4.
    held = [replica("x", other, "a", [0]), replica("y", other, "b", [0])]
    assert place(m, [node("a", 4), node("b", 4)], held) is None
    assert place(m, [node("a", 4), node("b", 4), node("c", 4)], held) == (
        "default",
        "c",
        (0, 1, 2, 3),
    )


def test_an_nvlink_connected_set_is_chosen_when_there_is_one() -> None:
    m = model("m", profile(count=2, mem=40 * GiB))
    # Two islands {0,1} and {2,3}; GPU 1 is in use, so only {2,3} is linked and free.
    n = node("a", gpus=gpus("a", 4, islands=[[0, 1], [2, 3]]))
    held = [replica("x", model("o", profile(mem=60 * GiB)), "a", [1])]
    assert place(m, [n], held) == ("default", "a", (2, 3))
    # A node with a linked set wins over a fuller one without.
    flat = node("b", gpus=gpus("b", 2, free=[50 * GiB, 50 * GiB]))
    assert place(m, [n, flat], held) == ("default", "a", (2, 3))


def test_without_a_linked_set_prefer_falls_back_and_require_refuses() -> None:
    n = node("a", gpus=gpus("a", 4, islands=[[0, 1], [2, 3]]))
    held = [replica("x", model("o", profile(mem=60 * GiB)), "a", [i]) for i in (1, 3)]
    prefer = model("m", profile(count=2, mem=40 * GiB))
    require = model("m", profile(count=2, mem=40 * GiB, nvlink="require"))
    assert place(prefer, [n], held) == ("default", "a", (0, 2))
    assert place(require, [n], held) is None
    # A node that reports no NVLink at all cannot satisfy require either.
    assert place(require, [node("b", gpus=gpus("b", 2))]) is None
    assert place(prefer, [node("b", gpus=gpus("b", 2))]) == ("default", "b", (0, 1))


def test_classes_memory_and_the_drivers_free_memory() -> None:
    m = model("m", profile(cls=A100, mem=30 * GiB))
    assert place(m, [node("h", 8)]) is None
    assert place(m, [node("h", 8), node("x", 2, A100)]) == ("default", "x", (0,))
    big = model("big", profile(mem=81 * GiB))
    assert place(big, [node("h", 8)]) is None
    # Another process holds 50 GiB on GPU 0: the driver's free memory rules.
    busy = node("h", gpus=gpus("h", 2, free=[30 * GiB, 80 * GiB]))
    assert place(model("m", profile(mem=40 * GiB)), [busy]) == ("default", "h", (1,))


def test_only_ready_nodes_take_replicas() -> None:
    m = model("m", profile())
    for state in ("cordoned", "draining", "unreachable", "lost"):
        assert place(m, [node("a", state=state)]) is None  # type: ignore[arg-type]
    assert place(m, [node("a", state="cordoned"), node("b")]) == ("default", "b", (0,))


def test_simulated_gpus_run_only_the_simulator() -> None:
    n = node("s", gpus=gpus("s", 2, simulated=True))
    assert place(model("m", profile(engine="vllm")), [n]) is None
    assert place(model("m", profile(engine="sim")), [n]) == ("default", "s", (0,))


def test_cpu_profiles_use_cores_and_host_memory() -> None:
    m = model("m", profile("cpu", cls=None, engine="llamacpp", cpu=8, memory=16 * GiB))
    small = node("small", 0, gpus=(), cpu_cores=4.0)
    assert place(m, [small]) is None
    assert place(m, [small, node("big", 0, gpus=())]) == ("cpu", "big", ())


def test_explain_says_why_on_each_node() -> None:
    m = model(
        "llama",
        profile("h100x2", count=2, mem=70 * GiB, nvlink="require", node_labels={"zone": "a"}),
    )
    other = model("o", profile(mem=20 * GiB))
    nodes = [
        node("a-cordoned", state="cordoned", labels={"zone": "a"}),
        node("b-lost", state="lost"),
        node("c-a100", 4, A100, labels={"zone": "a"}),
        node("d-one", 1, labels={"zone": "a"}),
        node("e-full", 4, labels={"zone": "a"}),
        node("f-flat", gpus=gpus("f-flat", 4), labels={"zone": "a"}),
        node("g-zone-b", labels={"zone": "b"}),
        node("h-ok", 4, labels={"zone": "a"}),
        node("i-holds", 4, labels={"zone": "a"}),
        node(
            "j-sim", gpus=gpus("j-sim", 4, islands=[range(4)], simulated=True), labels={"zone": "a"}
        ),
        node("k-engines", labels={"zone": "a"}, engines=("sim", "llamacpp")),
        node("l-cpu", 0, gpus=(), labels={"zone": "a"}),
        node("m-unreachable", state="unreachable"),
    ]
    held = [replica(f"x{i}", other, "e-full", [i]) for i in range(3)] + [
        replica("r1", m, "i-holds", [0, 1])
    ]
    said = [(v.node, v.ok, [r.code for r in v.reasons], v.message) for v in explain(m, nodes, held)]
    assert said == snapshot(
        [
            (
                "a-cordoned",
                False,
                ["placement.node_cordoned"],
                "Node a-cordoned is cordoned: it keeps its replicas but takes no new ones.",
            ),
            (
                "b-lost",
                False,
                ["placement.node_lost"],
                (
                    "Node b-lost is lost: its agent stopped reporting long enough that its replicas "
                    "were placed elsewhere."
                ),
            ),
            (
                "c-a100",
                False,
                ["placement.wrong_gpu_class"],
                "Node c-a100 has no H100-80GB GPU for profile h100x2 (it has 4 x A100-40GB).",
            ),
            (
                "d-one",
                False,
                ["placement.too_few_gpus"],
                "Node d-one has 1 H100-80GB GPU, and profile h100x2 needs 2.",
            ),
            (
                "e-full",
                False,
                ["placement.gpu_memory"],
                (
                    "Node e-full lacks GPU memory for profile h100x2: it needs 70 GiB free on each of "
                    "2 H100-80GB GPUs, and its best 2 have 80 GiB and 60 GiB free."
                ),
            ),
            (
                "f-flat",
                False,
                ["placement.no_nvlink_set"],
                (
                    "Node f-flat has no set of 2 H100-80GB GPUs that are pairwise NVLink-connected "
                    "with 70 GiB free on each, and profile h100x2 requires NVLink."
                ),
            ),
            (
                "g-zone-b",
                False,
                ["placement.label_missing"],
                "Node g-zone-b lacks the label zone=a that profile h100x2 asks for.",
            ),
            (
                "h-ok",
                True,
                ["placement.fits"],
                (
                    "Node h-ok can take a replica of llama with profile h100x2 on GPUs 0, 1 (pairwise "
                    "NVLink-connected)."
                ),
            ),
            (
                "i-holds",
                False,
                ["placement.spreading"],
                (
                    "Node i-holds could take profile h100x2 but already holds 1 replica of llama, and "
                    "other nodes that can take one hold fewer."
                ),
            ),
            (
                "j-sim",
                False,
                ["placement.simulated_gpus"],
                (
                    "Node j-sim has simulated GPUs, which run only the sim engine, and profile h100x2 "
                    "uses vllm."
                ),
            ),
            (
                "k-engines",
                False,
                ["placement.engine_unavailable"],
                "Node k-engines cannot run engine vllm for profile h100x2 (it runs llamacpp, sim).",
            ),
            (
                "l-cpu",
                False,
                ["placement.no_gpu"],
                "Node l-cpu has no GPU, and profile h100x2 needs 2 x H100-80GB (70 GiB each).",
            ),
            (
                "m-unreachable",
                False,
                ["placement.node_unreachable"],
                "Node m-unreachable is unreachable: its agent has stopped reporting.",
            ),
        ]
    )


def test_explain_lists_every_profile_that_was_tried() -> None:
    m = model("m", profile("h100", mem=90 * GiB), profile("a100", cls=A100, mem=30 * GiB))
    said = [v.message for v in explain(m, [node("a", 1)], [])]
    assert said == snapshot(
        [
            (
                "Node a lacks GPU memory for profile h100: it needs 90 GiB free on 1 H100-80GB GPU, "
                "and its best has 80 GiB free. Node a has no A100-40GB GPU for profile a100 (it has 1 "
                "x H100-80GB)."
            ),
        ]
    )


def test_explain_for_a_cpu_profile() -> None:
    m = model("m", profile("cpu", cls=None, engine="llamacpp", cpu=8, memory=16 * GiB))
    other = model("o", profile("cpu", cls=None, engine="llamacpp", cpu=2, memory=500 * GiB))
    nodes = [node("a", 0, gpus=(), cpu_cores=4.0), node("b", 0, gpus=()), node("c", 0, gpus=())]
    said = [v.message for v in explain(m, nodes, [replica("x", other, "b", [])])]
    assert said == snapshot(
        [
            "Node a has 4 CPU cores free, and profile cpu needs 8.",
            "Node b has 12 GiB of memory free, and profile cpu needs 16 GiB.",
            "Node c can take a replica of m with profile cpu on its CPU.",
        ]
    )


def test_headroom_counts_what_fits_and_where() -> None:
    m = model("m", profile(count=2, mem=70 * GiB))
    h = headroom(m, [node("a", 4), node("b", 2)], [replica("r1", m, "a", [0, 1])], limit=10)
    assert (h.count, h.by_node) == (2, {"a": 1, "b": 1})
    assert headroom(m, [node("a", 4), node("b", 2)], [], limit=1).count == 1
    # Two 40 GiB replicas share an 80 GiB GPU pair.
    h = headroom(model("s", profile(mem=40 * GiB)), [node("a", 2)], [], limit=99)
    assert (h.count, h.by_node) == (4, {"a": 4})
