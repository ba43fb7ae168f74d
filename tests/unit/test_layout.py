"""No hand-written Python or Rust file over 800 lines: past that, a file holds more than one role.

The files counted are the tracked `*.py` and `*.rs` under python/, rust/, tests/ and bench/
(`git ls-files`, so build output and a scratch file in the working tree do not count), less
the gRPC stubs that `proto/generate.py` writes and the test fixtures. A file over the limit
is split by role, each role a module named for what it holds (as control/placement.py is
split into capacity, constraints and the policy), not cut at an arbitrary line.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from tests.support.tree import ROOT, tracked

LIMIT = 800
SOURCES = ("python", "rust", "tests", "bench")
GENERATED = ("python/llmgw/v1/*_pb2*.py",)
"""Made by proto/generate.py (`make generate`), never edited by hand."""


def _hand_written(paths: Iterable[str]) -> list[str]:
    """The paths, less generated files and anything under a `fixtures/` folder."""
    return [p for p in paths
            if p.endswith((".py", ".rs"))
            and not any(fnmatch(p, g) for g in GENERATED)
            and "fixtures" not in PurePosixPath(p).parts[:-1]]


def _tracked() -> list[str]:
    return tracked(*SOURCES)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_hand_written_python_or_rust_file_is_over_800_lines() -> None:
    sizes = {p: _lines(ROOT / p) for p in _hand_written(_tracked()) if (ROOT / p).is_file()}
    over = sorted((n, p) for p, n in sizes.items() if n > LIMIT)
    assert not over, (
        f"{len(over)} file(s) over {LIMIT} lines; split each by role into modules named for "
        "what they hold:\n" + "\n".join(f"  {p}: {n} lines" for n, p in reversed(over)))


def test_generated_stubs_and_fixtures_are_not_counted() -> None:
    assert _hand_written([
        "python/llmgw/v1/agent_pb2.py",
        "python/llmgw/v1/agent_pb2_grpc.py",
        "rust/tests/fixtures/kv/gen.py",
        "python/llmgw/v1/__init__.py",
        "python/llmgw/control/fleet.py",
        "rust/src/lib.rs",
        "bench/README.md",
    ]) == ["python/llmgw/v1/__init__.py", "python/llmgw/control/fleet.py", "rust/src/lib.rs"]
