"""The wheel users install is the source on main, and nothing else ("Built wheel ==
tagged source; no .pth; pinned deps"): LiteLLM 1.82.7 and 1.82.8 shipped a `.pth` file that
ran at every interpreter start, in wheels whose files were not the repository's.

Built as the Dockerfile builds it (`maturin build --release --locked`), then read as pip would
install it."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "llmgw/_core.abi3.so"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([str(Path(sys.executable).parent / "maturin"), "build", "--release", "--locked",
                            "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                           check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [path] = out.glob("llmgw-*.whl")
    with zipfile.ZipFile(path) as z:
        yield z


def _tracked(prefix: str) -> set[str]:
    listed = subprocess.run(["git", "ls-files", "-z", prefix], cwd=ROOT, capture_output=True, check=True)
    return {p for p in listed.stdout.decode().split("\0") if p}


def _dist_info(z: zipfile.ZipFile) -> str:
    [info] = {n.split("/")[0] for n in z.namelist() if n.split("/")[0].endswith(".dist-info")}
    return info


@pytest.mark.timeout(1300)
def test_the_wheel_holds_the_tracked_package_files_byte_for_byte_and_no_pth(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert not [n for n in names if n.endswith(".pth")]
    info = _dist_info(wheel)
    assert {n.split("/")[0] for n in names} == {"llmgw", info}
    package = {n for n in names if n.startswith("llmgw/")}
    source = {p.removeprefix("python/") for p in _tracked("python/llmgw")}
    # Every file git tracks, and besides them only the Rust core built from rust/.
    assert package == source | {CORE}, (sorted(package - source - {CORE}), sorted(source - package))
    differ = [n for n in source if wheel.read(n) != (ROOT / "python" / n).read_bytes()]
    assert not differ, differ


@pytest.mark.timeout(1300)
def test_the_record_covers_every_file_with_its_hash(wheel: zipfile.ZipFile) -> None:
    info = _dist_info(wheel)
    rows = list(csv.reader(io.StringIO(wheel.read(f"{info}/RECORD").decode())))
    recorded = {name: digest for name, digest, _ in rows}
    assert set(recorded) == set(wheel.namelist())
    for name, digest in recorded.items():
        if name == f"{info}/RECORD":
            assert digest == ""
            continue
        algo, _, value = digest.partition("=")
        want = base64.urlsafe_b64encode(hashlib.new(algo, wheel.read(name)).digest()).rstrip(b"=").decode()
        assert algo == "sha256" and value == want, name


@pytest.mark.timeout(1300)
def test_the_wheel_runs_only_the_llmgw_command_and_pins_what_pyproject_pins(wheel: zipfile.ZipFile) -> None:
    info = _dist_info(wheel)
    entry = wheel.read(f"{info}/entry_points.txt").decode().split()
    assert entry == ["[console_scripts]", "llmgw=llmgw.cli.main:main"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *(d for group in project["optional-dependencies"].values() for d in group)]
    assert pins and all(d.count("==") == 1 and not d.endswith("==") for d in pins), \
        [d for d in pins if "==" not in d]
    meta = wheel.read(f"{info}/METADATA").decode().splitlines()
    required = {line.removeprefix("Requires-Dist: ").split(" ;")[0] for line in meta
                if line.startswith("Requires-Dist: ")}
    assert required == set(pins)


@pytest.mark.timeout(1300)
def test_the_wheels_core_is_the_one_its_python_expects(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    wheel.extractall(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import llmgw, llmgw._core as c; "
            "print(llmgw.__file__); print(c.__version__)")
    probe = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    where, version = probe.stdout.split()
    assert Path(where).is_relative_to(tmp_path)
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert version == cargo
    meta = wheel.read(f"{_dist_info(wheel)}/METADATA").decode().splitlines()
    assert f"Version: {cargo}" in meta
