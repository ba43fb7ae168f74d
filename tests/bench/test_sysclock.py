"""bench/tools/sysclock.c: the shim that makes clock reads system calls, for a bench run that
measures a host whose clock source has no user-space path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "bench" / "tools" / "sysclock.c"

# In the child: where the clock symbols resolve, and what the clocks say.
PROBE = r"""
import ctypes, time
libc = ctypes.CDLL(None)
spans = []
for line in open("/proc/self/maps"):
    if "sysclock" in line:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        spans.append((lo, hi))
def mine(name):
    at = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
    return any(lo <= at < hi for lo, hi in spans)
t0 = time.monotonic()
print(bool(spans), mine("clock_gettime"), mine("gettimeofday"), time.time(), time.monotonic() >= t0)
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "a C compiler is needed (the llama.cpp build needs one too)"
    out = tmp_path_factory.mktemp("sysclock") / "sysclock.so"
    subprocess.run([cc, "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE)],
                   check=True)
    return out


def _probe(preload: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_shim_takes_the_clock_symbols_and_tells_the_right_time(shim: Path) -> None:
    loaded, clock, tod, wall, monotonic = _probe(str(shim))
    assert (loaded, clock, tod, monotonic) == ("True", "True", "True", "True")
    assert abs(float(wall) - time.time()) < 5


def test_without_it_the_clock_is_the_c_librarys() -> None:
    loaded, clock, tod, _, _ = _probe(None)
    assert (loaded, clock, tod) == ("False", "False", "False")
