"""The whole server.yaml: one Struct whose fields are its sections, and the one loader.

`llmgw gateway`, `llmgw server`, `llmgw up` and `llmgw config check` read the file here, so a
misspelt section, a bad duration or an unknown key is refused alike by all of them, each fault
said with its path (`$.gateway.timeouts.idle: ...`). The sections themselves are defined where
their readers are: `gateway` in `config/gateway.py`, `control_plane` in `control/settings.py`,
`models` in `control/catalog.py`.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import yaml

from llmgw.control.catalog import Catalog, CatalogError, Model
from llmgw.control.settings import Settings

from .check import as_written, check, describe
from .gateway import ConfigError, GatewayConfig


class ServerFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole `server.yaml`: one field per section, each optional."""

    gateway: GatewayConfig = msgspec.field(default_factory=GatewayConfig)
    """What `llmgw gateway` serves: its listener, replicas, timeouts, routing."""
    control_plane: Settings = msgspec.field(default_factory=Settings)
    """What `llmgw server` runs with: retention, leadership, the agents and the fleet."""
    models: list[Model] = msgspec.field(default_factory=list)
    """The models the control plane places on its nodes (more are added with `llmgw ctl`)."""

    def __post_init__(self) -> None:
        try:
            Catalog(self.models)  # a name or alias used twice is refused here, with both models
        except CatalogError as e:
            # Said at `$.models` (msgspec's form of a path, which the check reads back).
            text = str(e)
            raise ValueError(f"{text[:1].lower()}{text[1:]} - at `$.models`") from e


SECTIONS = tuple(f.encode_name for f in msgspec.structs.fields(ServerFile))


def read_server_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw mapping of `server.yaml`, not yet checked."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {p}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"configuration file {p} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"configuration file {p} must hold a mapping (gateway: ...), "
                          f"not {type(raw).__name__}")
    return raw


def check_server(raw: dict[str, Any], where: str) -> ServerFile:
    """`raw` as a ServerFile; raises ConfigError with every fault, `where` naming the document.

    A section left empty (`gateway:` with nothing under it) is the section's defaults.
    """
    present = {k: v for k, v in raw.items() if not (v is None and k in SECTIONS)}
    parsed, errors = check(present, ServerFile)
    if parsed is None:
        raise ConfigError(said(where, errors), errors)
    return parsed


def said(where: str, errors: list[str]) -> str:
    """The operator's message for `errors` found in `where`: one a line."""
    if len(errors) == 1:
        return f"{where} is invalid: {errors[0]}"
    return f"{where} has {len(errors)} errors:\n" + "\n".join(f"  {e}" for e in errors)


def load_server_file(path: str | os.PathLike[str]) -> ServerFile:
    """Reads and checks `server.yaml`; raises ConfigError naming the file and each fault."""
    return check_server(read_server_yaml(path), f"configuration file {Path(path)}")


def load_or_defaults(path: str | os.PathLike[str] | None) -> ServerFile:
    """The file at `path` checked, or every default when there is none."""
    return ServerFile() if path is None else load_server_file(path)


# -- `llmgw config defaults` ---------------------------------------------------------------

HEADER = """\
# server.yaml with every setting at its default (`llmgw config defaults`).
# Durations: 250ms, 30s, 5m, 2h, 7d (or a sum, 1h30m) or a number of seconds.
# Sizes: a number of bytes, or KB MB GB TB (powers of 1000), KiB MiB GiB TiB (of 1024).
# `llmgw config check FILE` checks a file and names every fault by its path.
"""
WIDTH = 96


def defaults_yaml() -> str:
    """Every section with every default, commented, as YAML a user can start from."""
    return HEADER + "\n".join(_struct_lines(ServerFile(), 0)) + "\n"


def _struct_lines(obj: msgspec.Struct, depth: int) -> list[str]:
    pad = "  " * depth
    docs = _field_docs(type(obj))
    lines: list[str] = []
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        doc = docs.get(f.name)
        if doc:
            lines += [pad + "# " + line for line in textwrap.wrap(doc, WIDTH - len(pad) - 2)]
        if isinstance(value, msgspec.Struct):
            lines.append(f"{pad}{f.encode_name}:")
            lines += _struct_lines(value, depth + 1)
            continue
        lines.append(f"{pad}{f.encode_name}: {_scalar(as_written(value, f.type))}")
        shape = _struct_in(f.type)
        if shape is not None:  # none by default: its form, commented, to fill in
            item = typing.get_origin(f.type) is list
            lines += [f"{pad}# {line}" for line in
                      [f"{f.encode_name}:", *_template(shape, 1, item)]]
    return lines


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct of a field typed `S | None` or `list[S]`, else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin is list or (origin in (typing.Union, types.UnionType) and len(args) == 1):
        inner = args[0]
        if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
            return inner
    return None


def _template(cls: type[msgspec.Struct], depth: int, item: bool) -> list[str]:
    """Every field of `cls` at its default, a required one with what it takes; as one entry of a
    list (`- `) when `item`."""
    lines: list[str] = []
    for f in msgspec.structs.fields(cls):
        lead = "  " * depth if not item else "  " * (depth - 1) + ("- " if not lines else "  ")
        shape = _struct_in(f.type) or (f.type if isinstance(f.type, type)
                                       and issubclass(f.type, msgspec.Struct) else None)
        if f.required and shape is not None:
            lines.append(f"{lead}{f.encode_name}:")
            listed = typing.get_origin(f.type) is list
            lines += _template(shape, depth + 1 + int(listed), listed)
        elif f.required:
            lines.append(f"{lead}{f.encode_name}:   # required: {describe(f.type)}")
        else:
            default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
            if isinstance(default, msgspec.Struct):
                default = msgspec.to_builtins(default)
            lines.append(f"{lead}{f.encode_name}: {_scalar(as_written(default, f.type))}")
    return lines


def _scalar(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, width=10**6)
    return text.removesuffix("\n").removesuffix("\n...")


_SENTENCE = re.compile(r"^(.+?[^.]\.)(?:\s|$)", re.S)


def _field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it in the class body), its first sentence,
    with Python's None said as YAML's null."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            text = " ".join(after.value.value.split())
            m = _SENTENCE.match(text)
            first = re.sub(r"\bNone\b", "null", m.group(1) if m else text)
            docs[node.target.id] = first.rstrip(".") + "."
    return docs
