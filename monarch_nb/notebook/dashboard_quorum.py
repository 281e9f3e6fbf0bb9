"""The dashboard model's fold of the quorum: which quorum trains, how many groups are in it, and
how many steps were attempted and committed.

Quorum ids only move forward: a late report of an older quorum (a group that saw it after the
next one formed) changes nothing. ``DashboardModel`` routes ``Quorum`` and ``Step`` events here;
``summary`` is the plain data the quorum panel renders.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass

from ..telemetry.events import Quorum, Step

STALL_OVER = 3.0  # a global step that took more than this many median steps was held up (a fault)
PACE_KEPT = 500  # the newest intervals between global steps the pace is the median of


@dataclass(frozen=True)
class QuorumSummary:
    quorum_id: int | None
    participants: int | None
    total_groups: int
    steps_committed: int
    steps_attempted: int
    global_step: int | None
    stalled_s: float = 0.0  # what faults cost the run: time its global step stood still past its pace
    pace_s: float | None = None  # the run's median step time (its fault-free pace)

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
        self._moved_t: float | None = None  # when the global step last moved
        self._intervals: collections.deque[float] = collections.deque(maxlen=PACE_KEPT)
        self._pace: float | None = None
        self.stalled_s = 0.0

    def step(self, e: Step) -> None:
        self.steps_attempted += 1
        if e.committed:
            self.steps_committed += 1
            if self.global_step is None or e.step > self.global_step:
                self.global_step = e.step
                self._paced(e.t)
        if e.quorum_id is not None and (self.quorum_id is None or e.quorum_id >= self.quorum_id):
            self.quorum_id = e.quorum_id
            if e.participants is not None:
                self.participants = e.participants

    def _paced(self, t: float) -> None:
        """The fault cost in one figure: every wait of the global step past ``STALL_OVER`` times the
        run's own median step is time the faults took (jitter below that is not counted)."""
        if self._moved_t is not None and t > self._moved_t:
            gap = t - self._moved_t
            if len(self._intervals) >= 20 and self._pace is not None and gap > STALL_OVER * self._pace:
                self.stalled_s += gap - self._pace
            else:
                self._intervals.append(gap)
                if len(self._intervals) % 10 == 0 or self._pace is None:
                    self._pace = statistics.median(self._intervals)
        self._moved_t = t if self._moved_t is None else max(self._moved_t, t)

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
        return QuorumSummary(self.quorum_id, self.participants, total_groups, self.steps_committed,
                             self.steps_attempted, self.global_step, self.stalled_s, self._pace)
