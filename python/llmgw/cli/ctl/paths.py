"""Scope arguments of `llmgw ctl`: one path form everywhere, checked before anything is sent.

An organization, team or project is named by its path (`acme`, `acme/ml`, `acme/ml/chat`)
or its ID; a scope (of a membership) by the path of any of the three, whose number of
names says which. The admin API takes scopes as `team:acme/ml`: that mapping happens here,
so no command asks a person to write it.
"""

from __future__ import annotations

import re
from typing import Literal

from llmgw.store.names import NAME_PATTERN, NAME_RULE, is_id

Level = Literal["org", "team", "project"]

LEVELS: tuple[Level, ...] = ("org", "team", "project")
"""By depth: a path of one name is an org, of two a team, of three a project."""

FORM: dict[str, str] = {"org": "ORG", "team": "ORG/TEAM", "project": "ORG/TEAM/PROJECT",
                        "scope": "ORG, ORG/TEAM or ORG/TEAM/PROJECT"}
EXAMPLE: dict[str, str] = {"org": "acme", "team": "acme/ml", "project": "acme/ml/chat",
                           "scope": "acme/ml"}
WHAT: dict[str, str] = {"org": "organization", "team": "team", "project": "project"}
_PREFIX: dict[str, str] = {"org": "org_", "team": "team_", "project": "proj_"}
_NAME = re.compile(NAME_PATTERN)
_ORDINAL = ("first", "second", "third", "fourth")


class BadPath(ValueError):
    """A scope argument that is not of the form asked for; the message is a sentence."""


def _id_level(text: str) -> Level | None:
    if not is_id(text):
        return None
    return next((lvl for lvl in LEVELS if text.startswith(_PREFIX[lvl])), None)


def _names_problem(names: list[str]) -> str | None:
    """Why a path's names are not names, or None when each follows the name rule."""
    for i, name in enumerate(names):
        where = _ORDINAL[i] if i < len(_ORDINAL) else f"{i + 1}th"
        if not name:
            return f"its {where} name is empty"
        if not _NAME.match(name) or ".." in name or is_id(name):
            return f"{name!r} is not a name ({NAME_RULE})"
    return None


def _refuse(label: str, text: str, what: str, why: str, form: str, ids: bool) -> BadPath:
    alt = ""
    if ids:
        alt = (", or an org, team or project ID" if form == "scope"
               else f", or the {WHAT[form]}'s ID ({_PREFIX[form]}...)")
    return BadPath(f"{label}: {text!r} does not name {what}: {why}; give {FORM[form]}, "
                   f"like {EXAMPLE[form]}{alt}")


def reference(level: Level, text: str, label: str) -> str:
    """An existing organization, team or project: its ID, or its path as given."""
    what = _a(level)
    got = _id_level(text)
    if got == level:
        return text
    if got is not None:
        raise _refuse(label, text, what, f"it is {_a(got)}'s ID", level, True)
    why = _path_problem(text.split("/"), level)
    if why is not None:
        raise _refuse(label, text, what, why, level, True)
    return text


def new(level: Level, text: str, label: str) -> tuple[str, str]:
    """(parent path, name) of an organization, team or project to create; no parent for an org."""
    what = f"a new {WHAT[level]}"
    if _id_level(text) is not None:
        raise _refuse(label, text, what, "an ID names something that exists", level, False)
    names = text.split("/")
    why = _path_problem(names, level)
    if why is not None:
        raise _refuse(label, text, what, why, level, False)
    return "/".join(names[:-1]), names[-1]


def scope(text: str, label: str) -> str:
    """A membership scope as the admin API takes it: `org:acme`, `team:acme/ml`,
    `project:acme/ml/chat`, or an org, team or project ID as it is."""
    if _id_level(text) is not None:
        return text
    kind, colon, rest = text.partition(":")
    if colon and kind in LEVELS:
        better = rest if rest else EXAMPLE["scope"]
        raise BadPath(f"{label}: write the scope as its path, {better}, not {text}: the number "
                      f"of names says which (ORG, ORG/TEAM or ORG/TEAM/PROJECT)")
    names = text.split("/")
    why = _names_problem(names)
    if why is None and len(names) > len(LEVELS):
        why = f"it has {len(names)} names, and a project, the deepest scope, has 3"
    if why is not None:
        raise _refuse(label, text, "a scope", why, "scope", True)
    return f"{LEVELS[len(names) - 1]}:{text}"


def unprefixed(text: str) -> str:
    """`acme/ml` for a scope written `team:acme/ml`; other text as it is."""
    kind, colon, rest = text.partition(":")
    return rest if colon and kind in LEVELS and rest else text


def _a(level: Level) -> str:
    return f"a{'n' if level == 'org' else ''} {WHAT[level]}"


def _path_problem(names: list[str], level: Level) -> str | None:
    """Why `names` is not the path of one at `level`, or None when it is."""
    why = _names_problem(names)
    want = LEVELS.index(level) + 1
    if why is None and len(names) != want:
        plural = "s" if len(names) != 1 else ""
        why = f"it has {len(names)} name{plural}, and {_a(level)}'s path has {want}"
    return why
