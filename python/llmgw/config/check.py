"""Checks raw YAML data against a msgspec Struct and reports every fault, not just the first.

msgspec stops at the first error, so the data is walked against the Struct's field types: an
unknown key, a missing one or a bad value each make one message, `$.path: what is wrong; what
to do`, and the walk goes on. Durations and sizes written as text (`30s`, `16MiB`) become
numbers on the way. A Struct's own checks (`__post_init__`, across its fields) run once its
fields are sound, so they never repeat a fault already said.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

from .units import (
    DURATION,
    DURATION_FORMS,
    SIZE,
    SIZE_FORMS,
    duration_seconds,
    duration_text,
    parse_size,
    size_text,
)

T = TypeVar("T")

_BAD = object()
"""What a walk returns for a value that did not pass."""
_AT = re.compile(r" - at `\$(.*)`$")
_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def check(raw: Any, cls: type[T], root: str = "$") -> tuple[T | None, list[str]]:
    """`raw` as a `cls`, and every fault found in it (the value is None when there is one)."""
    errors: list[str] = []
    value = _walk(raw, cls, root, errors, None)
    if errors:
        return None, errors
    try:
        return msgspec.convert(value, cls, strict=True), []
    except msgspec.ValidationError as e:  # a rule the walk does not know: as msgspec says it
        return None, [_from_msgspec(root, str(e))]


def join(path: str, key: object) -> str:
    """`path` one key deeper: `$.gateway.timeouts`, `$.gateway.aliases["a/b"]`."""
    text = str(key)
    return f"{path}.{text}" if _KEY.match(text) else f"{path}[{msgspec.json.encode(text).decode()}]"


def shown(value: object) -> str:
    """A value as an operator wrote it, cut short: `'30x'`, `-1`, `a mapping`."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _walk(value: Any, tp: Any, path: str, errors: list[str], default: Any) -> Any:
    """`value` checked against the annotation `tp`, its text units turned to numbers; faults
    go to `errors` and the result is then `_BAD`."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        unit = _unit_of(tp)
        if unit is not None and isinstance(value, str):
            return _unit_text(value, tp, unit, path, errors, default)
        return _leaf(value, tp, path, errors, default)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(members) < len(typing.get_args(tp)):
            return None
        if len(members) == 1:
            return _walk(value, members[0], path, errors, default)
        return _leaf(value, tp, path, errors, default)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _struct(value, tp, path, errors)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp)
        out = [_walk(v, item, f"{path}[{i}]", errors, None) for i, v in enumerate(value)]
        return _BAD if _BAD in out else out
    if origin is dict and isinstance(value, dict):
        key_type, item = typing.get_args(tp)
        before = len(errors)
        checked = {}
        for k, v in value.items():
            key = _leaf(k, key_type, join(path, k), errors, None)
            checked[key] = _walk(v, item, join(path, k), errors, None)
        return _BAD if len(errors) > before else checked
    return _leaf(value, tp, path, errors, default)


def _struct(value: Any, cls: type[msgspec.Struct], path: str, errors: list[str]) -> Any:
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    if not isinstance(value, dict):
        errors.append(f"{path}: {shown(value)} is not a mapping; write its keys under it, "
                      "one `key: value` a line")
        return _BAD
    before = len(errors)
    out: dict[str, Any] = {}
    for key, v in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            errors.append(_unknown(join(path, key), str(key), list(fields), path == "$"))
            continue
        default = field.default if field.default is not msgspec.NODEFAULT else None
        out[key] = _walk(v, field.type, join(path, key), errors, default)
    for name, field in fields.items():
        if field.required and name not in value:
            errors.append(f"{join(path, name)}: missing; add it ({describe(field.type)})")
    if len(errors) > before:
        return _BAD
    try:
        msgspec.convert(out, cls, strict=True)  # its own checks, across its fields
    except msgspec.ValidationError as e:
        errors.append(_from_msgspec(path, str(e)))
        return _BAD
    return out


def _unknown(path: str, key: str, known: list[str], top: bool) -> str:
    what = "section" if top else "key"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"{path}: no such {what}; did you mean `{close[0]}`?"
    if top:
        return f"{path}: no such section; the sections are {', '.join(known)}"
    return f"{path}: no such key; remove it (`llmgw config defaults` lists every key)"


def _leaf(value: Any, tp: Any, path: str, errors: list[str], default: Any,
          written: object = None) -> Any:
    try:
        msgspec.convert(value, tp, strict=True)
    except msgspec.ValidationError:
        said = shown(value if written is None else written)
        errors.append(f"{path}: {said} is not {describe(tp)}; {_advice(tp, default)}")
        return _BAD
    return value


def _unit_text(value: str, tp: Any, unit: str, path: str, errors: list[str], default: Any) -> Any:
    """A duration or size written as text, as a number of seconds or bytes."""
    number: float | None
    if unit == DURATION["unit"]:
        number = duration_seconds(value.strip())
    else:
        try:
            number = parse_size(value)
        except ValueError:
            number = None
    if number is None:
        forms = DURATION_FORMS if unit == DURATION["unit"] else SIZE_FORMS
        errors.append(f"{path}: {shown(value)} is not a {unit}; write {forms}"
                      + _default_said(tp, default))
        return _BAD
    return _leaf(number, tp, path, errors, default, value)


def _unit_of(tp: Any) -> str | None:
    for meta in typing.get_args(tp)[1:]:
        if isinstance(meta, msgspec.Meta) and meta.extra and "unit" in meta.extra:
            return str(meta.extra["unit"])
    return None


def _advice(tp: Any, default: Any) -> str:
    unit = _unit_of(tp) if typing.get_origin(tp) is typing.Annotated else None
    if unit == DURATION["unit"]:
        return f"write {DURATION_FORMS}{_default_said(tp, default)}"
    if unit == SIZE["unit"]:
        return f"write {SIZE_FORMS}{_default_said(tp, default)}"
    return f"give one{_default_said(tp, default)}"


def _default_said(tp: Any, default: Any) -> str:
    if default is None or isinstance(default, (msgspec.Struct, list, dict)):
        return ""
    return f" (the default is {as_written(default, tp)})"


def as_written(value: Any, tp: Any) -> Any:
    """`value` of the annotation `tp` as a person writes it in YAML: a duration as `30s`, a size
    as `16MiB`, anything else as it is."""
    unit = _unit_of(tp) if typing.get_origin(tp) is typing.Annotated else None
    if unit is None and typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and typing.get_origin(members[0]) is typing.Annotated:
            unit = _unit_of(members[0])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if unit == DURATION["unit"]:
        return duration_text(value)
    if unit == SIZE["unit"] and isinstance(value, int):
        return size_text(value)
    return value


def describe(tp: Any) -> str:
    """What a value of `tp` is, in words: `a whole number from 1 to 256`."""
    return _words(mi.type_info(tp))


def _words(t: mi.Type) -> str:
    if isinstance(t, mi.Metadata):
        unit = (t.extra or {}).get("unit")
        if unit in (DURATION["unit"], SIZE["unit"]):
            return f"a {unit}{_bounds(t.type, 's' if unit == DURATION['unit'] else ' bytes')}"
        return _words(t.type)
    if isinstance(t, mi.IntType):
        return "a whole number" + _bounds(t, "")
    if isinstance(t, mi.FloatType):
        return "a number" + _bounds(t, "")
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.StrType):
        return f"text matching {t.pattern}" if t.pattern else "text"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in t.values)
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.ListType):
        return f"a list of {_plural(_words(t.item_type))}"
    if isinstance(t, mi.DictType):
        return "a mapping"
    if isinstance(t, mi.StructType):
        return "a mapping"
    if isinstance(t, mi.UnionType):
        return " or ".join(_words(m) for m in t.types)
    return "a value of another kind"


def _plural(words: str) -> str:
    return words.removeprefix("a ").removeprefix("an ").replace("number", "numbers", 1) \
        if words.startswith(("a ", "an ")) else words


def _bounds(t: mi.IntType | mi.FloatType | mi.Type, unit: str) -> str:
    low = getattr(t, "ge", None)
    high = getattr(t, "le", None)
    above = getattr(t, "gt", None)
    below = getattr(t, "lt", None)
    if low is not None and high is not None:
        return f" from {low:g} to {high:g}{unit}"
    parts = []
    if above is not None:
        parts.append(f"above {above:g}{unit}")
    if low is not None:
        parts.append(f"at least {low:g}{unit}")
    if below is not None:
        parts.append(f"below {below:g}{unit}")
    if high is not None:
        parts.append(f"at most {high:g}{unit}")
    if not parts:
        return ""
    return (" of " if parts[0].startswith("at") else " ") + " and ".join(parts)


def _from_msgspec(path: str, message: str) -> str:
    """msgspec's `message` (a Struct's own check, at `path`) as `$.path: message`."""
    m = _AT.search(message)
    if m:
        path, message = path + m.group(1), message[: m.start()]
    return f"{path}: {message}"
