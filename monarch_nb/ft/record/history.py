"""What happened in a run, rebuilt from its events alone.

``RunHistory`` reads an :class:`~monarch_nb.telemetry.EventStore` - live (``FTRun.history()``)
or reopened from disk (``open_run(path)``) - in one pass: the events are folded by the one
:class:`~monarch_nb.ft.record.recovery.RecoveryTracker` (which defines a recovery and its phases),
and every group's committed steps are collected on the way. A second, short pass over those
steps adds what only the whole run can tell: how long the groups that stayed up stalled
around each failure. Nothing here talks to a process; the event log is the only input.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import views
from ...telemetry import EventStore
from ...telemetry.events import ReplicaState, ReplicasIdentical, RunStarted, RunStopped, Step
from .recovery import Recovery, RecoveryTracker


@dataclass
class _Fold:
    recoveries: list[Recovery]
    steps: list[Step]
    commit_times: dict[int, list[float]] = field(default_factory=dict)
    identity: list[ReplicasIdentical] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    last_t: float | None = None
    run_mark: str | None = None  # the kind of the last run_started / run_stopped


@dataclass(frozen=True)
class LossBand:
    """The outcome of :meth:`RunHistory.loss_band`: steps checked and those outside the band."""

    window: int
    k: float
    floor: float
    checked: int
    outside: list[int]

    @property
    def inside_fraction(self) -> float | None:
        return 1.0 - len(self.outside) / self.checked if self.checked else None

    @property
    def within(self) -> bool:
        return self.checked > 0 and not self.outside

    def describe(self) -> str:
        if not self.checked:
            return "no step in common with the reference run"
        return (f"{self.checked - len(self.outside)}/{self.checked} steps inside the no-fault band "
                f"(mean of {self.window} steps +/- max({self.k:g} std, {self.floor:.0%}))")


def _mean_loss_by_step(steps: list[Step]) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for e in steps:
        by_step.setdefault(e.step, []).append(e.loss)
    return {s: statistics.mean(v) for s, v in by_step.items()}


def _band_at(ref: dict[int, float], steps: list[int], step: int, window: int, k: float,
             floor: float) -> tuple[float, float] | None:
    """The reference band's (centre, half width) at ``step``; None with fewer than 3 reference
    steps within ``window // 2`` of it."""
    around = [ref[s] for s in steps if abs(s - step) <= window // 2]
    if len(around) < 3:
        return None
    centre = statistics.mean(around)
    return centre, max(k * statistics.pstdev(around), floor * centre)


class RunHistory:
    def __init__(self, events: EventStore, run_dir: str | Path | None = None) -> None:
        self.events = events
        self.run_dir = Path(run_dir) if run_dir is not None else None

    def _fold(self) -> _Fold:
        tracker = RecoveryTracker()
        fold = _Fold(tracker.recoveries, [])
        for e in self.events:
            tracker.apply(e)
            fold.last_t = e.t if fold.last_t is None else max(fold.last_t, e.t)
            if isinstance(e, (RunStarted, RunStopped)):
                fold.run_mark = e.kind
            if isinstance(e, Step) and e.committed:
                fold.steps.append(e)
                fold.commit_times.setdefault(e.replica, []).append(e.t)
            elif isinstance(e, ReplicasIdentical):
                fold.identity.append(e)
            elif isinstance(e, RunStarted) and not fold.config:
                fold.config = dict(e.config)
        for rec in fold.recoveries:
            _survivor_figures(rec, fold)
        return fold

    @property
    def config(self) -> dict[str, Any]:
        started = self.events.events(RunStarted)
        return dict(started[0].config) if started else {}

    def steps(self, replica: int | None = None, committed_only: bool = True) -> list[Step]:
        return [e for e in self.events.events(Step)  # type: ignore[misc]
                if (replica is None or e.replica == replica) and (e.committed or not committed_only)]

    def losses(self, replica: int = 0) -> list[tuple[int, float]]:
        return [(e.step, e.loss) for e in self.steps(replica)]

    def identity_checks(self) -> list[ReplicasIdentical]:
        return self.events.events(ReplicasIdentical)  # type: ignore[return-value]

    def recoveries(self) -> list[Recovery]:
        """One :class:`Recovery` per failure, with its phases and the survivors' figures."""
        return self._fold().recoveries

    def summary(self) -> dict[str, Any]:
        """The run in figures. ``state`` is "stopped" (its log ends with run_stopped),
        "interrupted" (a reopened log without it: the controller died, or writes elsewhere
        still), "running" (a live run) or "not started" (no run_started); ``last_event_t`` is
        when the log last heard anything; ``skipped_lines`` counts lines of a reopened log that
        were no event (``self.events.skipped`` has the first ones' numbers and reasons)."""
        fold = self._fold()
        first = [e.loss for e in fold.steps[:3]]
        last = [e.loss for e in fold.steps[-3:]]
        return {
            "committed_steps": max((e.step for e in fold.steps), default=0),
            "loss_start": statistics.mean(first) if first else None,
            "loss_end": statistics.mean(last) if last else None,
            "failures": len(fold.recoveries),
            "identity_checks": [(e.step, e.identical) for e in fold.identity],
            "state": _run_state(fold, self.events.reopened),
            "last_event_t": fold.last_t,
            "skipped_lines": self.events.skipped_lines,
        }

    def live_groups(self) -> list[tuple[float, int]]:
        """How many groups were training, over time: (t, count) at every change."""
        states: dict[int, str] = {}
        out: list[tuple[float, int]] = []
        for e in self.events.events(ReplicaState):
            states[e.replica] = e.state  # type: ignore[attr-defined]
            count = sum(1 for s in states.values() if s == "training")
            if not out or out[-1][1] != count:
                out.append((e.t, count))
        return out

    def time_at_group_counts(self) -> dict[int, float]:
        """Seconds the run spent with each number of training groups (between its first and
        last change; the stop itself is not counted)."""
        points = [(t, n) for t, n in self.live_groups()]
        stopped = self.events.events(RunStopped)
        last = self.events.last()
        end = stopped[-1].t if stopped else (last.t if last is not None else None)
        spent: dict[int, float] = {}
        for (t, n), nxt in zip(points, [p[0] for p in points[1:]] + [end]):
            if nxt is not None and n > 0:
                spent[n] = spent.get(n, 0.0) + max(0.0, nxt - t)
        return dict(sorted(spent.items()))

    def mean_losses(self) -> dict[int, float]:
        """The committed loss at each step, averaged over the groups that committed it."""
        return _mean_loss_by_step(self.steps())

    def band(self, *, window: int = 20, k: float = 3.0, floor: float = 0.05) -> dict[int, tuple[float, float]]:
        """This run as a reference: the (centre, half width) of :meth:`loss_band`'s band at each
        step it can be drawn for (at least 3 of the run's steps within ``window // 2``)."""
        ref = self.mean_losses()
        steps = sorted(ref)
        drawn = {step: _band_at(ref, steps, step, window, k, floor) for step in steps}
        return {step: b for step, b in drawn.items() if b is not None}

    def loss_band(self, reference: "RunHistory", *, window: int = 20, k: float = 3.0,
                  floor: float = 0.05) -> "LossBand":
        """Did this run's committed loss stay within the band of a run without faults?

        The band at step s is the reference run's mean committed loss over the ``window`` steps
        around s, plus or minus ``k`` times their standard deviation, and never narrower than
        ``floor`` times that mean (step-to-step noise of a tiny model is small but not zero).
        Steps the reference did not reach are not checked."""
        ref = reference.mean_losses()
        steps = sorted(ref)
        outside, checked = [], 0
        for step, loss in sorted(self.mean_losses().items()):
            band = _band_at(ref, steps, step, window, k, floor)
            if band is None:
                continue
            checked += 1
            if abs(loss - band[0]) > band[1]:
                outside.append(step)
        return LossBand(window=window, k=k, floor=floor, checked=checked, outside=outside)

    def dashboard(self) -> Any:
        """A read-only dashboard of this run (the same view a live run shows)."""
        return views.build("dashboard", self.events, controls=None)

    def __repr__(self) -> str:
        s = self.summary()
        state = s["state"]
        if state == "interrupted" and s["last_event_t"] is not None:
            state += f" (no run_stopped; last event at {_when(s['last_event_t'])})"
        skipped = ""
        if s["skipped_lines"]:
            line, reason = self.events.skipped[0]
            skipped = f", {s['skipped_lines']} damaged lines skipped (line {line}: {reason})"
        return (f"RunHistory({self.run_dir}: {state}, {s['committed_steps']} steps, {s['failures']} failures, "
                f"loss {s['loss_start']} -> {s['loss_end']}{skipped})")


def _run_state(fold: _Fold, reopened: bool) -> str:
    if fold.run_mark is None:
        return "not started"
    if fold.run_mark == RunStopped.kind:
        return "stopped"
    return "interrupted" if reopened else "running"


def _when(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):  # a damaged log's time: shown as it is written
        return f"t={t!r} (not a time)"


def _survivor_figures(rec: Recovery, fold: _Fold) -> None:
    """How the groups that stayed up fared while ``rec``'s group was out: commits, and the
    longest gap between two commits (also in units of that group's median step before the
    failure). A group that was itself out at any time in the window is no survivor."""
    t0 = rec.start_t
    if t0 is None:
        return
    t1 = rec.rejoined_t if rec.rejoined_t is not None else (fold.last_t if fold.last_t is not None else t0)
    out = {o.replica for o in fold.recoveries if o is not rec and _overlaps(o, t0, t1, fold.last_t)}
    survivors = sorted(set(fold.commit_times) - {rec.replica} - out)
    rec.survivor_commits_while_down = sum(1 for r in survivors for t in fold.commit_times[r] if t0 <= t <= t1)
    for r in survivors:
        times = fold.commit_times[r]
        before = [b - a for a, b in zip(times, times[1:]) if b < t0]
        typical = statistics.median(before[-20:]) if before else None
        prev = max((t for t in times if t <= t0), default=None)
        window = [t for t in times if t0 < t <= t1]
        if prev is None or not window:
            continue
        pts = [prev] + window
        gap = max(b - a for a, b in zip(pts, pts[1:]))
        if rec.survivor_stall_s is None or gap > rec.survivor_stall_s:
            rec.survivor_stall_s = gap
            rec.survivor_stall_steps = gap / typical if typical else None


def _overlaps(rec: Recovery, t0: float, t1: float, last_t: float | None) -> bool:
    start = rec.start_t
    if start is None:
        return False
    end = rec.rejoined_t if rec.rejoined_t is not None else (last_t if last_t is not None else start)
    return start <= t1 and end >= t0
