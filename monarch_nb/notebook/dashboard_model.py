"""The dashboard's model: what every panel shows, computed from telemetry events alone.

``DashboardModel.apply(event)`` routes one event to the folds it changes, one per topic: the
groups and their health (``dashboard_groups``), the loss curves (``dashboard_curves``), the quorum
(``dashboard_quorum``) and the recoveries with the events list (``dashboard_timeline``); the run
itself (id, start, stop) it keeps here. Views (``health_cells``, ``quorum_summary``, ``plot_data``,
``recoveries``, ``event_log``) are plain data the widgets and the static fallback render. Nothing
here knows about ipywidgets, threads or matplotlib, so a test can feed events and assert on the
result without a kernel, and a reopened run (``EventStore.open``) is redrawn from the same events.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from ..errors import format_ranks
from ..ft.record.recovery import Recovery, RecoveryTracker
from ..ft.settings.faults import FaultKind
from ..telemetry.events import (
    Acquired,
    CallTimedOut,
    Drained,
    Draining,
    Event,
    FailureDetected,
    FaultInjected,
    GaveUp,
    HealCorrupt,
    Healed,
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
    StragglerCleared,
    StragglerDetected,
    TornDown,
    Validated,
    WorkerFailed,
)
from .dashboard_curves import GLOBAL_SETTLE_STEPS, LOSS_KEPT, MARKERS_KEPT, PLOT_POINTS, POINTS_KEPT, Curve, LossCurves, Marker, PlotData
from .dashboard_format import fmt_bytes
from .dashboard_groups import LIVE_SERIES_KEPT, GroupHealth, HealthCell, ReplicaRecord
from .dashboard_quorum import QuorumProgress, QuorumSummary
from .dashboard_timeline import RECOVERIES_KEPT, LogLine, Timeline

__all__ = ["DashboardModel", "FAULT_KINDS", "PANELS", "HEADER", "HEALTH", "QUORUM", "PLOT", "TIMELINE", "CONTROLS",
           "LOGS", "ReplicaRecord", "HealthCell", "QuorumSummary", "Marker", "PlotData", "LogLine", "Curve",
           "POINTS_KEPT", "LOSS_KEPT", "MARKERS_KEPT", "LIVE_SERIES_KEPT", "RECOVERIES_KEPT", "GLOBAL_SETTLE_STEPS",
           "fmt_bytes"]

FAULT_KINDS = tuple(k.value for k in FaultKind)

# Which panels an event can change; the widget layer redraws only those.
HEADER, HEALTH, QUORUM, PLOT, TIMELINE, CONTROLS = "header", "health", "quorum", "plot", "timeline", "controls"
LOGS = "logs"
PANELS = (HEADER, HEALTH, QUORUM, PLOT, TIMELINE, CONTROLS, LOGS)


class DashboardModel:
    """Folds telemetry events into what the dashboard shows. Not thread-safe: callers lock.
    Its memory is bounded whatever the run's length: the folds keep windows (``POINTS_KEPT``,
    ``LOSS_KEPT``, ``MARKERS_KEPT``, ``LIVE_SERIES_KEPT``, ``RECOVERIES_KEPT``), read from this
    module when the model is built.

    Args:
        log_size: lines of the events list kept (newest).
        reopened: a log read back from disk that nothing appends to (``EventStore.open``): a run
            in it without run_stopped is over without having said so - interrupted, not running.
    """

    def __init__(self, *, log_size: int = 200, reopened: bool = False) -> None:
        self.reopened = reopened
        self.run_id: str | None = None
        self.config: dict[str, Any] = {}
        self.started_t: float | None = None
        self.stopped_t: float | None = None
        self.stop_reason: str | None = None
        self.lighthouse: str | None = None  # the torchft Lighthouse's address: its status page
        self.last_event_t: float | None = None
        self.identical: tuple[int, bool] | None = None
        self.events_seen = 0
        self.groups = GroupHealth(series_kept=LIVE_SERIES_KEPT)
        self.curves = LossCurves(points_kept=POINTS_KEPT, loss_kept=LOSS_KEPT, markers_kept=MARKERS_KEPT,
                                 settle_steps=GLOBAL_SETTLE_STEPS)
        self.quorum = QuorumProgress()
        self.timeline = Timeline(log_size=log_size, recoveries_kept=RECOVERIES_KEPT)
        self._recovery: Recovery | None = None  # what the event being applied changed
        self._last_meeting = -1  # LocalSGD / DiLoCo: the newest step the groups met at (one marker each)

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
        self._recovery = self.timeline.track(e)
        changed = {TIMELINE} if self._recovery is not None else set()
        handler = getattr(self, "_on_" + type(e).__name__, None)
        return changed | handler(e) if handler is not None else changed

    def _log(self, e: Event, text: str) -> None:
        self.timeline.note(e, text)

    def _on_RunStarted(self, e: RunStarted) -> set[str]:
        self.run_id = e.run_id
        self.config = dict(e.config or {})
        self.started_t = e.t
        self.stopped_t = None
        self.stop_reason = None
        self.groups.configure(self.config)
        self._log(e, f"run {e.run_id} started")
        return {HEADER, HEALTH, QUORUM, TIMELINE, CONTROLS}

    def _on_LighthouseStarted(self, e: LighthouseStarted) -> set[str]:
        self.lighthouse = e.address
        return {HEADER}

    _on_LighthouseRestarted = _on_LighthouseStarted

    def _on_RunStopped(self, e: RunStopped) -> set[str]:
        self.stopped_t = e.t
        self.stop_reason = e.reason
        self.groups.stop(e.reason)
        self._log(e, f"run stopped ({e.reason})")
        return {HEADER, HEALTH, TIMELINE, CONTROLS, LOGS}

    def _on_ReplicaState(self, e: ReplicaState) -> set[str]:
        rec = self.groups.replica(e.replica, e.t)
        new_replica = rec.state == "starting" and rec.steps_attempted == 0
        self.groups.set_state(rec, e.state, e.detail)
        changed = {HEALTH, CONTROLS} if new_replica else {HEALTH}
        if self.groups.sample_training(e.t):
            changed.add(PLOT)
        return changed

    def _on_SpareState(self, e: SpareState) -> set[str]:
        self.groups.spare(e)
        if e.state in ("taken", "failed", "moved"):  # moved: off a leaving node (node_drains)
            self._log(e, f"spare {e.spare} {e.state}" + (f": {e.detail}" if e.detail else ""))
        return {HEALTH, TIMELINE}

    def _on_Scaled(self, e: Scaled) -> set[str]:
        parts = ([f"added {e.added}"] if e.added else []) + ([f"retired {e.retired}"] if e.retired else [])
        self._log(e, f"scaled to {e.replicas} groups ({', '.join(parts) or 'no change'})")
        return {TIMELINE, HEALTH}

    def _on_Draining(self, e: Draining) -> set[str]:
        self.groups.replica(e.replica, e.t).detail = f"draining: moving to group {e.replacement}"
        self._log(e, f"group {e.replica} draining: group {e.replacement} heals from live peers, then "
                     f"{e.replica} leaves" + (f" ({e.reason})" if e.reason else ""))
        return {HEALTH, TIMELINE}

    def _on_Drained(self, e: Drained) -> set[str]:
        source = "a warm spare" if e.from_spare else "fresh processes"
        self._log(e, f"group {e.replica} moved to group {e.replacement} ({source}) in {e.seconds:.1f} s")
        return {TIMELINE}

    def _on_StragglerDetected(self, e: StragglerDetected) -> set[str]:
        self.groups.replica(e.replica, e.t).detail = f"slow: its own work takes {e.ratio:.1f}x its peers'"
        then = {"drain": "; moving it", "drop": "; letting it go, then replacing it"}.get(e.policy, "")
        self._log(e, f"group {e.replica} is a straggler: {e.ratio:.1f}x slower than its peers over "
                     f"{e.window} steps{then}")
        return {HEALTH, TIMELINE}

    def _on_StragglerCleared(self, e: StragglerCleared) -> set[str]:
        rec = self.groups.replica(e.replica, e.t)
        if rec.detail.startswith("slow:"):
            rec.detail = ""
        self._log(e, f"group {e.replica} keeps up again ({e.ratio:.1f}x)")
        return {HEALTH, TIMELINE}

    def _on_Step(self, e: Step) -> set[str]:
        self.groups.step(e)
        self.quorum.step(e)
        self.curves.add(e)
        if e.synced and e.step > self._last_meeting:  # semi-synchronous: the groups met at this step
            self._last_meeting = e.step
            self.curves.mark(Marker("meeting", e.replica, e.step, e.t, "the groups met"))
        return {HEALTH, QUORUM, PLOT}

    def _on_Validated(self, e: Validated) -> set[str]:
        self.curves.validated(e)
        return {PLOT}

    def _on_Quorum(self, e: Quorum) -> set[str]:
        if self.quorum.is_stale(e):
            return set()
        if self.quorum.formed(e):
            members = ", ".join(str(p) for p in e.participants)
            self._log(e, f"quorum {e.quorum_id}: groups [{members}]")
            changed = {QUORUM, TIMELINE}
        else:
            changed = {QUORUM}
        for p in e.participants:
            if isinstance(p, int):
                self.groups.replica(p)
        return changed

    def _on_FaultInjected(self, e: FaultInjected) -> set[str]:
        rec = self.groups.replica(e.replica)
        step = e.step if e.step is not None else rec.last_step
        self.curves.mark(Marker("fault", e.replica, step, e.t, e.fault))
        self._log(e, f"fault '{e.fault}' injected into group {e.replica} rank {e.rank}"
                     + (f" at step {step}" if step is not None else ""))
        return {PLOT, TIMELINE, HEALTH}

    def _on_FailureDetected(self, e: FailureDetected) -> set[str]:
        rec = self.groups.replica(e.replica, e.t)
        if self._recovery is None:
            return set()  # Monarch reports a dead process more than once; it is the same failure
        if self._recovery.fault is None:  # nobody injected it: mark it on the curve
            self.curves.mark(Marker("failure", e.replica, rec.last_step, e.t, e.reason))
        self.groups.set_state(rec, "failed", e.reason)
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
        rec = self.groups.replica(e.replica, e.t)
        if rec.state in ("failed", "respawning"):
            # The process is back; it heals (or joins) next. Explicit ReplicaState wins later.
            self.groups.set_state(rec, "healing", f"respawned (attempt {e.attempt})")
        self._log(e, f"group {e.replica} respawned in {e.seconds:.2f} s (attempt {e.attempt})")
        return {HEALTH, TIMELINE}

    def _on_Healed(self, e: Healed) -> set[str]:
        self.groups.replica(e.replica, e.t)
        self.curves.mark(Marker("heal", e.replica, e.step, e.t,
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
        rec = self.groups.replica(e.replica, e.t)
        self.groups.set_state(rec, "training")
        took = f" {e.seconds_since_failure:.2f} s after the failure" if e.seconds_since_failure is not None else ""
        self._log(e, f"group {e.replica} rejoined at step {e.step}{took}")
        return {HEALTH, TIMELINE}

    def _on_GaveUp(self, e: GaveUp) -> set[str]:
        rec = self.groups.replica(e.replica, e.t)
        self.groups.set_state(rec, "failed", f"gave up after {e.attempts} attempts")
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
        # a late answer is not a failure (a group starting up answers its first polls late): say so
        self._log(e, f"{e.mesh}: {e.endpoint} answered late (no answer within {e.timeout_s:g} s from ranks "
                     f"{format_ranks(e.missing_ranks)}{again}); not a failure unless one is reported")
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
        return self.groups.total

    def health_cells(self, now: float) -> list[HealthCell]:
        """The grid. A failure not yet drawn (see ``mark_drawn``) shows as failed."""
        return self.groups.cells(self.reference_time(now), interrupted=self.interrupted)

    def mark_drawn(self) -> bool:
        """The grid was drawn (see ``GroupHealth.mark_drawn``); True when it needs another frame."""
        return self.groups.mark_drawn()

    def quorum_summary(self) -> QuorumSummary:
        return self.quorum.summary(self.total_groups)

    def loss_series(self) -> dict[int, list[tuple[int, float, bool]]]:
        return self.curves.series()

    def global_loss(self, limit: int | None = None) -> list[tuple[int, float]]:
        """Committed global loss: per step, the mean loss of the groups that committed it."""
        return self.curves.global_loss(limit)

    def point_count(self) -> int:
        return self.curves.point_count()

    def plot_data(self, limit: int = PLOT_POINTS) -> PlotData:
        """A sampled copy for the plot: O(limit) per group whatever the run's length."""
        return self.curves.plot_data(self.quorum.global_step, limit)

    @property
    def recoveries(self) -> list[Recovery]:
        """Every failure and its recovery, as the one recovery model defines them."""
        return self.timeline.recoveries

    def event_log(self, last: int = 20) -> list[LogLine]:
        return self.timeline.last(last)

    # ---- the folds' state that readers use, under the names it had before the split ----

    @property
    def replicas(self) -> dict[int, ReplicaRecord]:
        return self.groups.replicas

    @property
    def training(self) -> int:
        return self.groups.training

    @property
    def live_series(self) -> deque[tuple[float, int]]:
        return self.groups.live_series

    @property
    def spares(self) -> dict[int, tuple[str, str]]:
        return self.groups.spares

    @property
    def loss(self) -> dict[int, deque[tuple[int, float, bool]]]:
        return self.curves.loss

    @property
    def committed(self) -> dict[int, Curve]:
        return self.curves.committed

    @property
    def markers(self) -> deque[Marker]:
        return self.curves.markers

    @property
    def steps_committed(self) -> int:
        return self.quorum.steps_committed

    @property
    def global_step(self) -> int | None:
        return self.quorum.global_step

    @property
    def log(self) -> deque[LogLine]:
        return self.timeline.log

    @property
    def tracker(self) -> RecoveryTracker:
        return self.timeline.tracker
