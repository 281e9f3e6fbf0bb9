"""The dashboard model's fold of replica groups: each group's state, as the health grid shows it.

Process state is per replica group (the FT run reports ``ReplicaState`` per group) and shown
on every rank of the group; the rank that actually died is named in the failed cell's detail.
A failure is shown for at least one frame even when the group has moved on before the throttled
redraw (``mark_drawn``), warm spares wait beside the grid, and ``live_series`` (groups training
over wall time) is the strip under the loss plot. ``DashboardModel`` routes events here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ..ft.settings.config import meeting_period
from ..telemetry.events import SpareState, Step
from .palette import StateStyle, style_of

# Group states that claim something is happening now (an interrupted run cannot claim them).
_ACTIVE_STATES = ("starting", "training", "respawning", "healing")
LIVE_SERIES_KEPT = 2000


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
    inner: str = ""  # LocalSGD / DiLoCo: where the group is in its inner loop ("inner step 3 of 10")

    @property
    def text(self) -> str:
        """Everything the cell says, as words (what a colour-blind reader relies on)."""
        step = "-" if self.last_committed_step is None else str(self.last_committed_step)
        age = "-" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.1f} s ago"
        parts = [f"group {self.replica} rank {self.rank}", f"{self.style.glyph} {self.style.label}",
                 f"step {step}", f"seen {age}"]
        if self.inner:
            parts.append(self.inner)
        if self.detail:
            parts.append(self.detail)
        return " | ".join(parts)


def run_meeting_period(config: dict[str, Any]) -> int | None:
    """Steps between two meetings of the run whose config (as its log has it) is ``config``."""
    return meeting_period(config.get("sync"), config.get("sync_every"), config.get("fragments"))


class GroupHealth:
    """Every replica group's record, the warm spares, and how many groups train over time.
    Not thread-safe: the model's callers lock.

    Args:
        series_kept: points kept of ``live_series`` (one per change of the training count).
    """

    def __init__(self, *, series_kept: int = LIVE_SERIES_KEPT) -> None:
        self.replicas: dict[int, ReplicaRecord] = {}
        self.group_size = 1
        self.meet_every: int | None = None  # LocalSGD / DiLoCo: steps between meetings
        self.configured_replicas: int | None = None
        self.live_series: deque[tuple[float, int]] = deque(maxlen=series_kept)  # (t, groups training)
        self.training = 0  # groups in state "training" now (kept by set_state: no scan per event)
        self.spares: dict[int, tuple[str, str]] = {}  # warm spare -> (state, detail), while it waits
        self._unseen: set[int] = set()  # groups with a failure not drawn yet (see mark_drawn)

    def replica(self, replica: int, t: float | None = None) -> ReplicaRecord:
        """The group's record (created on first mention); ``t`` is when it was last heard from."""
        rec = self.replicas.get(replica)
        if rec is None:
            rec = self.replicas[replica] = ReplicaRecord(replica)
        if t is not None:
            rec.last_seen_t = t if rec.last_seen_t is None else max(rec.last_seen_t, t)
        return rec

    def set_state(self, rec: ReplicaRecord, state: str, detail: str = "") -> None:
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

    def configure(self, config: dict[str, Any]) -> None:
        """The run's configured groups (``replicas``: a count or a list of ids) and group size."""
        reps = config.get("replicas")
        if isinstance(reps, int):
            ids: list[int] = list(range(reps))
        elif isinstance(reps, (list, tuple)):
            ids = [int(r) for r in reps]
        else:
            ids = []
        if ids:
            self.configured_replicas = len(ids)
        for r in ids:
            self.replica(r)
        gs = config.get("group_size")
        if isinstance(gs, int) and gs > 0:
            self.group_size = gs
        self.meet_every = run_meeting_period(config)


    def stop(self, reason: str) -> None:
        """The run stopped: every group still in it is stopped (a group given up on stays so)."""
        for rec in self.replicas.values():
            if rec.state not in ("gave_up", "finished") and not (rec.state == "failed" and "gave up" in rec.detail):
                self.set_state(rec, "stopped", reason if reason != "stopped" else "")

    def sample_training(self, t: float) -> bool:
        """Record the number of groups training at ``t`` if it changed; whether it did."""
        if not self.live_series or self.live_series[-1][1] != self.training:
            self.live_series.append((t, self.training))
            return True
        return False

    def spare(self, e: SpareState) -> None:
        if e.state in ("building", "ready"):
            self.spares[e.spare] = (e.state, e.detail)
        else:
            self.spares.pop(e.spare, None)

    def step(self, e: Step) -> None:
        rec = self.replica(e.replica, e.t)
        rec.steps_attempted += 1
        rec.last_step = e.step
        rec.last_loss = e.loss
        rec.tokens_per_s = e.tokens_per_s
        if e.committed:
            rec.steps_committed += 1
            if rec.last_committed_step is None or e.step > rec.last_committed_step:
                rec.last_committed_step = e.step
            # A committed step proves the group is training again (covers runs that do not
            # report every state change); a group marked failed stays failed until told.
            if rec.state in ("starting", "healing", "respawning"):
                self.set_state(rec, "training")

    @property
    def total(self) -> int:
        """Groups known or configured, whichever is more."""
        known = len(self.replicas)
        return max(known, self.configured_replicas or 0)

    def cells(self, ref: float, *, interrupted: bool) -> list[HealthCell]:
        """The grid, heartbeat ages taken at ``ref``. A failure not yet drawn (see ``mark_drawn``)
        shows as failed; an ``interrupted`` run's groups claim nothing happening now."""
        cells = []
        for replica in sorted(self.replicas):
            rec = self.replicas[replica]
            age = None if rec.last_seen_t is None else max(0.0, ref - rec.last_seen_t)
            state = "failed" if rec.unseen_failure is not None else rec.state
            was = None
            if interrupted and state in _ACTIVE_STATES:
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
                                        detail, style_of(state), self._inner(state, rec.last_committed_step)))
        return cells

    def _inner(self, state: str, step: int | None) -> str:
        if self.meet_every is None or step is None or state != "training":
            return ""
        return f"inner step {step % self.meet_every} of {self.meet_every}"

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
