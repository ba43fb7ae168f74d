"""Every `llmgw ctl NOUN VERB` that the product's messages and docs tell a user to run exists.

Errors end with the command that helps (`list them with llmgw ctl projects list`); a hint
naming a noun or verb that `llmgw ctl` does not have sends the user into a usage error
instead, and so does an option the command does not take (`--scope org:acme` where the
command takes `--in acme`). This reads every mention in the package's sources, its alerting
rules, the READMEs and docs/ and checks it against the command table that builds the argparse
tree.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.cli.ctl.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
MENTION = re.compile(r"llmgw ctl ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")
END = re.compile(r"[`)\n#\"']")
"""Where a mention's words end: a closing backtick or parenthesis, a comment, a quote."""
GLOBAL = {"--server", "--token", "--token-file", "--data-dir", "--timeout", "--json", "--help"}


def _verbs() -> dict[str, set[str]]:
    verbs: dict[str, set[str]] = {}
    for c in COMMANDS:
        verbs.setdefault(c.noun, set()).add(c.verb)
    return verbs


def _options() -> dict[tuple[str, str], set[str]]:
    """(noun, verb) -> the options it takes; a noun alone is its own command or its list."""
    opts: dict[tuple[str, str], set[str]] = {}
    for c in COMMANDS:
        taken = opts.setdefault((c.noun, c.verb), set(GLOBAL))
        taken.update(a.flag for a in c.args if a.flag.startswith("-"))
        if c.output == "csv":
            taken.add("--output")
    for (noun, verb), taken in list(opts.items()):
        if verb == "list":
            opts.setdefault((noun, ""), taken)
    return opts


def _bad(text: str, verbs: dict[str, set[str]]) -> list[str]:
    bad = []
    options = _options()
    for m in MENTION.finditer(text):
        noun, verb = m.group(1), m.group(2)
        if noun not in verbs:
            bad.append(f"{m.group(0)!r}: no noun {noun!r}")
            continue
        if verb is not None and verb not in verbs[noun] and "" not in verbs[noun]:
            # A noun with its own command (`ctl explain-placement MODEL`) takes an argument there.
            bad.append(f"{m.group(0)!r}: {noun} has no verb {verb!r}")
            continue
        command = (noun, verb if verb in verbs[noun] else "")
        rest = text[m.end():]
        end = END.search(rest)
        for option in OPTION.findall(rest[:end.start() if end else len(rest)]):
            if option not in options.get(command, GLOBAL):
                bad.append(f"{m.group(0)!r}: takes no {option}")
    return bad


def test_every_mentioned_ctl_command_exists() -> None:
    verbs = _verbs()
    files = [*sorted((ROOT / "python" / "llmgw").rglob("*.py")), ROOT / "python" / "llmgw" / "alerts.yaml",
             ROOT / "README.md", ROOT / "bench" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    found = 0
    bad: list[str] = []
    for f in files:
        text = f.read_text()
        found += len(MENTION.findall(text))
        bad += [f"{f.relative_to(ROOT)}: {b}" for b in _bad(text, verbs)]
    assert found > 40  # the scan reads what it should
    assert bad == []


def test_the_check_finds_a_wrong_noun_and_verb() -> None:
    verbs = _verbs()
    assert _bad("list them with `llmgw ctl project list`", verbs) == ["'llmgw ctl project list': no noun 'project'"]
    assert _bad("`llmgw ctl keys delete`", verbs) == ["'llmgw ctl keys delete': keys has no verb 'delete'"]
    assert _bad("`llmgw ctl explain-placement big` and `llmgw ctl keys revoke`", verbs) == []


def test_the_check_finds_an_option_the_command_does_not_take() -> None:
    verbs = _verbs()
    assert _bad("with `llmgw ctl members list --scope org:acme`", verbs) == [
        "'llmgw ctl members list': takes no --scope"]
    assert _bad("(llmgw ctl keys list --in acme/ml/chat) and `llmgw ctl usage --by project` "
                "and `llmgw ctl explain-placement --model m` and `llmgw ctl nodes --json`",
                verbs) == []
