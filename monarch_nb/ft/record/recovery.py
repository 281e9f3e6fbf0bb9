"""The one definition of a recovery: which events belong to one failure, and its phases.

A recovery starts when a fault is injected into a replica group or a failure nobody injected
is detected, and ends when the group commits a step again (``rejoined``), the restart policy
gives up, or the group fails again before it got back. :class:`RecoveryTracker` folds events
one at a time (``apply``), so the live dashboard, the run history of a reopened run and the
benchmarks all see the same recoveries from the same rules:

* a second injection before the failure is detected is the same failure, blamed on the first
  fault (the first armed fault fires first);
* a repeated failure report before the respawn (Monarch reports a dead process more than once)
  is the same failure;
* a failure of a group that was already respawned but had not rejoined ends the open recovery
  ("failed again") and starts a new one.

Which phases a recovery has depends on the rungs of the recovery ladder it went through
(``rung_started`` events, ft/control/ladder.py): repaired in place (``communicator``, ``step``):
detect, repair, heal, rejoin; rebuilt at once by the worker whose collective failed
(``repaired.at_once``): repair, heal, rejoin - the controller's detection is not on its path (it
is still ``detection_s``), and the group may commit before the controller knows; its processes
replaced (``process``, ``hosts``, or a log from before the ladder): detect, teardown, acquire,
build, heal, rejoin; escalated from one to the other: all of them. Phases run back to back, each from the previous one's end, so a finished
recovery's phases add up to fault -> first committed step of the victim (``total_s``). A phase whose event is
missing (an older log, or a step that did not happen) has no duration, and the next phase
runs from the last known end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

from ...telemetry.events import (
    Acquired,
    Event,
    FailureDetected,
    FaultInjected,
    GaveUp,
    Healed,
    Rejoined,
    Repaired,
    ReplicasIdentical,
    Respawned,
    RungEscalated,
    RungStarted,
    TornDown,
    WorkerExitReported,
    WorkerFailed,
)
from ..settings.faults import FAILS_NOTHING

# The phases of a recovery in order; each ends with the event named in the docstring of Phase.
PHASES = ("detect", "repair", "teardown", "acquire", "build", "heal", "rejoin")
IN_PLACE_PHASES = ("repair",)  # only when the ladder repaired the group in its own processes
REPLACE_PHASES = ("teardown", "acquire", "build")  # only when its processes were replaced
IN_PLACE_RUNGS = ("communicator", "step")


@dataclass(frozen=True)
class Phase:
    """One phase of a recovery.

    detect: the fault fired -> the controller knew; repair: -> the group's live processes have a
    new communicator (in place), or the attempt escalated; teardown: -> the failed processes are gone;
    acquire: -> processes to replace them are up (spawned, a spare taken, or an allocation);
    build: -> the trainer is constructed and training started; heal: -> the state arrived from
    a peer; rejoin: -> the group committed its first step. ``duration_s`` runs from the previous
    known phase end; ``reported_s`` is what the event itself measured, when it carries one.
    """

    name: str
    t: float | None
    duration_s: float | None
    reported_s: float | None = None


@dataclass
class Recovery:
    """One failure of one replica group and the phases of its recovery."""

    replica: int
    fault: str | None = None  # injected fault kind, None for a failure nobody injected
    rank: int | None = None
    reason: str = ""
    injected_t: float | None = None
    injections: int = 0  # faults injected into the group for this one failure
    detected_t: float | None = None
    detection_s: float | None = None  # fault fired -> detected, when the fault log says when it fired
    detected_by: str | None = None  # supervision, pid, endpoint, trainer, hang, scheduler
    rungs: list[str] | None = None  # the ladder's rungs tried, in order (the last one brought it back)
    escalations: list[str] | None = None  # "communicator -> process: why", one per escalation
    repaired_t: float | None = None
    repair_s: float | None = None  # the in-place repair as the workers measured it
    at_once: bool = False  # the worker rebuilt its communicator itself, before the controller knew
    torn_down_t: float | None = None
    teardown_s: float | None = None
    acquired_t: float | None = None
    acquire_s: float | None = None
    acquired_how: str | None = None  # "spawn", "spare", "allocation"
    respawned_t: float | None = None
    respawn_s: float | None = None  # as the run measured it: acquire + build
    attempts: int = 0
    healed_t: float | None = None
    heal_s: float | None = None
    heal_bytes: int | None = None
    heal_step: int | None = None
    heal_source: int | None = None
    heal_donors: list[int | None] | None = None  # a striped heal: every group that served a part
    heal_gbps: float | None = None  # the state's bytes over the transfer's wall time
    heal_corrupt: int = 0  # pieces that arrived corrupt and were refetched from another donor
    rejoined_t: float | None = None
    rejoined_step: int | None = None
    gave_up: bool = False
    failed_again: bool = False
    identical: bool | None = None  # the first identity check at or after the rejoin
    stack: str | None = None  # a hang: the stuck rank's Python stack when it was detected
    # Filled by RunHistory (needs every group's steps): how the other groups fared meanwhile.
    survivor_commits_while_down: int | None = None
    survivor_stall_s: float | None = None  # longest gap between a survivor's commits
    survivor_stall_steps: float | None = None  # ... in units of that survivor's median step time

    @property
    def start_t(self) -> float | None:
        """When the failure happened: the fault firing if known, else the injection, else detection."""
        if self.detected_t is not None and self.detection_s is not None:
            return self.detected_t - self.detection_s
        return self.injected_t if self.injected_t is not None else self.detected_t

    @property
    def rung(self) -> str | None:
        """The ladder's rung bringing the group back (finished: the one that did); None in a log
        from before the ladder."""
        return self.rungs[-1] if self.rungs else None

    @property
    def rebuilt_at_once(self) -> bool:
        """Repaired in place by the worker whose collective failed, before the controller knew:
        the controller's detection is not on its path (the module docstring)."""
        return self.at_once and self.in_place

    @property
    def in_place(self) -> bool:
        """Repaired in its own processes only (never escalated to replacing them)."""
        return bool(self.rungs) and all(r in IN_PLACE_RUNGS for r in self.rungs or ())

    def phase_names(self) -> tuple[str, ...]:
        """The phases this recovery has (see the module docstring)."""
        if self.rebuilt_at_once:
            return ("repair", "heal", "rejoin")
        tried_in_place = any(r in IN_PLACE_RUNGS for r in self.rungs or ()) or self.repaired_t is not None
        return tuple(p for p in PHASES if (p not in IN_PLACE_PHASES or tried_in_place)
                     and (p not in REPLACE_PHASES or not self.in_place))

    @property
    def finished(self) -> bool:
        return self.rejoined_t is not None or self.gave_up or self.failed_again

    @property
    def status(self) -> str:
        if self.gave_up:
            return "gave up"
        if self.failed_again:
            return "failed again"
        if self.rejoined_t is not None:
            return "recovered"
        if self.detected_t is None:
            return "detecting"
        if self.in_place:
            return "repairing" if self.repaired_t is None else "rejoining"
        if self.respawned_t is None:
            return "respawning"
        if self.healed_t is None:
            return "healing"
        return "rejoining"

    def phases(self) -> list[Phase]:
        ends = {"detect": self.detected_t, "repair": self.repaired_t, "teardown": self.torn_down_t,
                "acquire": self.acquired_t, "build": self.respawned_t, "heal": self.healed_t, "rejoin": self.rejoined_t}
        reported = {"detect": self.detection_s, "repair": self.repair_s, "teardown": self.teardown_s,
                    "acquire": self.acquire_s, "heal": self.heal_s}
        if self.rebuilt_at_once and self.start_t is not None and self.repair_s is not None:
            ends["repair"] = self.start_t + self.repair_s  # the worker's own rebuild, from its failed collective
        if self.rejoined_t is not None:  # the group was back first (a rebuild at once the controller saw
            # late): nothing after the rejoin is on the recovery's path, so the phases add up to the total
            ends = {k: v if v is None or k == "rejoin" else min(v, self.rejoined_t) for k, v in ends.items()}
        out, last = [], self.start_t
        for name in self.phase_names():
            end = ends[name]
            duration = None if end is None or last is None else max(0.0, end - last)
            out.append(Phase(name, end, duration, reported.get(name)))
            if end is not None:
                last = end if last is None else max(last, end)
        return out

    def durations(self) -> dict[str, float | None]:
        return {p.name: p.duration_s for p in self.phases()}

    @property
    def total_s(self) -> float | None:
        """Fault -> first committed step of the victim; the sum of the phases."""
        if self.rejoined_t is None or self.start_t is None:
            return None
        return max(0.0, self.rejoined_t - self.start_t)

    def __str__(self) -> str:
        """What ``print`` shows: the total and the six phases that add up to it (``heal_s`` alone
        is the transfer inside the heal phase), then where the state came from and why."""
        what = f"replica {self.replica}, {self.fault or 'unplanned failure'}" + (
            f" (rank {self.rank})" if self.rank is not None else "")
        total = f"{self.total_s:.2f} s" if self.total_s is not None else "not yet"
        # a phase without a duration: not reached yet, or (once back) it did not happen - no heal
        missing = "?" if self.total_s is None else "none"
        phases = " + ".join(f"{name} {missing if d is None else f'{d:.2f}'}" for name, d in self.durations().items())
        heal = (f"; heal transfer {self.heal_s:.2f} s, {self.heal_bytes / 1e6:.1f} MB from {self.heal_from}"
                + (f" at {self.heal_gbps:.2f} GB/s" if self.heal_gbps else "")
                + (f", {self.heal_corrupt} corrupt piece(s) refetched" if self.heal_corrupt else "")
                if self.heal_s is not None and self.heal_bytes else "")
        how = f", acquired by {self.acquired_how}" if self.acquired_how else ""
        rung = f"; rung {' -> '.join(self.rungs)}" if self.rungs else ""
        seen = (f" {self.detection_s:.2f} s after the fault, beside the rebuild"
                if self.rebuilt_at_once and self.detection_s is not None else "")
        return (f"{what}: {self.status}, total {total} = {phases}{heal}{how}{rung}; "
                f"detected by {self.detected_by or '?'}{seen}: {self.reason}")

    @property
    def heal_sources(self) -> list[int | None]:
        """The groups the heal's state came from (``Healed.sources``)."""
        return self.heal_donors or ([self.heal_source] if self.heal_source is not None else [])

    @property
    def heal_from(self) -> str:
        """Where the heal's state came from: "replica 2", or "replicas 0, 2" for a striped heal."""
        donors = self.heal_sources
        return (f"replica{'s' if len(donors) > 1 else ''} {', '.join(str(d) for d in donors)}"
                if donors else "a peer")

    def row(self) -> dict[str, Any]:
        """One flat row for a table (notebooks, benchmarks): the phases as ``<phase>_s`` columns."""
        return {"replica": self.replica, "fault": self.fault or "unplanned", "status": self.status,
                "rung": self.rung, **{f"{name}_s": seconds for name, seconds in self.durations().items()}, "total_s": self.total_s,
                "acquired_how": self.acquired_how, "heal_MB": self.heal_bytes / 1e6 if self.heal_bytes else None,
                "heal_source": self.heal_source, "heal_donors": self.heal_donors, "heal_GBps": self.heal_gbps,
                "rejoined_step": self.rejoined_step,
                "survivor_commits": self.survivor_commits_while_down, "stall_s": self.survivor_stall_s,
                "stall_steps": self.survivor_stall_steps, "identical": self.identical, "reason": self.reason}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(status=self.status, start_t=self.start_t, total_s=self.total_s, phases=self.durations(),
                    rung=self.rung)
        return data


class RecoveryTracker:
    """Folds events into recoveries, one event at a time (see the module docstring)."""

    def __init__(self, keep: int | None = None) -> None:
        """``keep``: hold at most this many recoveries (the oldest finished ones go; ``dropped``
        counts them). A live view of a run of days keeps a bounded window; history keeps all."""
        self.recoveries: list[Recovery] = []
        self.keep = keep
        self.dropped = 0
        self._open: dict[int, Recovery] = {}
        # A fault injected into a group still recovering ends that recovery as "failed again";
        # kept here with the step the fault was aimed at, because the group may have committed
        # an earlier step first (its Rejoined event, recorded by the controller, then arrives
        # after the injection): that rejoin belongs to the earlier recovery.
        self._superseded: dict[int, tuple[Recovery, int]] = {}

    def apply_all(self, events: Iterable[Event]) -> None:
        for e in events:
            self.apply(e)

    def open_for(self, replica: int) -> Recovery | None:
        return self._open.get(replica)

    def _start(self, replica: int) -> Recovery:
        rec = Recovery(replica)
        self.recoveries.append(rec)
        self._open[replica] = rec
        if self.keep is not None and len(self.recoveries) > self.keep:
            self._forget_oldest()
        return rec

    def _forget_oldest(self) -> None:
        """Drop finished recoveries, oldest first, down to ``keep`` (open ones always stay)."""
        excess = len(self.recoveries) - (self.keep or 0)
        kept = []
        for r in self.recoveries:
            if excess > 0 and r.finished and self._open.get(r.replica) is not r and all(
                    sup is not r for sup, _ in self._superseded.values()):
                excess -= 1
                self.dropped += 1
            else:
                kept.append(r)
        self.recoveries = kept

    def _close(self, rec: Recovery) -> None:
        if self._open.get(rec.replica) is rec:
            del self._open[rec.replica]

    def apply(self, e: Event) -> Recovery | None:
        """Fold one event in; returns the recovery it changed, if any."""
        replica = getattr(e, "replica", None)
        if isinstance(e, ReplicasIdentical):
            return self._identity(e)
        if isinstance(e, WorkerExitReported) or (isinstance(e, WorkerFailed) and e.late):
            return self._explain(e)  # (late worker_failed: logs written before worker_exit_reported)
        if replica is None:
            return None
        rec = self._open.get(replica)
        if isinstance(e, FaultInjected):
            if e.fault in FAILS_NOTHING:  # a corrupt heal is caught and refetched: nothing to recover
                return rec
            if rec is not None and rec.detected_t is None:
                rec.injections += 1  # not detected yet: the same failure, blamed on the first fault
                return rec
            if rec is not None:
                rec.failed_again = True
                self._close(rec)
                if e.step is not None:
                    self._superseded[replica] = (rec, e.step)
            rec = self._start(replica)
            rec.fault, rec.rank, rec.injected_t, rec.injections = e.fault, e.rank, e.t, 1
            return rec
        if isinstance(e, FailureDetected):
            if rec is not None and rec.detected_t is not None and rec.respawned_t is None:
                return None  # reported again before the respawn: the same failure
            if rec is not None and rec.detected_t is not None:
                rec.failed_again = True  # the replacement failed before it rejoined
                self._close(rec)
                rec = None
            if rec is None:
                rec = self._start(replica)
            rec.detected_t, rec.detection_s, rec.reason = e.t, e.detection_s, e.reason
            rec.detected_by = e.source
            rec.stack = e.stack or rec.stack
            rec.rank = e.rank if e.rank is not None else rec.rank
            return rec
        if rec is None:
            return None
        if isinstance(e, RungStarted):
            rec.rungs = [*(rec.rungs or []), e.rung]
        elif isinstance(e, RungEscalated):
            rec.escalations = [*(rec.escalations or []), f"{e.rung} -> {e.to or 'nothing'}: {e.reason}"]
            if e.rung in IN_PLACE_RUNGS and rec.repaired_t is None:  # the repair phase ends with its failure
                rec.repaired_t = e.t
        elif isinstance(e, Repaired):
            rec.repaired_t, rec.repair_s, rec.at_once = e.t, e.seconds, bool(e.at_once)
        elif isinstance(e, TornDown):
            rec.torn_down_t, rec.teardown_s = e.t, e.seconds
        elif isinstance(e, Acquired):
            rec.acquired_t, rec.acquire_s, rec.acquired_how = e.t, e.seconds, e.how
        elif isinstance(e, Respawned):
            rec.respawned_t, rec.respawn_s, rec.attempts = e.t, e.seconds, e.attempt
        elif isinstance(e, Healed):
            rec.healed_t, rec.heal_s, rec.heal_bytes = e.t, e.seconds, e.bytes
            rec.heal_step, rec.heal_source = e.step, e.source_replica
            rec.heal_donors, rec.heal_gbps, rec.heal_corrupt = e.donors, e.gbps, e.corrupt
        elif isinstance(e, Rejoined):
            earlier = self._superseded.pop(replica, None)
            if earlier is not None and e.step < earlier[1]:
                # committed before the new fault's step: the earlier recovery did end in a rejoin
                prev = earlier[0]
                prev.failed_again, prev.rejoined_t, prev.rejoined_step = False, e.t, e.step
                return prev
            rec.rejoined_t, rec.rejoined_step = e.t, e.step
            self._close(rec)
        elif isinstance(e, GaveUp):
            rec.gave_up = True
            self._close(rec)
        else:
            return None
        return rec

    def _explain(self, e: WorkerExitReported | WorkerFailed) -> Recovery | None:
        """Monarch's report of how a process died, arriving after our own pid check acted on it,
        becomes the reason of that recovery when the pid check only knew that the process is
        gone (it could read neither the exit status nor a fault it fired)."""
        digits = e.mesh[len("replica"):]
        if not e.mesh.startswith("replica") or not (digits.isascii() and digits.isdigit()):  # not "replica²"
            return None
        replica = int(digits)
        rec = next((r for r in reversed(self.recoveries) if r.replica == replica), None)
        if rec is None or rec.detected_by != "pid" or rec.detected_t is None or e.t - rec.detected_t > 60:
            return None
        if " is gone (" not in rec.reason:  # the pid check said how it ended; Monarch may say less
            return None
        if "timeout waiting" in e.reason:  # Monarch noticing the processes we tore down: no explanation
            return None
        rec.reason, rec.detected_by = e.reason, "pid, explained by supervision"
        return rec

    def _identity(self, e: ReplicasIdentical) -> Recovery | None:
        changed = None
        for rec in self.recoveries:
            if rec.identical is None and rec.rejoined_step is not None and e.step >= rec.rejoined_step:
                rec.identical = e.identical
                changed = rec
        return changed
