"""Waits on a run's identity verdicts that tests share."""

from __future__ import annotations

from typing import Any


def all_agree(run: Any, groups: int, attempts: int = 3) -> Any:
    """The first identity verdict at a meeting that every group committed. A group can be left out
    of a meeting with no fault (late to its quorum: the donor of a heal at the meeting before
    was, by the heal's time) and heals at the next one; a verdict covers the groups that committed
    its step, so this asks again at a later meeting (CI and a quiet run here saw 2 of 3 once)."""
    same = None
    for _ in range(attempts):
        same = run.check_identical(timeout=120)
        if same is not None and len(same.hashes) == groups:
            return same
    return same
