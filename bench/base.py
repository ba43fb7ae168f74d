"""`--base REV`: llmgw's gateway as it was at another commit, in the same rounds as the working tree's.

A change's speed is claimed as a ratio measured side by side in one run (docs/benchmarks.md),
so the code before the change runs beside the code after it: the target `llmgw-base` is
the plain gateway with the same arguments as `llmgw`, its Python from `git archive REV
python` and its Rust core this build's own. That holds only when `rust/` is the same at REV
as here, so a base whose Rust differs is refused rather than measured with the wrong core.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

NAME = "llmgw-base"
RUST = ("rust", "Cargo.toml", "Cargo.lock")
"""What builds `llmgw._core`: a base must have the same."""


class BaseError(Exception):
    """The base cannot be set up; the message says what to do."""


def _git(root: Path, *args: str) -> bytes:
    """git's output; BaseError with what git said when it fails."""
    r = subprocess.run(["git", "-C", str(root), *args], check=False, capture_output=True)
    if r.returncode != 0:
        raise BaseError(f"git {' '.join(args[:2])} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def export(root: Path, rev: str, into: Path) -> tuple[Path, str]:
    """Writes REV's `python/` under `into` with this build's `_core`; returns (the directory
    for PYTHONPATH, REV's full commit)."""
    try:
        commit = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
    except BaseError:
        commit = ""
    if not commit:
        raise BaseError(f"--base {rev!r} is not a commit of {root}; give a revision `git log` shows")
    changed = _git(root, "diff", "--name-only", commit, "--", *RUST).decode().split()
    if changed:
        files = ", ".join(changed[:5])
        raise BaseError(f"rust/ at {commit[:12]} differs from the working tree ({files}); the base would "
                        "run this build's Rust core. Measure a base whose Rust is the same, or build "
                        "both sides yourself")
    archive = _git(root, "archive", "--format=tar", commit, "python")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    pkg = into / "python" / "llmgw"
    import llmgw._core  # this build's, beside today's python/

    core = Path(llmgw._core.__file__)
    shutil.copy2(core, pkg / core.name)
    where = _loaded_from(into / "python")
    if not where.is_relative_to(into):
        raise BaseError(f"with PYTHONPATH={into / 'python'} llmgw still loads from {where}; the base "
                        "would measure today's code")
    return into / "python", commit


def env(path: Path) -> dict[str, str]:
    """The environment a base server starts with: its `python/` first on the path."""
    return {**os.environ, "PYTHONPATH": str(path)}


def _loaded_from(path: Path) -> Path:
    probe = subprocess.run([sys.executable, "-c", "import llmgw; print(llmgw.__file__)"],
                           env=env(path), check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        raise BaseError(f"the base's llmgw does not import: {probe.stderr.strip()[-400:]}")
    return Path(probe.stdout.strip()).resolve()
