"""The `llmgw` command: every subcommand says what it does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmgw.cli.main import COMMANDS


@pytest.mark.parametrize("path", [p for p, _, _ in COMMANDS], ids=lambda p: " ".join(p))
def test_help_of_every_command(path: tuple[str, ...]) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llmgw", *path, "--help"], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    text = {p: t for p, t, _ in COMMANDS}[path]
    assert text[0].upper() + text[1:] in " ".join(r.stdout.split())


def test_gateway_without_replicas_says_what_to_do() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llmgw", "gateway"], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: no replica to route to; give --endpoint")
    assert "hint: `llmgw up`" in r.stderr


def test_version() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llmgw", "version"], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and r.stdout.startswith("llmgw ")
