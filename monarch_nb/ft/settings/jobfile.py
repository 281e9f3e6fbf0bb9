"""torchtitan-style TOML job files, read into :class:`~monarch_nb.ft.settings.config.RunConfig` values.

torchtitan users describe a job in a TOML file with sections such as ``[model]``,
``[training]``, ``[optimizer]``, ``[fault_tolerance]`` and ``[checkpoint]`` (torchtitan up to
0.2; 0.3.0 configures jobs in Python and ships no TOML). :data:`SECTIONS` maps the keys
monarch_nb supports onto RunConfig fields; a ``[monarch_nb]`` section takes any RunConfig
field by its own name (sub-tables ``[monarch_nb.respawn]`` and ``[monarch_nb.env]``), or by
an older name the caller passes (``renamed``; the caller maps it to the name now).

Anything else is refused by name, listing what that section supports: a key that was
silently ignored would be a setting the user believes in and the run does not apply. Type
errors name the key. A field set twice (``[training] steps`` and ``[monarch_nb] steps``) is
refused too. This module only reads and checks; ``RunConfig.from_toml`` validates the result.
"""

from __future__ import annotations

import dataclasses
import datetime
import reprlib
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

OWN_SECTION = "monarch_nb"
TORCHTITAN_CHECKPOINT_INTERVAL = 500  # torchtitan's [checkpoint] interval default


@dataclass(frozen=True)
class Key:
    """One supported key of a torchtitan section.

    ``field`` is the RunConfig field it sets (None: checked, then not stored); ``kind`` its
    TOML type ("int", "float", "str", "bool"); ``convert`` turns the TOML value into the
    field's value (returning :data:`SKIP` leaves the field at its default); ``check`` returns
    what is wrong with a value, or None; ``doc`` says what it means here.
    """

    field: str | None
    kind: str
    doc: str
    convert: Callable[[Any], Any] | None = None
    check: Callable[[Any], str | None] | None = None


SKIP = object()


def _must_be(expected: Any, fix: str) -> Callable[[Any], str | None]:
    return lambda v: None if v == expected else f"{v!r} is not supported; {fix}"


def _optimizer_name(v: str) -> str | None:
    return None if v.lower() == "adamw" else f"{v!r} is not supported; monarch_nb trains with AdamW (name = \"AdamW\")"


def _keep(v: int) -> str | None:
    return None if v >= 1 else f"{v} is not supported (torchtitan's 0 means keep all); give a number >= 1"


# Section -> key -> Key. The order is the order of the README table.
SECTIONS: dict[str, dict[str, Key]] = {
    "job": {
        "description": Key(None, "str", "free text; not used"),
        "dump_folder": Key("runs_root", "str", "where run directories go"),
    },
    "model": {
        "name": Key(None, "str", "must be \"llama3\"",
                    check=_must_be("llama3", "monarch_nb trains torchtitan's Llama 3 (name = \"llama3\")")),
        "flavor": Key("model", "str", "debugmodel, small, medium, 1B, 3B, 8B, 70B, 405B"),
    },
    "optimizer": {
        "name": Key(None, "str", "must be \"AdamW\"", check=_optimizer_name),
        "lr": Key("lr", "float", "peak learning rate"),
    },
    "lr_scheduler": {
        "warmup_steps": Key("warmup_steps", "int", "linear warm-up steps"),
    },
    "training": {
        "local_batch_size": Key("batch_size", "int", "sequences per process per step"),
        "batch_size": Key("batch_size", "int", "older torchtitan name of local_batch_size"),
        "seq_len": Key("seq_len", "int", "tokens per sequence"),
        "steps": Key("steps", "int", "steps to train"),
    },
    "parallelism": {
        "data_parallel_shard_degree": Key(
            "group_size", "int", "processes per replica group (FSDP inside it); -1: group_size's default",
            convert=lambda v: SKIP if v == -1 else v,
            check=lambda v: None if v == -1 or v >= 1 else f"{v} is not a process count; give a number >= 1 or -1"),
    },
    "fault_tolerance": {
        "enable": Key(None, "bool", "must be true",
                      check=_must_be(True, "monarch_nb always trains under torchft (enable = true, or leave it out)")),
        "group_size": Key("replicas", "int", "replica groups (torchft's name for their number)"),
        "replica_id": Key(None, "int", "ignored: monarch_nb numbers the groups 0..R-1 itself"),
        "min_replica_size": Key("min_replicas", "int", "fewest groups a step may commit with"),
        "process_group": Key("backend", "str", "cross-replica backend: gloo or nccl"),
        "process_group_timeout_ms": Key("pg_timeout_s", "int", "cross-replica collective timeout (ms -> s)",
                                        convert=lambda v: v / 1000.0,
                                        check=lambda v: None if v > 0 else f"{v} is not a timeout; give ms > 0"),
        "semi_sync_method": Key("sync", "str", "local_sgd or diloco: the groups meet every sync_steps steps "
                                "(leave it out: gradients averaged every step)"),
        "sync_steps": Key("sync_every", "int", "steps between the groups' meetings (local_sgd, diloco)"),
        "num_fragments": Key("fragments", "int", "diloco in this many staggered pieces (streaming DiLoCo)"),
    },
    "checkpoint": {
        "enable": Key(None, "bool", "with interval: checkpoint_every (false: checkpoint_every = None)"),
        "enable_checkpoint": Key(None, "bool", "older torchtitan name of enable"),
        "interval": Key(None, "int",
                        f"steps between checkpoints when enabled (default {TORCHTITAN_CHECKPOINT_INTERVAL})"),
        "folder": Key("checkpoint_dir", "str", "where checkpoints go"),
        "keep_latest_k": Key("checkpoint_keep", "int", "checkpoints kept (>= 1)", check=_keep),
    },
}


def describe_sections() -> list[tuple[str, str, str]]:
    """(``[section] key``, RunConfig field, meaning) for every supported torchtitan key."""
    rows = []
    for section, keys in SECTIONS.items():
        for name, key in keys.items():
            target = key.field or ("checkpoint_every" if section == "checkpoint" and name != "folder" else "-")
            rows.append((f"[{section}] {name}", target, key.doc))
    return rows


# ---- reading --------------------------------------------------------------------------------


class _Values:
    """Field values read so far, and where each came from ("[section] key")."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}

    def set(self, field: str, value: Any, where: str) -> None:
        if field in self.origins:
            raise ValueError(f"{where}: sets {field}, which {self.origins[field]} already set; keep one "
                             f"({self.path})")
        self.values[field] = value
        self.origins[field] = where


def read_job_file(path: str | Path, field_types: dict[str, Any],
                  renamed: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """RunConfig field values from the job file at ``path``, and where each came from.

    ``field_types`` maps every RunConfig field to its type (``typing.get_type_hints``): the
    ``[monarch_nb]`` section is checked against it. ``renamed`` (old name -> field) lets that
    section give a field by an older name: read with the field's type, returned under the old
    name. Raises ``ValueError`` naming the section and key at fault and what is allowed there.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; give the path of a TOML job file, "
                         f"e.g. examples/llama3_debug_ft.toml")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a TOML job file: byte {exc.start} is not UTF-8 text; "
                         f"give the path of a TOML job file, e.g. examples/llama3_debug_ft.toml") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid TOML: arrays or tables nested too deeply to read") from None
    out = _Values(str(path))
    supported = ", ".join(f"[{s}]" for s in (*SECTIONS, OWN_SECTION))
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ValueError(f"{section}: a key outside any section; put it in one, e.g. [{OWN_SECTION}] "
                             f"{section} = ... (supported sections: {supported}) ({path})")
        if section == OWN_SECTION:
            _read_own(table, field_types, renamed or {}, out)
        elif section in SECTIONS:
            _read_torchtitan(section, table, out)
        else:
            raise ValueError(f"[{section}]: unknown section; supported sections: {supported} ({path})")
    return out.values, out.origins


def _read_torchtitan(section: str, table: dict[str, Any], out: _Values) -> None:
    keys = SECTIONS[section]
    seen: dict[str, Any] = {}
    for name, value in table.items():
        where = f"[{section}] {name}"
        key = keys.get(name)
        if key is None:
            raise ValueError(f"{where}: unknown key; supported keys in [{section}]: {', '.join(keys)}; "
                             f"any other RunConfig field goes in [{OWN_SECTION}] ({out.path})")
        value = _coerce(where, value, {"int": int, "float": float, "str": str, "bool": bool}[key.kind], out.path)
        problem = key.check(value) if key.check else None
        if problem:
            raise ValueError(f"{where}: {problem} ({out.path})")
        seen[name] = value
        if key.field is not None:
            try:
                converted = key.convert(value) if key.convert else value
            except OverflowError:
                raise ValueError(f"{where}: an integer of {len(str(abs(value)))} digits is too large; "
                                 f"give a realistic value ({out.path})") from None
            if converted is not SKIP:
                out.set(key.field, converted, where)
    if section == "checkpoint":
        _checkpoint_every(seen, out)


def _checkpoint_every(seen: dict[str, Any], out: _Values) -> None:
    """torchtitan's enable + interval -> checkpoint_every (None when not enabled)."""
    if "enable" in seen and "enable_checkpoint" in seen:
        raise ValueError(f"[checkpoint] enable_checkpoint: the older name of enable, which is also given; "
                         f"keep one ({out.path})")
    enabled = seen.get("enable", seen.get("enable_checkpoint", False))
    if "interval" in seen:
        if seen["interval"] < 1:
            raise ValueError(f"[checkpoint] interval: must be >= 1 step, got {seen['interval']} ({out.path})")
    if enabled:
        where = "[checkpoint] interval" if "interval" in seen else "[checkpoint] enable"
        out.set("checkpoint_every", seen.get("interval", TORCHTITAN_CHECKPOINT_INTERVAL), where)


def _read_own(table: dict[str, Any], field_types: dict[str, Any], renamed: dict[str, str], out: _Values) -> None:
    for name, value in table.items():
        where = f"[{OWN_SECTION}] {name}"
        field = renamed.get(name, name)
        if field not in field_types:
            raise ValueError(f"{where}: unknown key; [{OWN_SECTION}] takes RunConfig fields: "
                             f"{', '.join(field_types)} ({out.path})")
        out.set(name, _coerce(where, value, field_types[field], out.path), where)


# ---- types ----------------------------------------------------------------------------------

_TOML_TYPE = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "an array",
              dict: "a table", datetime.datetime: "a date-time", datetime.date: "a date", datetime.time: "a time"}


# A value as an error message shows it: short, and never the whole of a huge or deeply nested one.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel = 3


def _got(value: Any) -> str:
    return f"{_SHORT.repr(value)} ({_TOML_TYPE.get(type(value), type(value).__name__)})"


def _coerce(where: str, value: Any, tp: Any, path: str) -> Any:
    """``value`` as type ``tp`` (int, float, str, bool, X | None, dict[str, str], a dataclass)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(arms) == 1:  # TOML has no null: X | None takes an X
            return _coerce(where, value, arms[0], path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected true or false, got {_got(value)} ({path})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected an integer, got {_got(value)} ({path})")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ValueError(f"{where}: an integer of {len(str(abs(value)))} digits is too large for a number "
                                 f"({path})") from None
        raise ValueError(f"{where}: expected a number, got {_got(value)} ({path})")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{where}: expected a string, got {_got(value)} ({path})")
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a table of names to strings, got {_got(value)} ({path})")
        return {str(k): _coerce(f"{where}.{k}", v, str, path) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a table of {', '.join(hints)}, got {_got(value)} ({path})")
        for k in value:
            if k not in hints:
                raise ValueError(f"{where}.{k}: unknown key; allowed keys: {', '.join(hints)} ({path})")
        return tp(**{k: _coerce(f"{where}.{k}", v, hints[k], path) for k, v in value.items()})
    raise ValueError(f"{where}: cannot be set from a file ({path})")
