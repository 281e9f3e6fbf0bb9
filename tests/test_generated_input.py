"""Generated hostile input (issue 36): whatever a person types or points monarch_nb at is
answered with a result or with one of the errors that say what is wrong - never a crash of
another type, and never a write outside the place it was pointed at.

Hypothesis builds the input from the real vocabulary, so it reaches past the first check:
``%monarch`` lines from the real parser's subcommands and flags, ``RunConfig`` dicts from its
fields, TOML job files from ``jobfile.SECTIONS``, event logs from the real event classes (cut,
mistyped, mixed with garbage). Every property also checks that nothing was written outside the
example's own temporary directory. The examples are derandomized (the same on every machine,
no example database) and sized so that the module runs in well under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shlex
import shutil
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Iterator

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from monarch_nb.errors import MonarchNbError
from monarch_nb.ft import RespawnBackoff, RunConfig, open_run
from monarch_nb.ft.settings import config as config_module
from monarch_nb.ft.settings.titan_parts import TitanParts
from monarch_nb.ft.settings.jobfile import OWN_SECTION, SECTIONS
from monarch_nb.notebook.args import HelpShown, non_negative_int, positive_float, positive_int
from monarch_nb.notebook.magics import SUBCOMMANDS, _cell_parser, _line_parser
from monarch_nb.telemetry import EventStore, event_kinds
from monarch_nb.telemetry.store import NotAnEventLog

REPO = Path(__file__).resolve().parent.parent


def generated(examples: int) -> settings:
    """``examples`` derandomized examples and no example database (nothing written to the repo).
    No shrinking: shrinking a failing event log or job file takes minutes, which the quick lane
    cannot spend; the failure is reported as generated (set ``phases`` locally to shrink it)."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ---- nothing written outside the example's directory ------------------------------------------


def _listing(path: Path) -> list[str] | None:
    return sorted(os.listdir(path)) if path.is_dir() else None


def _contents(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative), with a file's bytes (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = Path(full).read_bytes()
    return out


@contextlib.contextmanager
def example_dir(factory: Any) -> Iterator[Path]:
    """A fresh directory for one example. Fails the example if anything was written where a stray
    write would land (the working directory, the repository, the runs root, the examples' parent
    directory), and removes the directory afterwards."""
    parent = factory.getbasetemp() / "generated"
    parent.mkdir(exist_ok=True)
    mine = Path(tempfile.mkdtemp(dir=parent))
    watched = {p.resolve() for p in (Path.cwd(), REPO, parent)}
    if os.environ.get("MONARCH_NB_RUNS"):
        watched.add(Path(os.environ["MONARCH_NB_RUNS"]).resolve())
    before = {p: _listing(p) for p in watched}
    try:
        yield mine
        after = {p: _listing(p) for p in watched}
        changed = {str(p): sorted(set(after[p] or []) ^ set(before[p] or [])) for p in watched
                   if after[p] != before[p]}
        assert not changed, f"written outside the example's directory {mine}: {changed}"
    finally:
        shutil.rmtree(mine, ignore_errors=True)


# ---- values a hostile user types ---------------------------------------------------------------

HUGE = 10 ** 400
ODD_WORDS = ["", " ", "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "0", "-0", "-1",
             "0.0", "1e-320", "1_000", "0x10", "\u0661\u0662", "\u00b2", "'", '"', "\\", "--", "-", "=", "a=b",
             "=b", "a=", "hosts=1:", "gpus=:", "gpus=0:2:3", "../x", "a/b", "..", "\x00", "\n", "\t", "\x1b[31m",
             "%s", "%(prog)s", "{}", "9" * 5000, str(HUGE), str(-HUGE), "\u202e", "\ufeff", "--help=x"]
TEXT = st.one_of(st.text(max_size=12), st.sampled_from(ODD_WORDS),
                 st.integers(-(10 ** 30), 10 ** 30).map(str), st.floats().map(repr))

# ---- 1. the %monarch parsers ---------------------------------------------------------------------

LINE_PARSER = _line_parser()
CELL_PARSER = _cell_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every subcommand path of the real parser (``("wait", "step")``) -> its parser."""
    out: dict[tuple[str, ...], Any] = {}
    for name, sub in _subparsers(parser).items():
        out[path + (name,)] = sub
        out.update(_commands(sub, path + (name,)))
    return out


COMMANDS = _commands(LINE_PARSER)
CHECKED_TYPES = {positive_int: lambda v: isinstance(v, int) and v >= 1,
                 non_negative_int: lambda v: isinstance(v, int) and v >= 0,
                 positive_float: lambda v: isinstance(v, float) and math.isfinite(v) and v > 0}


NUMBERS = st.one_of(st.sampled_from(["nan", "NaN", "inf", "-inf", "1e999", "0", "-0", "-1", "3", "0.5", "1e-320",
                                      "1_0", " 7", "9" * 5000]),
                    st.integers(-(10 ** 30), 10 ** 30).map(str), st.floats().map(repr))


def _value_for(action: argparse.Action) -> st.SearchStrategy:
    """Mostly a value of the kind the action takes (so that whole lines parse), else anything."""
    if action.choices:
        typed = st.sampled_from(sorted(map(str, action.choices)))
    elif action.type in (int, float, *CHECKED_TYPES):
        typed = NUMBERS
    else:
        typed = TEXT
    return st.one_of(typed, typed, TEXT)


def _words_for(draw: Any, action: argparse.Action) -> list[str]:
    if action.nargs in (None, "?") or action.nargs == 1:
        count = 1 if action.nargs != "?" else draw(st.integers(0, 1))
    elif action.nargs == 0:
        count = 0
    else:  # "*", "+"
        count = draw(st.integers(0 if action.nargs == "*" else 1, 3))
    return [draw(_value_for(action)) for _ in range(count)]


@st.composite
def magic_lines(draw: Any) -> tuple[str, tuple[str, ...], Any, str]:
    """(line, subcommand path, its parser, the prog its usage names): a real subcommand with its
    positionals and flags, their values mostly of the right kind and hostile (NaN, huge, unicode,
    control characters), plus stray words; sometimes quoted for the shell, sometimes as typed."""
    if draw(st.integers(0, 9)) == 0:
        path, parser, prog = (), CELL_PARSER, "%%monarch"
    else:
        path = draw(st.sampled_from(sorted(COMMANDS)))
        parser, prog = COMMANDS[path], f"%monarch {path[0]}"
    actions = [a for a in parser._actions
               if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))]
    words: list[str] = []
    for action in actions:
        if not action.option_strings:
            if action.required or draw(st.booleans()):
                words += _words_for(draw, action)
        elif action.required or draw(st.integers(0, 3)) == 0:
            flag = draw(st.sampled_from(action.option_strings))
            values = _words_for(draw, action)
            if len(values) == 1 and draw(st.integers(0, 4)) == 0:  # --flag=value, or an abbreviation of it
                words.append(f"{flag[:draw(st.integers(min(3, len(flag)), len(flag)))]}={values[0]}")
            else:
                words += [flag, *values]
    words = draw(st.permutations(words)) if draw(st.integers(0, 3)) == 0 else words
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 2)) == 0 else 0):
        at = draw(st.integers(0, len(words)))
        extra = draw(st.one_of(TEXT, st.sampled_from(["-h", "--help", "--he", "--", "-", "--bogus"])))
        words.insert(at, extra)
    if draw(st.booleans()):
        line = " ".join(shlex.quote(w) for w in (*path, *words))
    else:  # as typed: quotes and backslashes may not pair up
        line = " ".join((*path, *words))
    return line, path, parser, prog


@generated(600)
@given(case=magic_lines())
@example(case=("check --t=nan", ("check",), COMMANDS["check",], "%monarch check"))  # NaN seconds: refused
@example(case=("wait step 3 --timeout inf", ("wait", "step"), COMMANDS["wait", "step"], "%monarch wait"))
def test_a_generated_magic_line_parses_or_is_a_usage_error_naming_the_subcommand(tmp_path_factory, case):
    line, path, parser, prog = case
    top = CELL_PARSER if not path else LINE_PARSER
    with example_dir(tmp_path_factory):
        try:
            args = top.parse_line(line)
        except UsageError as exc:
            assert f"usage: {prog}" in str(exc), (line, str(exc)[:300])
            return
        except HelpShown as shown:
            assert any(w.startswith(("-h", "--h")) for w in line.split()), line
            assert shown.args[0].startswith(f"usage: {prog}")
            return
    assert isinstance(args, argparse.Namespace)
    if path:
        assert args.command == path[0]
        if len(path) > 1:
            assert args.target == path[1]
    for action in parser._actions:  # every value a checked type let through is in its range
        value = getattr(args, action.dest, None)
        check = CHECKED_TYPES.get(action.type)
        if check is not None and value is not None and value != action.default:
            assert check(value), (line, action.dest, value)


def test_the_generated_lines_start_with_every_real_subcommand():
    assert set(SUBCOMMANDS) <= {path[0] for path in COMMANDS}
    assert ("wait", "step") in COMMANDS and "--lr" in COMMANDS["train",]._option_string_actions


# ---- 2. RunConfig.from_dict(...).validate() -------------------------------------------------------

FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
RESPAWN_FIELDS = {f.name for f in dataclasses.fields(RespawnBackoff)}
TITAN_FIELDS = {f.name for f in dataclasses.fields(TitanParts)}
# Values a field accepts, so that generated configs get past the first refusal.
KNOWN_VALUES = {"model": config_module.MODELS, "job": config_module.JOBS, "on_failure": config_module.ON_FAILURE,
                "heal_transport": config_module.HEAL_TRANSPORTS, "platform": ("auto", "cpu", "cuda", "rocm"),
                "backend": ("gloo", "nccl"), "advertise_host": ("127.0.0.1", "localhost", "auto", "10.0.0.1", "::1"),
                "time_limit": ("10", "01:00:00", "1-00:00:00", "99:99"), "partition": ("debug", " "),
                "heal_interface": ("eth0", "ib0"), "run_name": ("run-1", "a.b_c", "a/b", "..", ".", "sessions"),
                "checkpoint_dir": ("ckpt", "../x", "/abs")}
INTS = st.one_of(st.integers(-3, 70), st.sampled_from([HUGE, -HUGE, 2 ** 63, True, False]))
FLOATS = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1e-320, 1e308, float("nan"), float("inf")]))
SCALARS = st.one_of(st.none(), INTS, FLOATS, TEXT)
ANY_VALUE = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                         max_leaves=6)
HINTS = typing.get_type_hints(RunConfig)


def _for_hint(hint: Any) -> st.SearchStrategy:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return st.one_of(*[_for_hint(a) for a in typing.get_args(hint)])
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.one_of(st.booleans(), st.sampled_from([0, 1, "yes"]))
    if hint is int:
        return INTS
    if hint is float:
        return st.one_of(FLOATS, INTS)
    if hint is str:
        return TEXT
    if typing.get_origin(hint) is dict:
        return st.dictionaries(TEXT, st.one_of(TEXT, SCALARS), max_size=3)
    if hint is RespawnBackoff:
        return st.dictionaries(st.one_of(st.sampled_from(sorted(RESPAWN_FIELDS)), st.text(max_size=5)),
                               st.one_of(INTS, FLOATS, TEXT, st.none()), max_size=4)
    return ANY_VALUE


def _field_value(name: str) -> st.SearchStrategy:
    known = KNOWN_VALUES.get(name)
    typed = _for_hint(HINTS[name])
    return st.one_of(st.sampled_from(known), typed, ANY_VALUE) if known else st.one_of(typed, ANY_VALUE)


FIELD_VALUES = {name: _field_value(name) for name in FIELDS}


@st.composite
def config_dicts(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=6))
    data = {name: draw(FIELD_VALUES[name]) for name in names}
    if draw(st.integers(0, 9)) == 0:
        data.update(draw(st.dictionaries(st.text(max_size=8).filter(lambda k: k not in FIELDS), ANY_VALUE,
                                         min_size=1, max_size=2)))
    if "respawn" not in data and draw(st.integers(0, 19)) == 0:  # a run recorded before the rename
        data["restart"] = draw(st.dictionaries(st.sampled_from(["max_restarts", "backoff_s", "bogus"]),
                                               SCALARS, max_size=2))
    return data


def _names_a_field(message: str, data: dict[str, Any]) -> bool:
    head = message.partition(":")[0]
    root, _, rest = head.partition(".")
    if root in FIELDS:
        nested = {"respawn": RESPAWN_FIELDS, "titan": TITAN_FIELDS}.get(root, ())
        return not rest or (bool(nested) and (rest in nested or message.startswith(
            f"{root}.{rest}: unknown key; allowed keys: ")))
    return any(message.startswith(f"{key}: unknown config field") for key in data if key not in FIELDS)


def _safe_run_name(name: Any) -> bool:
    return name is None or (isinstance(name, str) and name not in (".", "..") and "/" not in name
                            and "\\" not in name and name.strip() == name and name.isprintable() and name != "")


@generated(800)
@given(data=config_dicts())
@example(data={"respawn": {"backoff_s": "x"}})  # was a TypeError from comparing str with int
@example(data={"job": "slurm", "time_limit": 5})  # was an AttributeError (5 has no .strip())
@example(data={"respawn": {"bogus": 1}})
@example(data={"run_name": "../x"})
def test_a_generated_config_validates_or_is_refused_naming_its_field(tmp_path_factory, data):
    with example_dir(tmp_path_factory):
        try:
            config = RunConfig.from_dict(data).validate()
        except ValueError as exc:
            assert type(exc) is ValueError, repr(exc)
            assert _names_a_field(str(exc), data), (data, str(exc))
            return
    # A run name is one safe path component ("a/b", "..", a control character: refused).
    assert _safe_run_name(config.run_name), config.run_name


NUMBER_FIELDS = sorted([n for n in FIELDS if HINTS[n] in (float, int, float | None, int | None) and n != "seed"]
                       + [f"respawn.{n}" for n in RESPAWN_FIELDS])


@generated(150)
@given(name=st.sampled_from(NUMBER_FIELDS), value=st.sampled_from([float("nan"), float("inf"), -float("inf")]))
def test_a_validated_config_holds_no_nan_or_infinite_number(tmp_path_factory, name, value):
    """NaN passes every ``v <= 0`` check; a timeout or learning rate of NaN or infinity is refused."""
    root, _, sub = name.partition(".")
    data = {root: {sub: value}} if sub else {root: value}
    if name == "allocation_timeout_s":  # only a SLURM run waits for an allocation
        data["job"] = "slurm"
    with example_dir(tmp_path_factory):
        try:
            RunConfig.from_dict(data).validate()
        except ValueError as exc:
            assert _names_a_field(str(exc), data), str(exc)
            return
    raise AssertionError(f"RunConfig.from_dict({data!r}).validate() accepted it")


# ---- 3. TOML job files ---------------------------------------------------------------------------

_BARE_KEY = st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True)


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else _toml_string(key)


def _toml_string(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Literal):
        return value.text
    raise TypeError(value)


@dataclasses.dataclass(frozen=True)
class Literal:
    """A TOML value written as is (dates and times)."""

    text: str


TOML_SCALARS = st.one_of(INTS, FLOATS, TEXT,
                         st.sampled_from([Literal("1979-05-27T07:32:00Z"), Literal("1979-05-27"),
                                          Literal("07:32:00")]))
TOML_VALUES = st.recursive(TOML_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_BARE_KEY, inner, max_size=3)), max_leaves=5)
KIND_VALUES = {"int": INTS, "float": st.one_of(FLOATS, INTS), "str": TEXT, "bool": st.booleans()}


def _own_value(name: str) -> st.SearchStrategy:
    hint = HINTS[name]
    if hint is RespawnBackoff:
        return st.dictionaries(st.one_of(st.sampled_from(sorted(RESPAWN_FIELDS)), _BARE_KEY),
                               st.one_of(INTS, FLOATS, TEXT), max_size=3)
    if typing.get_origin(hint) is dict:
        return st.dictionaries(_BARE_KEY, st.one_of(TEXT, INTS), max_size=3)
    known = KNOWN_VALUES.get(name)
    arms = [st.sampled_from(known)] if known else []
    base = typing.get_args(hint)[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
    kind = {int: "int", float: "float", str: "str", bool: "bool"}.get(base)
    return st.one_of(*arms, *([KIND_VALUES[kind]] if kind else []), TOML_VALUES)


OWN_VALUES = {name: _own_value(name) for name in FIELDS}
SECTION_VALUES = {(section, name): st.one_of(KIND_VALUES[key.kind], TOML_VALUES)
                  for section, keys in SECTIONS.items() for name, key in keys.items()}


@st.composite
def toml_documents(draw: Any) -> tuple[bytes, set[str] | None]:
    """(the file's bytes, its section names or None once damaged): valid TOML from the real
    sections and keys with generated values, unknown sections and keys; sometimes damaged
    (cut, stray bytes), binary, empty or nested past any parser's depth."""
    sections = draw(st.lists(st.sampled_from([*SECTIONS, OWN_SECTION, OWN_SECTION, "training2", "Model"]),
                             unique=True, max_size=4))
    lines: list[str] = []
    if draw(st.integers(0, 14)) == 0:  # a key outside any section (a table value is a section)
        outside = draw(_BARE_KEY)
        lines.append(f"{outside} = {_toml_value(draw(TOML_VALUES))}")
        sections = [outside, *(s for s in sections if s != outside)]
    for section in sections:
        lines.append(f"[{section}]")
        keys = sorted(FIELDS) if section == OWN_SECTION else sorted(SECTIONS.get(section, {"name": None}))
        for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=4)):
            if section == OWN_SECTION:
                value = draw(OWN_VALUES[key])
            elif section in SECTIONS:
                value = draw(SECTION_VALUES[section, key])
            else:
                value = draw(TOML_VALUES)
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        if draw(st.integers(0, 9)) == 0:
            lines.append(f"{_toml_key(draw(st.text(min_size=1, max_size=8)))} = {_toml_value(draw(TOML_VALUES))}")
    text = ("\n".join(lines) + "\n").encode()
    damage = draw(st.integers(0, 9))
    if damage > 3:
        return text, set(sections)
    if damage == 0 and text:  # cut anywhere (mid-string, mid-header)
        text = text[:draw(st.integers(0, len(text)))]
    elif damage == 1:  # stray bytes dropped in
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(min_size=1, max_size=6)) + text[at:]
    elif damage == 2:
        text = draw(st.binary(max_size=64))
    elif damage == 3:
        text = draw(st.sampled_from([b"", b"\n", b"\xef\xbb\xbf[training]\n", b"[training]\n[training]\n",
                                     b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n",
                                     b"x = " + b"{a = " * 2000 + b"1" + b"}" * 2000 + b"\n",
                                     b"[monarch_nb]\nenv = {" + b"a." * 3000 + b"b = '1'}\n"]))
    return text, None


@generated(600)
@given(doc=toml_documents())
@example(doc=(b"\x80 = 0\n", None))  # was a UnicodeDecodeError naming no file
@example(doc=(b"[optimizer]\nlr = " + b"9" * 400 + b"\n", {"optimizer"}))  # was an OverflowError
@example(doc=(b"[fault_tolerance]\nprocess_group_timeout_ms = " + b"9" * 400 + b"\n", {"fault_tolerance"}))
@example(doc=(b"[training]\nsteps = " + b"9" * 5000 + b"\n", None))  # tomllib's own ValueError, no file named
@example(doc=(b"[monarch_nb]\nenv = {" + b"a." * 3000 + b"b = '1'}\n", {"monarch_nb"}))  # was a RecursionError
def test_a_generated_job_file_loads_or_is_refused_naming_the_file(tmp_path_factory, doc):
    text, sections = doc
    with example_dir(tmp_path_factory) as mine:
        path = mine / "job.toml"
        path.write_bytes(text)
        try:
            config = RunConfig.from_toml(path)
        except ValueError as exc:
            message = str(exc)
            assert type(exc) is ValueError, repr(exc)
            assert str(path) in message, message[:400]
            if sections is not None and message.startswith("[") and "]" in message:
                assert message[1:message.index("]")] in sections, message[:400]
        else:
            assert isinstance(config, RunConfig)
        assert _contents(mine) == {"job.toml": text}


# ---- 4. damaged run directories ------------------------------------------------------------------

KINDS = event_kinds()
SMALL_INT = st.integers(0, 3)


def _event_value(name: str, hint: Any) -> st.SearchStrategy:
    """A plausible value of an event field (small replica numbers, so that the events of one log
    fold into recoveries)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return st.one_of(*[_event_value(name, a) for a in typing.get_args(hint)])
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        return SMALL_INT if name in ("replica", "rank", "spare", "source_replica", "attempt") else st.integers(0, 60)
    if hint is float:
        return st.one_of(st.floats(0, 100), st.sampled_from([float("nan"), float("inf"), 0.0]))
    if hint is str:
        if name == "mesh":
            odd = ["replica0", "replica1", "main", "replica", "replica\u00b2", "replica\u0661", "replica-1"]
            return st.one_of(st.sampled_from(odd), st.text(max_size=4).map("replica".__add__))
        if name == "reason":
            return st.sampled_from(["process 7 is gone (pid check)", "SIGKILL", "timeout waiting", "x"])
        return st.sampled_from(["training", "failed", "kill", "pid", "spawn", ""])
    if typing.get_origin(hint) is list:
        return st.lists(_event_value(name, typing.get_args(hint)[0]), max_size=3)
    if typing.get_origin(hint) is dict:
        return st.dictionaries(st.text(max_size=4), st.one_of(st.integers(0, 9), st.text(max_size=4)), max_size=3)
    return st.none()


def _event(kind: str) -> st.SearchStrategy:
    cls = KINDS[kind]
    hints = typing.get_type_hints(cls)
    fields = {f.name: _event_value(f.name, hints[f.name]) for f in dataclasses.fields(cls)
              if f.name != "t" and hints[f.name] is not typing.Any}
    fields["t"] = st.floats(1e9, 1e9 + 600)
    return st.fixed_dictionaries(fields).map(lambda d: {"kind": kind, **d})


EVENTS = {kind: _event(kind) for kind in KINDS}
REAL_EVENTS = st.one_of(*(EVENTS[kind] for kind in sorted(KINDS)))
JSON_SCALARS = st.one_of(st.sampled_from([HUGE, -HUGE, 2 ** 63, -1, 0, 1e308, -1e308, float("nan"), float("inf")]),
                         st.none(), st.booleans(), st.integers(-HUGE, HUGE), st.floats(), TEXT)
JSON_VALUES = st.one_of(JSON_SCALARS, st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=5))


@st.composite
def log_lines(draw: Any) -> bytes:
    """One line of a damaged log: a real event, one cut at a byte, one with a field holding a
    hostile JSON value (huge, NaN, nested, of the wrong type), or garbage."""
    how = draw(st.sampled_from(["real", "cut", "mistyped", "garbage"]))
    if how == "garbage":
        return draw(st.binary(max_size=40)).replace(b"\n", b"")
    event = draw(REAL_EVENTS)
    if how == "mistyped":
        event[draw(st.sampled_from(sorted(event)))] = draw(JSON_VALUES)
    raw = json.dumps(event).encode()
    return raw[:draw(st.integers(0, len(raw)))] if how == "cut" else raw


@st.composite
def recovery_story(draw: Any) -> list[bytes]:
    """The events of one real recovery (fault, detection, teardown, respawn, heal, rejoin) with
    survivors' steps around it, so that the fold has something to fold; some lines then damaged."""
    t = draw(st.floats(1e9, 2e9))
    victim = draw(SMALL_INT)
    events: list[dict[str, Any]] = [{"kind": "run_started", "run_id": "r", "config": {"replicas": 3}}]
    for kind in ["fault_injected", "failure_detected", "worker_exit_reported", "torn_down", "acquired", "respawned",
                 "healed", "rejoined", "replicas_identical", "gave_up", "run_stopped"]:
        if draw(st.integers(0, 3)):
            events.append(draw(EVENTS[kind]))
        events += [draw(EVENTS["step"]) for _ in range(draw(st.integers(0, 2)))]
    lines = []
    for event in events:
        t += draw(st.floats(0, 5))
        event["t"] = t
        if "replica" in event and draw(st.booleans()):
            event["replica"] = victim
        if event["kind"] == "failure_detected" and draw(st.booleans()):  # what a later exit report explains
            event.update(source="pid", reason="process 7 is gone (pid check)", replica=victim)
        if event["kind"] == "worker_exit_reported":
            event["mesh"] = draw(st.one_of(st.just(f"replica{victim}"), _event_value("mesh", str)))
        if draw(st.integers(0, 9)) == 0:
            event[draw(st.sampled_from(sorted(event)))] = draw(JSON_VALUES)
        lines.append(json.dumps(event).encode())
    return lines


BODIES = st.one_of(st.lists(log_lines(), max_size=12), recovery_story(),
                   st.tuples(recovery_story(), st.lists(log_lines(), max_size=4)).map(lambda ab: ab[0] + ab[1]))


@st.composite
def _log_file(draw: Any) -> tuple[str, bytes]:
    lines = draw(BODIES)
    if lines and draw(st.booleans()):  # the writer died mid-line
        lines[-1] = lines[-1][:draw(st.integers(0, len(lines[-1])))]
        return "file", b"\n".join(lines)
    return "file", b"".join(line + b"\n" for line in lines)


# (what events.jsonl is: "file", "absent" or "directory"; the file's bytes)
RUN_DIRS = st.one_of(st.just(("absent", None)), st.just(("directory", None)),
                     st.binary(max_size=200).map(lambda b: ("file", b)), _log_file(), _log_file(), _log_file())


@generated(500)
@given(case=RUN_DIRS, by_file=st.booleans())
@example(case=("directory", None), by_file=False)  # was an IsADirectoryError
@example(case=("file", b'{"t": 5, "kind": "failure_detected", "replica": 0, "rank": 0, "source": "pid", '
                       b'"reason": "process 7 is gone (pid check)"}\n'
                       b'{"t": 6, "kind": "worker_exit_reported", "mesh": "replica\xc2\xb2", "rank": 0, '
                       b'"reason": "SIGKILL"}\n'), by_file=False)  # was a ValueError from int("\u00b2")
# An integer beyond a float's range where a float belongs: the time, or a detection delay.
@example(case=("file", b'{"t": 1' + b"0" * 400 + b', "kind": "run_stopped", "run_id": "r"}\n'), by_file=True)
@example(case=("file", b'{"t": 5.0, "kind": "failure_detected", "replica": 0, "rank": 0, "reason": "x", '
                       b'"detection_s": 1' + b"0" * 400 + b'}\n'), by_file=False)
def test_a_damaged_run_directory_opens_or_is_refused_by_one_of_our_errors(tmp_path_factory, case, by_file):
    shape, body = case
    with example_dir(tmp_path_factory) as mine:
        run_dir = mine / "run"
        run_dir.mkdir()
        log = run_dir / "events.jsonl"
        if shape == "file":
            log.write_bytes(body)
        elif shape == "directory":
            log.mkdir()
        before = _contents(mine)
        target = log if by_file else run_dir
        for opener in ("EventStore.open", "open_run"):
            try:
                opened = EventStore.open(target) if opener == "EventStore.open" else open_run(target)
            except FileNotFoundError as exc:  # the one builtin error: nothing there, and it says where
                assert shape != "file" and str(run_dir) in str(exc), (shape, str(exc))
                continue
            except (NotAnEventLog, MonarchNbError) as exc:
                assert str(log) in str(exc) or str(run_dir) in str(exc), str(exc)
                continue
            history = opened if opener == "open_run" else None
            store = opened if history is None else history.events
            assert store.skipped_lines >= 0 and len(store.events()) == len(store)
            if history is not None:
                summary = history.summary()
                assert summary["skipped_lines"] == store.skipped_lines
                assert summary["failures"] == len(history.recoveries())
                repr(history)
        assert _contents(mine) == before, "opening a run changed its directory"
