"""The dashboard model's fold of the quorum: which quorum trains, how many groups are in it, and
how many steps were attempted and committed.

Quorum ids only move forward: a late report of an older quorum (a group that saw it after the
next one formed) changes nothing. ``DashboardModel`` routes ``Quorum`` and ``Step`` events here;
``summary`` is the plain data the quorum panel renders.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..telemetry.events import Quorum, Step


@dataclass(frozen=True)
class QuorumSummary:
    quorum_id: int | None
    participants: int | None
    total_groups: int
    steps_committed: int
    steps_attempted: int
    global_step: int | None

    @property
    def text(self) -> str:
        qid = "-" if self.quorum_id is None else str(self.quorum_id)
        part = "-" if self.participants is None else str(self.participants)
        return (f"quorum {qid} | {part}/{self.total_groups} groups | "
                f"steps committed {self.steps_committed}/{self.steps_attempted} attempted")


class QuorumProgress:
    """The newest quorum and the run's step counts. Not thread-safe: the model's callers lock."""

    def __init__(self) -> None:
        self.quorum_id: int | None = None
        self.participants: int | None = None
        self.steps_attempted = 0
        self.steps_committed = 0
        self.global_step: int | None = None  # the newest committed step of any group

    def step(self, e: Step) -> None:
        self.steps_attempted += 1
        if e.committed:
            self.steps_committed += 1
            if self.global_step is None or e.step > self.global_step:
                self.global_step = e.step
        if e.quorum_id is not None and (self.quorum_id is None or e.quorum_id >= self.quorum_id):
            self.quorum_id = e.quorum_id
            if e.participants is not None:
                self.participants = e.participants

    def is_stale(self, e: Quorum) -> bool:
        """An older quorum than the one already known."""
        return self.quorum_id is not None and e.quorum_id < self.quorum_id

    def formed(self, e: Quorum) -> bool:
        """Take a quorum that is not stale; whether it is a new one (not the current one again)."""
        new = e.quorum_id != self.quorum_id
        self.quorum_id = e.quorum_id
        self.participants = len(e.participants)
        return new

    def summary(self, total_groups: int) -> QuorumSummary:
        return QuorumSummary(self.quorum_id, self.participants, total_groups,
                             self.steps_committed, self.steps_attempted, self.global_step)
