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



@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        (["ctl", "usage", "export", "--format", "json"], "usage: llmgw ctl usage export",
         "llmgw ctl usage export: error: unrecognized arguments: --format json"),
        (["ctl", "orgs", "list", "--bogus"], "usage: llmgw ctl orgs list",
         "llmgw ctl orgs list: error: unrecognized arguments: --bogus"),
        (["version", "--bogus"], "usage: llmgw version", "llmgw version: error: unrecognized arguments: --bogus"),
    ],
)
def test_an_unknown_option_is_refused_by_its_own_command(argv: list[str], usage: str, error: str) -> None:
    # argparse alone answers with the top-level usage (`llmgw [-h] COMMAND ...`), which does
    # not list the options of the command that was typed.
    r = subprocess.run(
        [sys.executable, "-m", "llmgw", *argv], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert r.stderr.startswith(usage), r.stderr
    assert r.stderr.rstrip().endswith(error), r.stderr
