"""Finding the route of a request: `{param}` paths, percent-decoded segments, 404 vs 405.

Built once from the route table. A path is split on `/` *before* its segments
are percent-decoded, so `%2F` inside a segment is part of a name (and then
refused by the handler's name rule), never a way to reach another route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from .route import Route


class BadPath(ValueError):
    """The request path cannot be read (bad percent-encoding or not UTF-8)."""


@dataclass(frozen=True)
class _Pattern:
    parts: tuple[str | None, ...]
    """Each segment: the literal text, or None for a `{param}`."""
    names: tuple[str, ...]
    """The `{param}` names, in order."""
    methods: dict[str, Route]


@dataclass(frozen=True)
class Match:
    """What a request path matched: the route for its method (or None) and the methods allowed."""

    route: Route | None
    params: dict[str, str]
    allowed: tuple[str, ...]


def split(path: str) -> tuple[str | None, ...]:
    """A table path's segments, None for each `{param}`."""
    return tuple(None if s.startswith("{") and s.endswith("}") else s for s in path.split("/"))


class Router:
    """The table, compiled for matching; raises ValueError on a table that is not well formed."""

    def __init__(self, routes: Sequence[Route]) -> None:
        by_path: dict[tuple[str | None, ...], _Pattern] = {}
        for r in routes:
            if not r.path.startswith("/") or r.path != r.path.strip() or "//" in r.path:
                raise ValueError(f"route path {r.path!r} must start with / and have no empty segment")
            parts = split(r.path)
            names = tuple(s[1:-1] for s in r.path.split("/") if s.startswith("{"))
            if len(set(names)) != len(names) or any(not n.isidentifier() for n in names):
                raise ValueError(f"route path {r.path!r} repeats a parameter or names one badly")
            pat = by_path.get(parts)
            if pat is None:
                pat = by_path[parts] = _Pattern(parts, names, {})
            elif pat.names != names:
                # Two routes on one path shape must call their parameters alike, or
                # the same URL would bind different names depending on its method.
                raise ValueError(f"route {r.method} {r.path} names its parameters unlike "
                                 f"the other routes on that path ({pat.names})")
            if r.method in pat.methods:
                raise ValueError(f"route {r.method} {r.path} is in the table twice")
            pat.methods[r.method] = r
        # A literal segment beats a parameter at the same place (/usage/export
        # before /usage/{id}), earlier segments first: the order is well defined
        # whatever order the areas were concatenated in.
        self._patterns = sorted(by_path.values(),
                                key=lambda p: (len(p.parts), [s is None for s in p.parts]))

    def match(self, method: str, raw_path: str) -> Match | None:
        """The route for `method` on `raw_path` (still percent-encoded); None when no path matches."""
        raw = raw_path.split("/")
        decoded: list[str] | None = None
        for pat in self._patterns:
            if len(pat.parts) != len(raw):
                continue
            if decoded is None:
                decoded = [_decode(s) for s in raw]
            values = []
            for want, got in zip(pat.parts, decoded, strict=True):
                if want is None:
                    if not got:
                        break
                    values.append(got)
                elif want != got:
                    break
            else:
                return Match(pat.methods.get(method), dict(zip(pat.names, values, strict=True)),
                             tuple(sorted(pat.methods)))
        return None


def _decode(segment: str) -> str:
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError as e:
        raise BadPath("the request path is not percent-encoded UTF-8") from e
