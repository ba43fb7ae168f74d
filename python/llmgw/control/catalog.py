"""The catalog: which models the cluster serves, and the profiles a replica of each can run with.

A model is declared in the `models:` section of `server.yaml` or added through
the admin API; both are decoded into the Structs here, so a model is validated the
same way wherever it comes from, and a bad field is reported with its path
(`$.models[0].profiles[1].gpu_count`): server.yaml's by the one loader
(`llmgw.config.file`, every fault at once), the admin API's by `load_models`.

Sizes are bytes, also written `80GiB`, `512MiB` or `24GB` (`llmgw.config.units`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from llmgw.config.units import Duration, Size, parse_size

Engine = Literal["vllm", "sglang", "llamacpp", "sim"]
Origin = Literal["local", "huggingface", "modelscope", "pypi", "url"]
NVLink = Literal["prefer", "require"]

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")]
"""Model and alias names as clients send them (`meta-llama/Llama-3.1-8B`, `gpt-4o`)."""
ProfileName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
GpuClass = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Replicas = Annotated[int, msgspec.Meta(ge=0, le=10_000)]
Seconds = Duration
Bytes = Size
"""Sizes as everywhere in server.yaml (`llmgw.config.units`): `80GiB`, `24GB` or bytes."""

_SIZE_FIELDS = ("gpu_memory", "memory")


def _with_sizes(section: object) -> object:
    """The raw section with `80GiB`-style sizes in profiles turned into bytes.

    Done on the raw data rather than with a custom msgspec type so that the
    Structs hold plain ints and encode anywhere without a hook.
    """
    if not isinstance(section, list):
        return section
    out: list[object] = []
    for i, m in enumerate(section):
        profiles = m.get("profiles") if isinstance(m, dict) else None
        if not isinstance(profiles, list):
            out.append(m)
            continue
        new_profiles: list[object] = []
        for j, p in enumerate(profiles):
            if isinstance(p, dict):
                p = dict(p)
                for key in _SIZE_FIELDS:
                    if isinstance(p.get(key), str):
                        try:
                            p[key] = parse_size(p[key])
                        except ValueError as e:
                            raise ValueError(f"{e} - at `$.models[{i}].profiles[{j}].{key}`") from e
            new_profiles.append(p)
        out.append({**m, "profiles": new_profiles})
    return out


class CatalogError(ValueError):
    """A catalog the control plane cannot use; the message is a sentence for the operator."""


class Source(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Where a model's weights come from: a path on the nodes or a repository, and its origin.

    The origin is kept (not only the resolved path) so that later work (a mirror,
    newer-weights detection) knows which registry to ask.
    """

    path: str | None = None
    """A file or directory on every node that may run the model."""
    repo: str | None = None
    """A repository (`Qwen/Qwen2.5-7B-Instruct`) or, for origin `pypi`, a package name."""
    revision: str | None = None
    origin: Origin | None = None
    """Defaults to `local` for a path and `huggingface` for a repository."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.repo is None):
            raise ValueError("a source names exactly one of `path` or `repo`")
        if self.origin is None:
            self.origin = "local" if self.path is not None else "huggingface"
        if self.path is not None and self.origin != "local":
            raise ValueError(f"a `path` source has origin local, not {self.origin}")


class Profile(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One way to run a replica: the engine, the GPUs it needs and how it is started."""

    name: ProfileName
    engine: Engine
    gpu_class: GpuClass | None = None
    """The GPUs it runs on, as inventories name them (`H100-80GB`); none for a CPU profile."""
    gpu_count: Annotated[int, msgspec.Meta(ge=0, le=64)] = 1
    gpu_memory: Bytes = 0
    """Memory needed on each of its GPUs."""
    nvlink: NVLink = "prefer"
    """For several GPUs: `require` places only on a set that is pairwise NVLink-connected."""
    cpu: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """CPU cores reserved on the node."""
    memory: Bytes = 0
    """Host memory reserved on the node."""
    node_labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Only nodes carrying all of these labels."""
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpu_class is None:
            # A CPU profile: gpu_count's default of 1 only makes sense with a class.
            self.gpu_count = 0
            if self.gpu_memory:
                raise ValueError(f"profile {self.name!r} sets gpu_memory but no gpu_class")
        elif self.gpu_count == 0:
            raise ValueError(
                f"profile {self.name!r} names gpu_class {self.gpu_class} with gpu_count 0; "
                "drop gpu_class for a CPU profile"
            )

    @property
    def uses_gpus(self) -> bool:
        """Whether the profile needs GPUs at all."""
        return self.gpu_count > 0

    def describe(self) -> str:
        """`2 x H100-80GB (70 GiB each)` or `CPU`, for operator messages."""
        if not self.uses_gpus:
            return "CPU"
        return f"{self.gpu_count} x {self.gpu_class} ({fmt_bytes(self.gpu_memory)} each)"


class Model(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A model the cluster serves: names, source, profiles in order of preference, and scale."""

    name: Name
    source: Source
    profiles: list[Profile]
    """Tried in order: a new replica gets the first profile some node can take."""
    aliases: list[Name] = msgspec.field(default_factory=list)
    min_replicas: Replicas = 1
    max_replicas: Replicas | None = None
    """Defaults to min_replicas (at least 1)."""
    scale_from_zero: bool = True
    """A request for the model when no replica is ready starts one and waits for it."""
    scale_up_timeout: Seconds = 300.0
    """How long such a request waits for a replica to become ready."""

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError(f"model {self.name!r} has no profile; give at least one")
        names = [p.name for p in self.profiles]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"model {self.name!r} repeats profile {', '.join(dup)}")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"model {self.name!r} has max_replicas {self.max_replicas} "
                f"below min_replicas {self.min_replicas}"
            )
        if self.name in self.aliases:
            raise ValueError(f"model {self.name!r} lists its own name as an alias")

    @property
    def ceiling(self) -> int:
        """The most replicas the model may have."""
        if self.max_replicas is not None:
            return self.max_replicas
        return max(self.min_replicas, 1)

    def clamp(self, replicas: int) -> int:
        """`replicas` held to min_replicas..ceiling."""
        return min(max(replicas, self.min_replicas), self.ceiling)

    def profile(self, name: str) -> Profile | None:
        """The profile called `name`, or None."""
        return next((p for p in self.profiles if p.name == name), None)


class Catalog:
    """The validated set of models, looked up by name or alias."""

    def __init__(self, models: Sequence[Model]) -> None:
        """Raises CatalogError when two models share a name or an alias."""
        self.models: tuple[Model, ...] = tuple(sorted(models, key=lambda m: m.name))
        self._by_name: dict[str, Model] = {}
        for m in self.models:
            for n in (m.name, *m.aliases):
                other = self._by_name.get(n)
                if other is not None:
                    raise CatalogError(
                        f"the name {n!r} is used by both model {other.name!r} and model "
                        f"{m.name!r}; a name or alias must belong to one model"
                    )
                self._by_name[n] = m

    def __iter__(self) -> Iterator[Model]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def get(self, name: str) -> Model | None:
        """The model called `name`, or whose alias it is; None when there is none."""
        return self._by_name.get(name)


class _Section(msgspec.Struct):
    # A wrapper so that msgspec's paths read `$.models[0]...`, as in server.yaml.
    models: list[Model]


def load_models(section: object, where: str = "server.yaml") -> Catalog:
    """Validates the raw `models:` list (from YAML or JSON); raises CatalogError naming the field.

    `where` names the document in the message (`configuration file /etc/llmgw/server.yaml`).
    """
    if section is None:
        section = []
    try:
        parsed = msgspec.convert({"models": _with_sizes(section)}, _Section, strict=True)
    except (msgspec.ValidationError, ValueError) as e:
        raise CatalogError(f"the models in {where} are invalid: {e}") from e
    try:
        return Catalog(parsed.models)
    except CatalogError as e:
        text = str(e)
        raise CatalogError(
            f"the models in {where} are invalid: {text[:1].lower()}{text[1:]}"
        ) from e


def load_from_server(raw: Mapping[str, Any], where: str = "server.yaml") -> Catalog:
    """The catalog from a whole raw `server.yaml` mapping (its `models:` key, absent = none)."""
    return load_models(raw.get("models"), where)


def fmt_bytes(n: int) -> str:
    """`70 GiB`, `79.6 GiB`, `512 MiB`: sizes in operator messages."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            text = f"{v:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{n} B"
