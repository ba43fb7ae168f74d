"""The documents stay true to the tree: the layout names every package, links lead somewhere,
and every test the reliability matrix cites exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "llmgw"
RUST = ROOT / "rust" / "src"
DOCS = ROOT / "docs"

_RUST_HEADING = "### `rust/src/`"


def _architecture() -> tuple[str, str]:
    """docs/architecture.md split at its `rust/src/` table: (before, from there on)."""
    text = (DOCS / "architecture.md").read_text()
    python, found, rust = text.partition(_RUST_HEADING)
    assert found, f"docs/architecture.md has no {_RUST_HEADING!r} section"
    return python, rust


def test_the_layout_names_every_python_package() -> None:
    named, _ = _architecture()
    packages = sorted(p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")
                      if p.parent != PACKAGE)
    missing = [p for p in packages if f"`{p}/`" not in named]
    assert not missing, f"docs/architecture.md's layout lacks a line for {missing}"


def test_the_layout_names_everything_in_rust_src() -> None:
    _, named = _architecture()
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in RUST.iterdir()
                     if p.is_dir() or p.suffix == ".rs")
    missing = [e for e in entries if f"`{e}`" not in named]
    assert not missing, f"docs/architecture.md's rust/src/ table lacks a line for {missing}"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_docs_leads_to_a_file() -> None:
    broken = []
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for target in _LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL or an anchor on the same page
                path = (doc.parent / target.split("#", 1)[0]).resolve()
                if not path.exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{n}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


# `path.py::name`, `path.py::name[params]`, or `::name` for another test of the row's last file.
_CITED = re.compile(r"`((?:[a-z0-9_]+/)*test_[a-z0-9_]+\.py)?(?:::([A-Za-z0-9_]+))?(?:\[[^\]`]*\])?`")


def test_every_test_the_reliability_matrix_cites_exists() -> None:
    missing = []
    for n, line in enumerate((DOCS / "reliability.md").read_text().splitlines(), 1):
        last = None
        for path, name in _CITED.findall(line):
            last = path or last
            if not (path or name):
                continue
            where = f"docs/reliability.md:{n}"
            if last is None:
                missing.append(f"{where}: ::{name} names no file before it")
                continue
            source = ROOT / "tests" / last
            if not source.is_file():
                missing.append(f"{where}: tests/{last}")
            elif name and not re.search(rf"^\s*(async )?def {name}\(", source.read_text(), re.MULTILINE):
                missing.append(f"{where}: tests/{last}::{name}")
    assert not missing, "cited but not there:\n" + "\n".join(missing)
