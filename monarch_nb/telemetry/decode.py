"""Reading an event back: one decoded JSON line -> the typed event it describes, checked.

A reader of a damaged or foreign log skips a line that is no event (and counts it) rather than
failing later in a fold or a plot: every field is checked against its annotation, once per class
(cached), so reading a long log stays cheap. Unknown kinds (from a newer writer) load as
``UnknownEvent``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
import typing
from typing import Any

from .events import _KINDS, Event, UnknownEvent


def event_from_dict(data: Any) -> Event:
    """The event a decoded JSON line describes.

    Raises ``ValueError`` with a short reason (it names the kind and the field) when ``data``
    is no event: not an object, no string ``kind``, no finite number ``t``, or a known kind
    with a missing or mistyped field. A reader of a damaged log skips such a line and counts
    it rather than failing later in a fold or a plot. Fields this version does not know are
    ignored; unknown kinds load as ``UnknownEvent``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {_json_type(data)}, not an object")
    kind = data.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError("no 'kind'" if kind is None else f"'kind' is a JSON {_json_type(kind)}, not a string")
    t = data.get("t")
    if t is None:
        raise ValueError(f"{kind}: no 't'")
    if not _is_number(t) or not _fits_a_float(t) or not math.isfinite(t):
        raise ValueError(f"{kind}: 't' is {_short(t)}, not a time in seconds")
    cls = _KINDS.get(kind)
    if cls is None:
        rest = {k: v for k, v in data.items() if k not in ("t", "kind")}
        return UnknownEvent(t=float(t), raw_kind=kind, data=rest)
    checks = _field_checks(cls)
    missing = [name for name in _required_fields(cls) if name not in data]
    if missing:
        raise ValueError(f"{kind}: missing {', '.join(missing)}")
    for name, accepted, hint in checks:
        if accepted is not None and name in data and not _accepts(accepted, data[name]):
            raise ValueError(f"{kind}: {name} is {_short(data[name])}, expected {_type_name(hint)}")
    return cls(**{k: v for k, v in data.items() if k in _field_names(cls)})


@functools.cache
def _field_names(cls: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@functools.cache
def _required_fields(cls: type[Event]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@functools.cache
def _field_checks(cls: type[Event]) -> tuple[tuple[str, tuple[type, ...] | None, Any], ...]:
    """Per field: the Python types a decoded JSON value may have (``None``: anything), from
    its annotation, worked out once per class so that reading a long log stays cheap."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _accepted_types(hints[f.name]), hints[f.name]) for f in dataclasses.fields(cls))


def _accepted_types(hint: Any) -> tuple[type, ...] | None:
    """Shallow: the scalar types, ``X | None`` and the container itself (not its items)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        accepted: list[type] = []
        for arg in typing.get_args(hint):
            part = _accepted_types(arg)
            if part is None:
                return None
            accepted.extend(part)
        return tuple(accepted)
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (int, float)
    base = typing.get_origin(hint) or hint
    return (base,) if base in (int, bool, str, list, dict) else None


def _accepts(accepted: tuple[type, ...], value: Any) -> bool:
    # JSON true/false are Python bools, which are ints: a number field must not take them.
    if type(value) is bool:
        return bool in accepted
    if float in accepted and isinstance(value, int) and not _fits_a_float(value):
        return False  # a 400-digit "seconds" would overflow every sum and mean over it
    return isinstance(value, accepted)


def _fits_a_float(value: int | float) -> bool:
    return not isinstance(value, int) or abs(value) <= sys.float_info.max


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(typing.get_origin(hint) or hint, "__name__", str(hint))


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _short(value: Any) -> str:
    text = repr(value)
    return f"{_json_type(value)} {text if len(text) <= 30 else text[:27] + '...'}"


def event_kinds() -> dict[str, type[Event]]:
    return dict(_KINDS)
