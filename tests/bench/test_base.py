"""`--base REV` (bench/base.py): another commit's gateway beside today's, only with the same Rust."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench.base import BaseError, env, export
from bench.report import Round
from bench.runner import fold
from bench.scenarios import _figures

from tests.bench.test_harness import _res


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits: the second changes rust/ and the package's marker."""
    r = tmp_path / "repo"
    (r / "python" / "llmgw").mkdir(parents=True)
    (r / "rust").mkdir()
    _git(r.parent, "init", "-q", str(r))
    for i in (1, 2):
        (r / "python" / "llmgw" / "__init__.py").write_text(f'MARK = "commit {i}"\n')
        (r / "rust" / "lib.rs").write_text(f"// version {i}\n")
        _git(r, "add", "-A")
        _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"c{i}")
    return r


def test_a_base_with_the_same_rust_loads_its_own_python_and_this_builds_core(repo: Path, tmp_path: Path) -> None:
    path, commit = export(repo, "HEAD", tmp_path / "out")
    assert commit == _git(repo, "rev-parse", "HEAD")
    probe = subprocess.run([sys.executable, "-c", "import llmgw; print(llmgw.MARK, llmgw.__file__)"],
                           env=env(path), check=True, capture_output=True, text=True).stdout
    assert probe.startswith("commit 2 ") and str(tmp_path / "out") in probe
    assert list((path / "llmgw").glob("_core*")), "this build's Rust core goes beside the base's python/"


def test_a_base_whose_rust_differs_is_refused(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(BaseError, match=r"rust/ at [0-9a-f]{12} differs from the working tree \(rust/lib.rs\)"):
        export(repo, "HEAD~1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_uncommitted_rust_counts_as_a_difference(repo: Path, tmp_path: Path) -> None:
    (repo / "rust" / "lib.rs").write_text("// edited, not committed\n")
    with pytest.raises(BaseError, match="differs from the working tree"):
        export(repo, "HEAD", tmp_path / "out")


def test_a_revision_that_is_no_commit_says_so(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(BaseError, match=r"--base 'no-such-rev' is not a commit of .*; give a revision"):
        export(repo, "no-such-rev", tmp_path / "out")


def test_the_figures_say_todays_gateway_over_the_base() -> None:
    rps = {("direct", 1): 9000, ("llmgw", 1): 1100, ("llmgw-base", 1): 1000,
           ("direct", 2): 9000, ("llmgw", 2): 1210, ("llmgw-base", 2): 1100}
    rounds = [Round(round=r, target=t, concurrency=32, stream=False, result=_res(n),
                    server_cpu=None, server_rss_mb=None, upstream_cpu=None)
              for (t, r), n in rps.items()]
    out = _figures("throughput", rounds, fold(rounds, ["direct", "llmgw", "llmgw-base"]), [32])
    assert out["llmgw_over_llmgw_base_rps_c32"] == pytest.approx(1155 / 1050)
    assert out["llmgw_over_llmgw_base_rps_paired_median_c32"] == pytest.approx(1.1)
    assert "llmgw_keys_over_llmgw_rps_c32" not in out
