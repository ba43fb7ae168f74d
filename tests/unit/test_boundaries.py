"""Each package imports only what its `__init__.py` says it may (docs/conventions.md: one concern
per module, and the docstring's first paragraph says what the package must not import).

Read from the source, every `import` and `from ... import` at any depth, relative ones
resolved, so that a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llmgw

ROOT = Path(llmgw.__file__).parent

SHARED: tuple[str, ...] = ("llmgw.admin", "llmgw.agent", "llmgw.cli", "llmgw.control", "llmgw.engines",
                          "llmgw.gateway", "llmgw.store")
"""The roles: what the shared layer (net/, protocol/, secrets/) never imports."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "admin": ("llmgw.gateway",),
    "agent": ("llmgw.control", "llmgw.gateway", "llmgw.store"),
    "control": ("llmgw.gateway",),
    "engines": ("llmgw.admin", "llmgw.agent", "llmgw.control", "llmgw.gateway", "llmgw.store"),
    "engines/sim": ("llmgw.gateway", "llmgw.cli"),
    "gateway": ("llmgw.control", "llmgw.admin", "llmgw.store"),
    "net": SHARED,
    "protocol": SHARED,
    "secrets": SHARED,
    "store": ("llmgw.gateway", "llmgw.admin"),
}
"""Package -> the modules it must not import, as its `__init__.py` docstring says."""

LAZY_ONLY: dict[str, tuple[str, ...]] = {
    "engines/sim": ("llmgw._core",),
}
"""Package -> modules it may import only inside a function, never when it is imported itself
(the simulator runs without the Rust core unless a config names a real tokenizer)."""


def _package_of(path: Path) -> str:
    """The dotted package a file's relative imports start from."""
    dotted = ".".join(("llmgw", *path.relative_to(ROOT).with_suffix("").parts))
    return dotted.removesuffix(".__init__") if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _imports(source: str, package: str) -> list[tuple[str, int, bool]]:
    """(module imported, line, at module level) for every import in one file's source."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - child.level + 1] + ([base] if base else []))
                # `from . import x` names modules; `from .m import x` names what m holds.
                found.extend((base if child.module else f"{base}.{a.name}", child.lineno, top)
                             for a in child.names)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                continue  # for the type checker only: never runs
            else:
                visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), True)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _files(package: str) -> list[tuple[Path, list[tuple[str, int, bool]]]]:
    return [(p, _imports(p.read_text(), _package_of(p))) for p in sorted((ROOT / package).rglob("*.py"))]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_its_docstring_forbids(package: str) -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path, found in _files(package) for module, line, _ in found
           if any(_within(module, f) for f in FORBIDDEN[package])]
    assert not bad, f"{package}/ must not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(LAZY_ONLY))
def test_a_package_imports_some_modules_only_inside_functions(package: str) -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module} at module level"
           for path, found in _files(package) for module, line, top in found
           if top and any(_within(module, m) for m in LAZY_ONLY[package])]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_the_table_says_what_the_package_itself_says(package: str) -> None:
    # The rules above and the package's own docstring summary (its first paragraph) must not
    # drift apart: it names each package it must not import as `name/`, and each module it
    # imports only inside functions by its dotted name.
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    for module in FORBIDDEN[package]:
        assert f"{module.removeprefix('llmgw.')}/" in first, (package, module, first)
    for module in LAZY_ONLY.get(package, ()):
        assert module in first, (package, module, first)


def test_the_reader_finds_lazy_and_relative_imports_and_skips_type_checking_ones() -> None:
    # The walker itself: a forbidden import hidden in a function or spelled relatively is
    # found; one under TYPE_CHECKING is not (it never runs).
    src = ("from typing import TYPE_CHECKING\n"
           "from ...gateway import app\n"
           "from . import cache\n"
           "if TYPE_CHECKING:\n    from llmgw.cli import main\n"
           "def f():\n    import llmgw._core\n")
    got = _imports(src, "llmgw.engines.sim")
    assert ("llmgw.gateway", 2, True) in got
    assert ("llmgw.engines.sim.cache", 3, True) in got
    assert ("llmgw._core", 7, False) in got
    assert not any(_within(m, "llmgw.cli") for m, _, _ in got)
