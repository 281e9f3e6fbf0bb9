"""Argument parsing for magics: argparse that raises IPython's UsageError with the usage text."""

from __future__ import annotations

import argparse
import math
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError


class HelpShown(Exception):
    """``--help`` was asked for; the help text is in ``args[0]``."""


class MagicArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("add_help", True)
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    _argv: list[str] | None = None  # the line being parsed (set on the top-level parser)

    def error(self, message: str) -> NoReturn:
        target = self._parser_for(self._argv) if self._argv else self
        raise UsageError(f"{target.prog}: {message}\n\n{target.format_help()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise UsageError(message or self.format_usage())
        raise HelpShown(self.format_help())

    def print_help(self, file: Any = None) -> None:
        raise HelpShown(self.format_help())

    def parse_line(self, line: str) -> argparse.Namespace:
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            words = line.split()
            usage = self._parser_for(words[:1]).format_usage()
            raise UsageError(f"{self.prog}: cannot parse arguments ({exc})\n\n{usage}") from None
        self._argv = argv
        try:
            args, extra = self.parse_known_args(argv)
        except argparse.ArgumentError as exc:
            self.error(str(exc))
        finally:
            self._argv = None
        if extra and getattr(args, "module", None) is None:  # only a torchtitan job takes flags we do not know
            self._argv = argv
            try:
                self.error(f"unrecognized arguments: {' '.join(extra)}")
            finally:
                self._argv = None
        args.titan_args = extra  # torchtitan's --section.key flags, for its own parser
        return args

    def usage_for(self, line: str) -> str:
        """The usage of the subcommand named in ``line`` (for errors found after parsing)."""
        try:
            return self._parser_for(shlex.split(line)).format_usage()
        except ValueError:
            return self.format_usage()

    def _parser_for(self, argv: list[str]) -> argparse.ArgumentParser:
        """The parser of the subcommand named in ``argv`` (``%monarch train ...``), so that an
        error shows that subcommand's usage rather than the list of all subcommands."""
        parser: argparse.ArgumentParser = self
        for word in argv:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs or word not in subs[0].choices:
                break
            parser = subs[0].choices[word]
        return parser


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_number(text: str, unit: str = "") -> float:
    """A finite number > 0 (``unit``, e.g. " of seconds", names what it counts in errors)."""
    what = f"a positive number{unit}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):  # NaN passes every comparison; inf never ends a wait
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}; give a finite one")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_float(text: str) -> float:
    """Seconds: a finite number > 0."""
    return positive_number(text, " of seconds")


def key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value


def dim_selector(text: str) -> tuple[str, int | slice]:
    """``hosts=1`` -> ('hosts', 1); ``gpus=0:2`` -> ('gpus', slice(0, 2))."""
    key, value = key_value(text)
    try:
        if ":" in value:
            start, stop = value.split(":", 1)
            return key, slice(int(start) if start else None, int(stop) if stop else None)
        return key, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DIM=INDEX or DIM=START:STOP, got {text!r}") from None
