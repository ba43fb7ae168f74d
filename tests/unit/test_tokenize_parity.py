"""_core.ModelTokenizer against the Python `tokenizers` library and Jinja2 set
up as Hugging Face sets it up: the ids and prompts vLLM would produce.

Skipped unless `tokenizers` and `jinja2` are installed (they are not llmgw
dependencies). LLMGW_PARITY_DIRS (os.pathsep-separated model directories)
adds real tokenizers to the encode check.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmgw import _core

FIXTURE = Path(__file__).parents[2] / "rust" / "tests" / "fixtures" / "tiny-bpe"

TEXTS = [
    "",
    "Hello world",
    "Hello  world   with   runs of spaces \n\n\t tabs",
    "<|begin_of_text|>special<|eot_id|> tokens <|im_start|>inside",
    "numbers 1234567 3.14159 and 2024-07-26",
    "def f(x):\n    return x ** 2  # code\n",
    "Les élèves étudient à l'école. 東京は日本の首都です。 🙂👍🏽",
    "It's what they'd've said, won't they? I'M SHOUTING",
    "   leading and trailing   ",
    "\r\n\r\nwindows line ends\r\n",
]


def dirs() -> list[Path]:
    extra = os.environ.get("LLMGW_PARITY_DIRS", "")
    return [FIXTURE, *(Path(p) for p in extra.split(os.pathsep) if p)]


@pytest.mark.parametrize("model_dir", dirs(), ids=str)
def test_encode_matches_python_tokenizers(model_dir: Path) -> None:
    ours = _core.ModelTokenizer.from_dir(str(model_dir))
    ref = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in [*TEXTS, " ".join(TEXTS) * 50]:
        for special in (True, False):
            assert ours.encode(text, special) == ref.encode(text, add_special_tokens=special).ids


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_encode_matches_on_any_text(text: str) -> None:
    ours, ref = fixture_pair()
    assert ours.encode(text, True) == ref.encode(text, add_special_tokens=True).ids


_PAIR: list[Any] = []


def fixture_pair() -> tuple[_core.ModelTokenizer, Any]:
    if not _PAIR:
        _PAIR.append(_core.ModelTokenizer.from_dir(str(FIXTURE)))
        _PAIR.append(tokenizers.Tokenizer.from_file(str(FIXTURE / "tokenizer.json")))
    return _PAIR[0], _PAIR[1]


def hf_render(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """What transformers' apply_chat_template renders (its Jinja2 setup)."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
    config = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    return env.from_string(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=config["bos_token"]["content"],
        eos_token=config["eos_token"],
    )


def vllm_messages(messages: list[dict[str, Any]], parts: bool) -> list[dict[str, Any]]:
    """vLLM's normalisation: text parts only, joined unless the template loops
    over content; tool-call arguments parsed."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if isinstance(m.get("content"), list):
            texts = [p["text"] for p in m["content"] if p.get("type") == "text"]
            m["content"] = (
                [{"type": "text", "text": t} for t in texts] if parts else "\n".join(texts)
            )
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        out.append(m)
    return out


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "A?"},
        {"role": "assistant", "content": "B."},
        {"role": "user", "content": "Les élèves 東京 🙂"},
    ],
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "two"},
            ],
        }
    ],
]

TOOL_TURN = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "1",
                "type": "function",
                "function": {
                    "name": "get",
                    "arguments": '{"city": "Zürich", "days": [1, 2], "a": {}}',
                },
            }
        ],
    },
]


# The Llama-style fixture template has no tool calls; only ChatML renders TOOL_TURN.
CASES = [(n, i, m) for n in ("default", "chatml")
         for i, m in enumerate([*CONVERSATIONS, TOOL_TURN]) if n == "chatml" or m is not TOOL_TURN]


@pytest.mark.parametrize(("name", "case", "messages"), CASES, ids=lambda v: str(v) if not isinstance(v, list) else "")
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_matches_hf_rendering(
    name: str, case: int, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    config = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    template = next(t["template"] for t in config["chat_template"] if t["name"] == name)
    # from_dir takes the "default" template; chatml goes through a copy of the
    # directory with chat_template.jinja, which takes precedence.
    ours = fixture_pair()[0] if name == "default" else chatml_tokenizer(template)
    body = json.dumps({"model": "m", "messages": messages}).encode()
    expected = hf_render(
        template, vllm_messages(messages, parts=name == "chatml"), add_generation_prompt
    )
    assert ours.render_chat(body, add_generation_prompt) == expected
    if add_generation_prompt:
        _, ref = fixture_pair()
        assert ours.tokens(body, True) == ref.encode(expected, add_special_tokens=False).ids


_CHATML: dict[str, _core.ModelTokenizer] = {}


def chatml_tokenizer(template: str) -> _core.ModelTokenizer:
    if "t" not in _CHATML:
        d = Path(tempfile.mkdtemp(prefix="llmgw-chatml-"))
        (d / "tokenizer.json").write_bytes((FIXTURE / "tokenizer.json").read_bytes())
        (d / "chat_template.jinja").write_text(template)
        _CHATML["t"] = _core.ModelTokenizer.from_dir(str(d))
    return _CHATML["t"]
