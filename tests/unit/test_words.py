"""Tracked text says why, never when: no counted work sessions, issue numbers or branch talk.

Code, comments, docs, test names and file names describe the product; the order in which the
work was done belongs to the commit messages. Every file git tracks is searched (bench/results/
excepted: run records keep the command they ran), and each hit is reported as `path:line`.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.tree import ROOT, tracked

EXCEPT = ("bench/results/",)
"""Path prefixes not searched."""

# The words are put together from parts so that this file does not match its own pattern.
_SESSION = "sess" + "ion"
_ISSUE = "iss" + "ue"
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
             "|twelfth|[a-z]+teenth|twent[a-z-]*|thirt[a-z-]*")
CHRONOLOGY = re.compile(
    rf"\b({_ORDINALS}) {_SESSION}|\b{_SESSION} ?[0-9]+|\b{_ISSUE} [0-9]+\b|on this bra" + "nch",
    re.IGNORECASE,
)
"""What the acceptance's `git grep -niE` looks for: ordinal sessions, numbered sessions,
numbered issues, and talk of the branch the work was done on."""


def tracked_files() -> list[Path]:
    """Every file git tracks in this checkout that is still on disk, less `EXCEPT`."""
    names = [n for n in tracked() if not n.startswith(EXCEPT)]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def hits(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of `text` that names work by its order."""
    return [(i, line) for i, line in enumerate(text.splitlines(), 1) if CHRONOLOGY.search(line)]


def test_the_pattern_finds_what_it_is_for() -> None:
    found = [f"the twenty-fifth {_SESSION}", f"{_SESSION}25.json", f"{_ISSUE.capitalize()} 5's target",
             "fixed on this bra" + "nch", f"the Thirteenth {_SESSION}"]
    assert all(hits(t) for t in found), found
    kept = ["an agent's stream session", f"a {_SESSION} cookie", f"the {_ISSUE} tracker",
            "HTTP/2 streams", "a branch of the tree", "first byte"]
    assert not any(hits(t) for t in kept), kept


def test_no_tracked_text_names_work_by_its_order() -> None:
    found = []
    for path in tracked_files():
        rel = path.relative_to(ROOT).as_posix()
        if CHRONOLOGY.search(rel):
            found.append(f"{rel}: the file's name")
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        text = data.decode("utf-8", "replace")
        found += [f"{rel}:{n}: {line.strip()[:120]}" for n, line in hits(text)]
    assert not found, ("say why, not when (the commit message keeps the history):\n"
                       + "\n".join(found))
