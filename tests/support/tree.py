"""The repository as git tracks it: what the layout, words and docs tests read."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The clone's root."""


def tracked(*pathspec: str) -> list[str]:
    """Paths git tracks under `pathspec` (all of them when empty), relative to `ROOT`.

    The tests run from a clone (CI makes a fresh one), so a tree git cannot list is an error
    to report, not a reason to check nothing."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *pathspec], cwd=ROOT, check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise AssertionError(f"cannot list the tracked files of {ROOT} with git ({e}); "
                             "run the tests from a git clone") from e
    return [p for p in out.decode().split("\0") if p]
