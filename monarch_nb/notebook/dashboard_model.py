"""The dashboard's model: what every panel shows, computed from telemetry events alone.

``DashboardModel.apply(event)`` folds one event into plain Python state; the views
(``health_cells``, ``quorum_summary``, ``loss_series``, ``markers``, ``recoveries``,
``event_log``) are what the widgets and the static fallback render. Nothing here knows about
ipywidgets, threads or matplotlib, so a test can feed a sequence of events and assert on the
result without a kernel, and a reopened run (``EventStore.open``) is redrawn from the same
events a live run produced.

Process state is per replica group (the FT run reports ``ReplicaState`` per group) and shown
on every rank of the group; the rank that actually died is named in the failed cell's detail.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import format_ranks
from ..ft.record.recovery import Recovery, RecoveryTracker
from ..ft.spec.faults import FaultKind
from ..telemetry.events import (
    Acquired,
    CallTimedOut,
    Event,
    FailureDetected,
    FaultInjected,
    GaveUp,
    HealCorrupt,
    Healed,
    LighthouseRestarted,
    LighthouseStarted,
    MeshDown,
    MeshUp,
    Quorum,
    Rejoined,
    ReplicasIdentical,
    ReplicaState,
    Respawned,
    RunStarted,
    RunStopped,
    Scaled,
    SpareState,
    Step,
    TornDown,
    WorkerFailed,
)
from .palette import StateStyle, style_of

FAULT_KINDS = tuple(k.value for k in FaultKind)
# Group states that claim something is happening now (an interrupted run cannot claim them).
_ACTIVE_STATES = ("starting", "training", "respawning", "healing")


@dataclass
class ReplicaRecord:
    replica: int
    state: str = "starting"
    detail: str = ""
    failed_rank: int | None = None
    last_step: int | None = None
    last_committed_step: int | None = None
    last_loss: float | None = None
    tokens_per_s: float | None = None
    last_seen_t: float | None = None
    steps_attempted: int = 0
    steps_committed: int = 0
    # A failure not yet drawn: the grid shows it for one frame even if the group has moved on
    # to respawning before the throttled redraw, so no failure is ever invisible.
    unseen_failure: str | None = None
    # Why the group is down (cleared when it trains again): kept visible through the recovery.
    down_reason: str | None = None


@dataclass(frozen=True)
class HealthCell:
    """One process (replica group x rank) as the health grid shows it."""

    replica: int
    rank: int
    state: str
    last_committed_step: int | None
    heartbeat_age_s: float | None
    detail: str
    style: StateStyle

    @property
    def text(self) -> str:
        """Everything the cell says, as words (what a colour-blind reader relies on)."""
        step = "-" if self.last_committed_step is None else str(self.last_committed_step)
        age = "-" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.1f} s ago"
        parts = [f"group {self.replica} rank {self.rank}", f"{self.style.glyph} {self.style.label}",
                 f"step {step}", f"seen {age}"]
        if self.detail:
            parts.append(self.detail)
        return " | ".join(parts)


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


@dataclass(frozen=True)
class Marker:
    """A point of interest on the loss plot: an injected fault, an unplanned failure, a heal."""

    kind: str  # "fault" | "failure" | "heal"
    replica: int
    step: int | None
    t: float
    label: str


@dataclass(frozen=True)
class PlotData:
    """What the loss plot needs, taken under the lock so drawing happens outside it.

    Lines are sampled to at most a few hundred points each (more than the image has pixels
    is wasted work); a ``(nan, nan)`` point breaks a group's line where it was down.
    """

    committed: dict[int, list[tuple[float, float]]]  # per group, committed steps
    dropped: dict[int, list[tuple[int, float]]]  # per group, recent steps that did not commit
    global_loss: list[tuple[int, float]]
    markers: list[Marker]
    point_count: int
    global_step: int | None


@dataclass(frozen=True)
class LogLine:
    t: float
    kind: str
    text: str


# Which panels an event can change; the widget layer redraws only those.
HEADER, HEALTH, QUORUM, PLOT, TIMELINE, CONTROLS = "header", "health", "quorum", "plot", "timeline", "controls"
LOGS = "logs"
PANELS = (HEADER, HEALTH, QUORUM, PLOT, TIMELINE, CONTROLS, LOGS)


# A run of days must not grow the kernel: the model keeps a window of the newest points and a
# thinned history of the older ones (every point is still in the event log).
POINTS_KEPT = 2000  # per group's committed curve and for the global curve, before thinning
LOSS_KEPT = 2000  # every reported (step, loss, committed) per group, newest
MARKERS_KEPT = 600
LIVE_SERIES_KEPT = 2000
RECOVERIES_KEPT = 200
GLOBAL_SETTLE_STEPS = 200  # a step this far behind the newest has every commit it will get


class Curve:
    """One loss line, thinned uniformly to at most about ``2 * cap`` points however long the run:
    when full every other point goes, and from then on one point in ``stride`` is kept. The
    points on both sides of a gap (steps missing) stay, so the line breaks where the data does,
    for the newest ``cap / 4`` gaps (older ones are drawn joined); the newest point is always shown."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = POINTS_KEPT if cap is None else cap
        self.points: list[tuple[int, float]] = []
        self.gaps: list[int] = []  # indexes into points where steps are missing before that point
        self.stride = 1
        self._seen = 0
        self._last: tuple[int, float] | None = None

    def add(self, step: int, loss: float, *, gap: bool = False) -> None:
        """Append a point; ``gap`` marks steps missing before it."""
        if gap and self._last is not None and (not self.points or self.points[-1] is not self._last):
            self.points.append(self._last)  # the point just before the gap
        if gap and self.points:
            self.gaps.append(len(self.points))
        self._seen += 1
        self._last = (step, loss)
        if gap or self._seen % self.stride == 0:
            self.points.append(self._last)
        if len(self.points) > 2 * self.cap:
            self._halve()

    @property
    def last(self) -> tuple[int, float] | None:
        return self._last

    def view(self) -> list[tuple[int, float]]:
        """The kept points and the newest one."""
        if self._last is None or (self.points and self.points[-1] is self._last):
            return self.points
        return [*self.points, self._last]

    def _halve(self) -> None:
        if len(self.gaps) > self.cap // 4:  # the oldest breaks go too: old history is one line
            self.gaps = self.gaps[len(self.gaps) // 2:]
        n = len(self.points)
        keep = sorted(set(range(0, n, 2)) | {n - 1} | {i for g in self.gaps for i in (g - 1, g) if 0 <= i < n})
        where = {old: new for new, old in enumerate(keep)}
        self.points = [self.points[i] for i in keep]
        self.gaps = [where[g] for g in self.gaps]
        self.stride *= 2


class DashboardModel:
    """Folds telemetry events into what the dashboard shows. Not thread-safe: callers lock.
    Its memory is bounded whatever the run's length (see ``POINTS_KEPT``)."""

    def __init__(self, *, log_size: int = 200, reopened: bool = False) -> None:
        # A log read back from disk that nothing appends to (``EventStore.open``): a run in it
        # without run_stopped is over without having said so - interrupted, not running.
        self.reopened = reopened
        self.run_id: str | None = None
        self.config: dict[str, Any] = {}
        self.started_t: float | None = None
        self.stopped_t: float | None = None
        self.stop_reason: str | None = None
        self.lighthouse: str | None = None  # the torchft Lighthouse's address: its status page
        self.last_event_t: float | None = None
        self.replicas: dict[int, ReplicaRecord] = {}
        self.group_size = 1
        self.configured_replicas: int | None = None
        self.quorum_id: int | None = None
        self.quorum_participants: int | None = None
        self.steps_attempted = 0
        self.steps_committed = 0
        self.global_step: int | None = None
        # loss[replica] = the last LOSS_KEPT (step, loss, committed) the group reported
        self.loss: dict[int, deque[tuple[int, float, bool]]] = {}
        # committed[replica] = the group's committed (step, loss), thinned (see Curve)
        self.committed: dict[int, Curve] = {}
        self.dropped: dict[int, deque[tuple[int, float]]] = {}
        self._global_sum: dict[int, list[float]] = {}  # step -> [sum, count] over committed
        self._global_steps: list[int] = []  # the keys of _global_sum, in order
        self._global_settled = Curve()  # older steps' means, thinned
        self.markers: deque[Marker] = deque(maxlen=MARKERS_KEPT)
        self.tracker = RecoveryTracker(keep=RECOVERIES_KEPT)
        self._recovery: Recovery | None = None  # what the event being applied changed
        self.identical: tuple[int, bool] | None = None
        self.live_series: deque[tuple[float, int]] = deque(maxlen=LIVE_SERIES_KEPT)  # (t, groups training)
        self.training = 0  # groups in state "training" now (kept by _set_state: no scan per event)
        self._unseen: set[int] = set()  # groups with a failure not drawn yet (see mark_drawn)
        self._points = 0  # loss points of every group (see point_count)
        self.spares: dict[int, tuple[str, str]] = {}  # warm spare -> (state, detail), while it waits
        self.log: deque[LogLine] = deque(maxlen=log_size)
        self.events_seen = 0

    # ---- folding events ---------------------------------------------------------------

    def apply_all(self, events: Iterable[Event]) -> set[str]:
        changed: set[str] = set()
        for e in events:
            changed |= self.apply(e)
        return changed

    def apply(self, e: Event) -> set[str]:
        """Fold one event in; returns the panels whose content may have changed."""
        self.events_seen += 1
        self.last_event_t = e.t if self.last_event_t is None else max(self.last_event_t, e.t)
        self._recovery = self.tracker.apply(e)
        changed = {TIMELINE} if self._recovery is not None else set()
        handler = getattr(self, "_on_" + type(e).__name__, None)
        return changed | handler(e) if handler is not None else changed

    @property
    def recoveries(self) -> list[Recovery]:
        """Every failure and its recovery, as the one recovery model defines them."""
        return self.tracker.recoveries

    def _replica(self, replica: int, t: float | None = None) -> ReplicaRecord:
        rec = self.replicas.get(replica)
        if rec is None:
            rec = self.replicas[replica] = ReplicaRecord(replica)
        if t is not None:
            rec.last_seen_t = t if rec.last_seen_t is None else max(rec.last_seen_t, t)
        return rec

    def _set_state(self, rec: ReplicaRecord, state: str, detail: str = "") -> None:
        self.training += (state == "training") - (rec.state == "training")
        rec.state = state
        rec.detail = detail
        if state in ("failed", "gave_up"):
            rec.unseen_failure = detail or rec.unseen_failure or "failed"
            self._unseen.add(rec.replica)
            rec.down_reason = detail or rec.down_reason or "failed"
        elif state in ("training", "stopped", "finished"):
            rec.unseen_failure = None
            rec.down_reason = None
            rec.failed_rank = None

    def _log(self, e: Event, text: str) -> None:
        self.log.append(LogLine(e.t, e.kind, text))

    def _on_RunStarted(self, e: RunStarted) -> set[str]:
        self.run_id = e.run_id
        self.config = dict(e.config or {})
        self.started_t = e.t
        self.stopped_t = None
        self.stop_reason = None
        reps = self.config.get("replicas")
        if isinstance(reps, int):
            ids: list[int] = list(range(reps))
        elif isinstance(reps, (list, tuple)):
            ids = [int(r) for r in reps]
        else:
            ids = []
        if ids:
            self.configured_replicas = len(ids)
        for r in ids:
            self._replica(r)
        gs = self.config.get("group_size")
        if isinstance(gs, int) and gs > 0:
            self.group_size = gs
        self._log(e, f"run {e.run_id} started")
        return {HEADER, HEALTH, QUORUM, TIMELINE, CONTROLS}

    def _on_LighthouseStarted(self, e: LighthouseStarted) -> set[str]:
        self.lighthouse = e.address
        return {HEADER}

    _on_LighthouseRestarted = _on_LighthouseStarted

    def _on_RunStopped(self, e: RunStopped) -> set[str]:
        self.stopped_t = e.t
        self.stop_reason = e.reason
        for rec in self.replicas.values():
            if rec.state not in ("gave_up", "finished") and not (rec.state == "failed" and "gave up" in rec.detail):
                self._set_state(rec, "stopped", e.reason if e.reason != "stopped" else "")
        self._log(e, f"run stopped ({e.reason})")
        return {HEADER, HEALTH, TIMELINE, CONTROLS, LOGS}

    def _on_ReplicaState(self, e: ReplicaState) -> set[str]:
        rec = self._replica(e.replica, e.t)
        new_replica = rec.state == "starting" and rec.steps_attempted == 0
        self._set_state(rec, e.state, e.detail)
        changed = {HEALTH, CONTROLS} if new_replica else {HEALTH}
        if not self.live_series or self.live_series[-1][1] != self.training:
            self.live_series.append((e.t, self.training))
            changed.add(PLOT)
        return changed

    def _on_SpareState(self, e: SpareState) -> set[str]:
        if e.state in ("building", "ready"):
            self.spares[e.spare] = (e.state, e.detail)
        else:
            self.spares.pop(e.spare, None)
        if e.state in ("taken", "failed"):
            self._log(e, f"spare {e.spare} {e.state}" + (f": {e.detail}" if e.detail else ""))
        return {HEALTH, TIMELINE}

    def _on_Scaled(self, e: Scaled) -> set[str]:
        parts = ([f"added {e.added}"] if e.added else []) + ([f"retired {e.retired}"] if e.retired else [])
        self._log(e, f"scaled to {e.replicas} groups ({', '.join(parts) or 'no change'})")
        return {TIMELINE, HEALTH}

    def _on_Step(self, e: Step) -> set[str]:
        rec = self._replica(e.replica, e.t)
        rec.steps_attempted += 1
        self.steps_attempted += 1
        if not e.committed:
            self.dropped.setdefault(e.replica, deque(maxlen=200)).append((e.step, e.loss))
        rec.last_step = e.step
        rec.last_loss = e.loss
        rec.tokens_per_s = e.tokens_per_s
        self.loss.setdefault(e.replica, deque(maxlen=LOSS_KEPT)).append((e.step, e.loss, e.committed))
        self._points += 1
        changed = {HEALTH, QUORUM, PLOT}
        if e.committed:
            rec.steps_committed += 1
            self.steps_committed += 1
            if rec.last_committed_step is None or e.step > rec.last_committed_step:
                rec.last_committed_step = e.step
            if self.global_step is None or e.step > self.global_step:
                self.global_step = e.step
            curve = self.committed.get(e.replica)
            if curve is None:
                curve = self.committed[e.replica] = Curve()
            curve.add(e.step, e.loss, gap=curve.last is not None and e.step > curve.last[0] + 1)
            acc = self._global_sum.get(e.step)
            settled = self._global_settled.last
            if acc is None and settled is not None and e.step <= settled[0]:
                acc = [0.0, 0]  # a commit of a step already settled into the history: not drawn
            elif acc is None:
                acc = self._global_sum[e.step] = [0.0, 0]
                if self._global_steps and e.step < self._global_steps[-1]:
                    bisect.insort(self._global_steps, e.step)
                else:
                    self._global_steps.append(e.step)
                if len(self._global_steps) > 2 * POINTS_KEPT:
                    self._settle_global()
            acc[0] += e.loss
            acc[1] += 1
            # A committed step proves the group is training again (covers runs that do not
            # report every state change); a group marked failed stays failed until told.
            if rec.state in ("starting", "healing", "respawning"):
                self._set_state(rec, "training")
        if e.quorum_id is not None and (self.quorum_id is None or e.quorum_id >= self.quorum_id):
            self.quorum_id = e.quorum_id
            if e.participants is not None:
                self.quorum_participants = e.participants
        return changed

    def _on_Quorum(self, e: Quorum) -> set[str]:
        if self.quorum_id is not None and e.quorum_id < self.quorum_id:
            return set()
        if e.quorum_id != self.quorum_id:
            members = ", ".join(str(p) for p in e.participants)
            self._log(e, f"quorum {e.quorum_id}: groups [{members}]")
            changed = {QUORUM, TIMELINE}
        else:
            changed = {QUORUM}
        self.quorum_id = e.quorum_id
        self.quorum_participants = len(e.participants)
        for p in e.participants:
            if isinstance(p, int):
                self._replica(p)
        return changed

    def _on_FaultInjected(self, e: FaultInjected) -> set[str]:
        rec = self._replica(e.replica)
        step = e.step if e.step is not None else rec.last_step
        self.markers.append(Marker("fault", e.replica, step, e.t, e.fault))
        self._log(e, f"fault '{e.fault}' injected into group {e.replica} rank {e.rank}"
                     + (f" at step {step}" if step is not None else ""))
        return {PLOT, TIMELINE, HEALTH}

    def _on_FailureDetected(self, e: FailureDetected) -> set[str]:
        rec = self._replica(e.replica, e.t)
        if self._recovery is None:
            return set()  # Monarch reports a dead process more than once; it is the same failure
        if self._recovery.fault is None:  # nobody injected it: mark it on the curve
            self.markers.append(Marker("failure", e.replica, rec.last_step, e.t, e.reason))
        self._set_state(rec, "failed", e.reason)
        rec.failed_rank = e.rank
        who = f"group {e.replica}" + (f" rank {e.rank}" if e.rank is not None else "")
        took = f" after {e.detection_s:.2f} s" if e.detection_s is not None else ""
        self._log(e, f"failure of {who} detected{took}: {e.reason}")
        return {HEALTH, TIMELINE}

    def _on_TornDown(self, e: TornDown) -> set[str]:
        self._log(e, f"group {e.replica} torn down in {e.seconds:.2f} s")
        return {TIMELINE}

    def _on_Acquired(self, e: Acquired) -> set[str]:
        self._log(e, f"group {e.replica}: processes up ({e.how}) in {e.seconds:.2f} s")
        return {TIMELINE}

    def _on_Respawned(self, e: Respawned) -> set[str]:
        rec = self._replica(e.replica, e.t)
        if rec.state in ("failed", "respawning"):
            # The process is back; it heals (or joins) next. Explicit ReplicaState wins later.
            self._set_state(rec, "healing", f"respawned (attempt {e.attempt})")
        self._log(e, f"group {e.replica} respawned in {e.seconds:.2f} s (attempt {e.attempt})")
        return {HEALTH, TIMELINE}

    def _on_Healed(self, e: Healed) -> set[str]:
        self._replica(e.replica, e.t)
        self.markers.append(Marker("heal", e.replica, e.step, e.t,
                                   f"from {e.source_replica}" if e.source_replica is not None else "healed"))
        donors = e.sources
        src = f" from group{'s' if len(donors) > 1 else ''} {', '.join(str(d) for d in donors)}" if donors else ""
        rate = f" ({e.gbps:.2f} GB/s)" if e.gbps else ""
        why = f" ({e.cause})" if e.needless else ""
        self._log(e, f"group {e.replica} healed{src} at step {e.step}: "
                     f"{fmt_bytes(e.bytes)} in {e.seconds:.2f} s{rate}{why}")
        return {PLOT, TIMELINE, HEALTH}

    def _on_HealCorrupt(self, e: HealCorrupt) -> set[str]:
        again = (f"refetched from group {e.refetched_from}" if e.refetched_from is not None
                 else "no other donor had it: the heal failed and is retried")
        self._log(e, f"group {e.replica} rank {e.rank}: a piece of {e.tensor} from group {e.donor} failed its "
                     f"digest check; {again}")
        return set()

    def _on_Rejoined(self, e: Rejoined) -> set[str]:
        rec = self._replica(e.replica, e.t)
        self._set_state(rec, "training")
        took = f" {e.seconds_since_failure:.2f} s after the failure" if e.seconds_since_failure is not None else ""
        self._log(e, f"group {e.replica} rejoined at step {e.step}{took}")
        return {HEALTH, TIMELINE}

    def _on_GaveUp(self, e: GaveUp) -> set[str]:
        rec = self._replica(e.replica, e.t)
        self._set_state(rec, "failed", f"gave up after {e.attempts} attempts")
        self._log(e, f"gave up on group {e.replica} after {e.attempts} attempts")
        return {HEALTH, TIMELINE}

    def _on_WorkerFailed(self, e: WorkerFailed) -> set[str]:
        if e.late:  # an old log's account of a process already torn down: not a failure of its own
            return set()
        who = e.mesh + (f" rank {e.rank}" if e.rank is not None else "")
        self._log(e, f"{who} failed: {e.reason}")
        return {TIMELINE}

    def _on_MeshUp(self, e: MeshUp) -> set[str]:
        shape = "x".join(str(v) for v in e.shape.values()) or "?"
        self._log(e, f"mesh {e.mesh} up ({shape} procs) in {e.seconds:.2f} s")
        return {TIMELINE}

    def _on_MeshDown(self, e: MeshDown) -> set[str]:
        self._log(e, f"mesh {e.mesh} down")
        return {TIMELINE}

    def _on_CallTimedOut(self, e: CallTimedOut) -> set[str]:
        again = f", {e.repeats} calls" if e.repeats > 1 else ""
        self._log(e, f"{e.endpoint} timed out after {e.timeout_s:g} s (ranks {format_ranks(e.missing_ranks)}{again})")
        return {TIMELINE}

    def _on_ReplicasIdentical(self, e: ReplicasIdentical) -> set[str]:
        self.identical = (e.step, e.identical)
        self._log(e, f"step {e.step}: replicas {'bit-identical' if e.identical else 'DIFFER'}"
                     f" ({len(e.hashes)} hashes)")
        return {TIMELINE, HEADER}

    # ---- views ------------------------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        """A reopened run whose log ends without run_stopped: its controller died (or another
        process still writes it); either way nothing here will move, so it must not look live."""
        return self.reopened and self.started_t is not None and self.stopped_t is None

    @property
    def live(self) -> bool:
        return self.started_t is not None and self.stopped_t is None and not self.interrupted

    def reference_time(self, now: float) -> float:
        """'Now' for heartbeat ages: the wall clock while live, the stop time once stopped, the
        last event of an interrupted run (all the log knows)."""
        if self.stopped_t is not None:
            return self.stopped_t
        if self.interrupted and self.last_event_t is not None:
            return self.last_event_t
        return now

    @property
    def total_groups(self) -> int:
        known = len(self.replicas)
        return max(known, self.configured_replicas or 0)

    def health_cells(self, now: float) -> list[HealthCell]:
        """The grid. A failure not yet drawn (see ``mark_drawn``) shows as failed."""
        ref = self.reference_time(now)
        cells = []
        for replica in sorted(self.replicas):
            rec = self.replicas[replica]
            age = None if rec.last_seen_t is None else max(0.0, ref - rec.last_seen_t)
            state = "failed" if rec.unseen_failure is not None else rec.state
            was = None
            if self.interrupted and state in _ACTIVE_STATES:
                state, was = "unknown", state  # the log ends here: no one knows what it does now
            for rank in range(self.group_size):
                detail = rec.detail if was is None else f"was {was} when the log ended (run interrupted)"
                if state == "failed":
                    reason = rec.unseen_failure if rec.state != "failed" else rec.detail
                    if rec.failed_rank is None:
                        detail = reason or ""
                    elif rank == rec.failed_rank:
                        detail = f"rank {rec.failed_rank} died: {reason}"
                    else:
                        detail = f"group down (rank {rec.failed_rank} died)"
                elif rec.down_reason is not None and state in ("respawning", "healing"):
                    detail = f"{rec.detail + '; ' if rec.detail else ''}after failure: {rec.down_reason}"
                cells.append(HealthCell(replica, rank, state, rec.last_committed_step, age,
                                        detail, style_of(state)))
        return cells

    def mark_drawn(self) -> bool:
        """The grid was drawn: failures shown once now show the group's current state.

        Returns True when a drawn failure is already stale (the grid needs another frame).
        """
        stale = False
        for replica in self._unseen:
            rec = self.replicas[replica]
            if rec.unseen_failure is not None:
                stale |= rec.state != "failed"
                rec.unseen_failure = None
        self._unseen.clear()
        return stale

    def quorum_summary(self) -> QuorumSummary:
        return QuorumSummary(self.quorum_id, self.quorum_participants, self.total_groups,
                             self.steps_committed, self.steps_attempted, self.global_step)

    def loss_series(self) -> dict[int, list[tuple[int, float, bool]]]:
        return {r: list(pts) for r, pts in sorted(self.loss.items())}

    def global_loss(self, limit: int | None = None) -> list[tuple[int, float]]:
        """Committed global loss: per step, the mean loss of the groups that committed it (older
        steps thinned, see ``_settle_global``)."""
        points = self._global_settled.view() + [(s, self._global_sum[s][0] / self._global_sum[s][1])
                                                for s in self._global_steps]
        return _sample(points, limit) if limit else points

    def _settle_global(self) -> None:
        """Move the older half of the live global steps into the thinned history. Only steps
        ``GLOBAL_SETTLE_STEPS`` behind the newest move: they have every commit they will get."""
        newest = self._global_steps[-1]
        half = [s for s in self._global_steps[:POINTS_KEPT] if s < newest - GLOBAL_SETTLE_STEPS]
        for s in half:
            total, count = self._global_sum.pop(s)
            self._global_settled.add(s, total / count)
        self._global_steps = self._global_steps[len(half):]

    def point_count(self) -> int:
        return self._points

    def plot_data(self, limit: int = 600) -> PlotData:
        """A sampled copy for the plot: O(limit) per group whatever the run's length."""
        committed = {r: _sample_with_gaps(c.view(), c.gaps, limit) if (c := self.committed.get(r)) else []
                     for r in sorted(self.loss)}
        dropped = {r: list(self.dropped.get(r, ())) for r in sorted(self.loss)}
        return PlotData(committed, dropped, self.global_loss(limit), list(self.markers), self.point_count(),
                        self.global_step)

    def event_log(self, last: int = 20) -> list[LogLine]:
        return list(self.log)[-last:]


def _sample(items: list, limit: int | None) -> list:
    """At most about ``limit`` evenly spaced items, always keeping the last."""
    n = len(items)
    if limit is None or n <= limit:
        return list(items)
    stride = -(-n // limit)
    out = items[::stride]
    if (n - 1) % stride:
        out.append(items[-1])
    return out


def _sample_with_gaps(points: list[tuple[int, float]], gaps: list[int], limit: int) -> list[tuple[float, float]]:
    """Sample ``points`` and put a (nan, nan) break before each index in ``gaps``, keeping the
    points on both sides of every gap so the line ends and restarts where the data does."""
    n = len(points)
    if n == 0:
        return []
    stride = max(1, -(-n // limit))
    if stride == 1 and not gaps:
        return list(points)
    keep = set(range(0, n, stride)) | {n - 1}
    for g in gaps:
        keep.update((g - 1, g))
    gap_set = set(gaps)
    nan = float("nan")
    out: list[tuple[float, float]] = []
    for i in sorted(keep):
        if i in gap_set and out:
            out.append((nan, nan))
        out.append(points[i])
    return out


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"

