"""What identifies and measures one record of bench_goodput.py's JSON, shared by the benchmark
that writes it, readme_tables.py that renders it and the tests that check it."""

from __future__ import annotations


def race(record: dict) -> tuple[int, str]:
    """The race a record belongs to: its size and model flavour (records from before flavours
    were raced are debugmodel's)."""
    return record["groups"], record.get("model", "debugmodel")


def on_failure(record: dict) -> str:
    """What the arm did about a failure (RunConfig.on_failure: peer, restart, plain_restart);
    records written before the field had that name keep it as ``recovery``."""
    return record["on_failure"] if "on_failure" in record else record["recovery"]


def reached(record: dict) -> int:
    """The step an arm got to: its target, or where it stopped at its limit (records from before
    the limit existed have no ``reached_step``: they all reached the target)."""
    return record.get("reached_step", record["target_step"])
