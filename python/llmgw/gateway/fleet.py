"""What the control plane's snapshot says about routing: the replicas it placed and the catalog's models.

Pure bookkeeping, no I/O: `diff_replicas` tells `ReplicaSet.update` which replicas
came and went, and `Catalog` holds the models a client may ask for (configured
endpoints and aliases, then the catalog's names and aliases) and which of them
may be started on demand (scale from zero, see `gateway.wake`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmgw.protocol.wire import ModelEntry, ReplicaEntry


@dataclass
class ReplicaDiff:
    """How the placed replicas change from one snapshot to the next."""

    added: list[ReplicaEntry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """Ids, in the order they were held."""
    clashes: list[str] = field(default_factory=list)
    """Published ids that a configured endpoint already has (the endpoint wins)."""


def diff_replicas(held: Mapping[str, ReplicaEntry], published: Iterable[ReplicaEntry],
                  reserved: set[str]) -> ReplicaDiff:
    """The replicas to add and remove so that `held` becomes `published`.

    An entry whose id is held with other values (url, model, engine key, KV
    endpoints) is removed and added again: the engine behind it is another one, and
    its connections, health and key must not carry over. A repeated id counts once
    (its first entry); ids in `reserved` (the configured endpoints) are left out.
    """
    out = ReplicaDiff()
    seen: set[str] = set()
    for e in published:
        if e.id in seen:
            continue
        seen.add(e.id)
        if e.id in reserved:
            out.clashes.append(e.id)
            continue
        old = held.get(e.id)
        if old is None:
            out.added.append(e)
        elif old != e:
            out.removed.append(e.id)
            out.added.append(e)
    out.removed.extend(rid for rid in held if rid not in seen or rid in reserved)
    return out


class Catalog:
    """The models this gateway answers for: its configuration's, then the control plane's."""

    def __init__(self, served: Iterable[str], aliases: Mapping[str, str]) -> None:
        self._static_served = set(served)
        self._static_aliases = dict(aliases)
        self.aliases: dict[str, str] = dict(aliases)
        """Client-visible name -> the name replicas serve; configured aliases win over the catalog's."""
        self.models: dict[str, ModelEntry] = {}
        """The catalog's models by name (empty without a control plane that places)."""
        self._created: dict[str, int] = {}
        self.objects: dict[str, dict[str, Any]] = {}
        """`/v1/models` objects by id."""
        self.body = b""
        """The encoded `/v1/models` answer."""
        self._render(set())

    def load(self, models: list[ModelEntry], placed: Iterable[str]) -> None:
        """Takes a snapshot's models; `placed` are the models its replicas serve."""
        self.models = {m.name: m for m in models}
        aliases: dict[str, str] = {}
        for m in models:
            for a in m.aliases:
                aliases.setdefault(a, m.name)
        aliases.update(self._static_aliases)
        self.aliases = aliases
        self._render(set(placed))

    def target(self, name: str) -> str:
        """The served name a client's model name stands for."""
        return self.aliases.get(name, name)

    def wakeable(self, target: str) -> ModelEntry | None:
        """The catalog entry of a model that may be started on demand, else None."""
        m = self.models.get(target)
        return m if m is not None and m.scale_from_zero else None

    def _render(self, placed: set[str]) -> None:
        names = sorted(self._static_served | placed | set(self.models) | set(self.aliases))
        now = int(time.time())
        for n in names:
            self._created.setdefault(n, now)
        self.objects = {n: {"id": n, "object": "model", "created": self._created[n], "owned_by": "llmgw"}
                        for n in names}
        self.body = msgspec.json.encode({"object": "list", "data": list(self.objects.values())})
