"""What identifies and measures one record of bench_goodput.py's JSON, shared by the benchmark
that writes it, readme_tables.py that renders it and the tests that check it."""

from __future__ import annotations


def race(record: dict) -> tuple[int, str]:
    """The race a record belongs to: its size and model flavour (records from before flavours
    were raced are debugmodel's)."""
    return record["groups"], record.get("model", "debugmodel")


def reached(record: dict) -> int:
    """The step an arm got to: its target, or where it stopped at its limit (records from before
    the limit existed have no ``reached_step``: they all reached the target)."""
    return record.get("reached_step", record["target_step"])
