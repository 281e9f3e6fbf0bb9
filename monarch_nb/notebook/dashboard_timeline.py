"""The dashboard model's fold of the timeline: every failure and its recovery, and the events list.

Recoveries are the one recovery model (``monarch_nb.ft.record.recovery``) fed the same events, so
the dashboard and ``run.history()`` never disagree about a phase; only the newest
``RECOVERIES_KEPT`` are held (``tracker.dropped`` counts the rest). The events list is a bounded
window of one-line texts, which ``DashboardModel`` writes as it folds each event.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..ft.record.recovery import Recovery, RecoveryTracker
from ..telemetry.events import Event

RECOVERIES_KEPT = 200


@dataclass(frozen=True)
class LogLine:
    t: float
    kind: str
    text: str


class Timeline:
    """The recoveries and the newest lines of the events list. Not thread-safe: callers lock.

    Args:
        log_size: lines of the events list kept (newest).
        recoveries_kept: recoveries kept (newest); older ones are counted in ``tracker.dropped``.
    """

    def __init__(self, *, log_size: int = 200, recoveries_kept: int = RECOVERIES_KEPT) -> None:
        self.log: deque[LogLine] = deque(maxlen=log_size)
        self.tracker = RecoveryTracker(keep=recoveries_kept)

    def track(self, e: Event) -> Recovery | None:
        """Fold ``e`` into the recoveries; the recovery it changed, if any."""
        return self.tracker.apply(e)

    def note(self, e: Event, text: str) -> None:
        """Add ``e`` to the events list, in words."""
        self.log.append(LogLine(e.t, e.kind, text))

    @property
    def recoveries(self) -> list[Recovery]:
        return self.tracker.recoveries

    def last(self, n: int) -> list[LogLine]:
        return list(self.log)[-n:]
