"""Argument parsing for magics: argparse that raises IPython's UsageError with the usage text."""

from __future__ import annotations

import argparse
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

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n\n{self.format_help()}")

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
            raise UsageError(f"{self.prog}: cannot parse arguments ({exc})\n\n{self.format_usage()}") from None
        try:
            return self.parse_args(argv)
        except argparse.ArgumentError as exc:
            self.error(str(exc))


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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value}")
    return value


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
