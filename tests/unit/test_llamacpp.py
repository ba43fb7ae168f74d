"""The llama.cpp engine's pieces that need no model: where the GGUF comes from, the token count
for streamed usage, and which request fields reach llama-cpp-python."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from llmgw.engines.llamacpp.app import Body, Counter
from llmgw.engines.llamacpp.config import ModelSourceError, resolve_gguf

EOG = 99


def test_a_file_is_the_model(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_gguf(str(f)) == f


def test_a_package_assembles_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = types.ModuleType("tiny_model_gguf")
    pkg.assemble = lambda: tmp_path / "tiny.gguf"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiny_model_gguf", pkg)
    assert resolve_gguf("tiny-model-gguf") == tmp_path / "tiny.gguf"


def test_missing_package_says_what_to_install() -> None:
    with pytest.raises(ModelSourceError, match=r"no package no_such_model_gguf is installed; "
                                              r"install it \(pip install no-such-model-gguf\)"):
        resolve_gguf("no-such-model-gguf")


def test_a_package_that_is_no_model() -> None:
    with pytest.raises(ModelSourceError, match="package json has no assemble"):
        resolve_gguf("json")


class FakeLlama:
    def generate(self, tokens: list[int], **kw: object) -> Iterator[int]:
        yield from (5, 6, 7, EOG)


def test_counter_counts_prompt_and_sampled_tokens_without_the_end() -> None:
    llm = FakeLlama()
    counter = Counter(llm, lambda t: t == EOG)
    assert list(llm.generate([1, 2, 3, 4])) == [5, 6, 7, EOG]
    assert (counter.prompt, counter.completion) == (4, 3)
    assert list(llm.generate([1])) and (counter.prompt, counter.completion) == (1, 3)


def test_sampling_passes_what_the_request_sets() -> None:
    body = msgspec.json.decode(b'{"messages": [], "max_tokens": 9, "max_completion_tokens": 5, '
                               b'"temperature": 0, "n": 3}', type=Body)
    assert body.sampling() == {"max_tokens": 5, "temperature": 0}


def test_without_llama_cpp_both_commands_give_the_portable_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`llmgw up --engine llamacpp` and `llmgw engine llamacpp` without llama-cpp-python say how to
    install it, with the flags that build it for any AVX2 CPU (a native build can fault on a VM)."""
    import argparse

    from llmgw.cli import up
    from llmgw.engines.llamacpp import cli

    monkeypatch.setattr(up, "llamacpp_installed", lambda: False)
    assert up.run(argparse.Namespace(engine="llamacpp")) == 2
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    assert cli.run(argparse.Namespace()) == 2
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2
    for line in said:
        assert "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON\" " \
               "pip install 'llmgw[cpu]'" in line


def test_the_readme_and_the_makefile_build_with_the_flags_the_commands_print() -> None:
    """The portable flags are written in four places (the two errors' `INSTALL`, the two commands
    of docs/troubleshooting.md, the Makefile's wheel build): one changed alone would have a
    user, or CI, build llama.cpp differently from what the others say."""
    import re

    from llmgw.engines.llamacpp import INSTALL

    root = Path(__file__).resolve().parents[2]
    found = re.search(r'CMAKE_ARGS="([^"]+)"', INSTALL)
    assert found is not None
    flags = found.group(1)
    assert (root / "docs/troubleshooting.md").read_text().count(f'CMAKE_ARGS="{flags}"') == 2
    makefile = re.search(r"^LLAMA_CMAKE_ARGS := (.+)$", (root / "Makefile").read_text(), re.MULTILINE)
    assert makefile is not None
    # The Makefile may add flags for the machines it builds on (AVX, BMI2), never leave one out.
    assert set(flags.split()) <= set(makefile.group(1).split())


def test_load_evaluates_one_token_before_the_port_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that faults on its first evaluation must die at start, not on a client's request;
    the evaluation leaves no state behind for the first prompt."""
    from llmgw.engines.llamacpp.app import load
    from llmgw.engines.llamacpp.config import LlamaConfig

    calls: list[object] = []

    class Llama:
        def __init__(self, model_path: str, **kw: object) -> None:
            calls.append(("init", model_path))
            self._model = types.SimpleNamespace(vocab=object())

        def generate(self, tokens: object, *args: object, **kwargs: object) -> Iterator[int]:
            yield from ()

        def token_bos(self) -> int:
            return 2

        def eval(self, tokens: list[int]) -> None:
            calls.append(("eval", tokens))

        def reset(self) -> None:
            calls.append("reset")

    fake = types.ModuleType("llama_cpp")
    fake.Llama = Llama  # type: ignore[attr-defined]
    fake.llama_vocab_is_eog = lambda vocab, token: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    import faulthandler

    monkeypatch.setattr(faulthandler, "enable", lambda: calls.append("faulthandler"))
    app = load(LlamaConfig(model_path="/m.gguf", served_name="m"))
    # faulthandler first: a fault in the evaluation leaves a traceback in the engine's log.
    assert calls == [("init", "/m.gguf"), "faulthandler", ("eval", [2]), "reset"]
    assert app.name == "m"
