"""The recovery ladder: a failed group is brought back at the lowest rung that can fix what broke.

=============  ==========================================  ==========================================
rung           fixes                                       how
=============  ==========================================  ==========================================
communicator   a live process whose cross-replica          in place, at once (the worker does it,
               communicator broke (the ``comms`` fault)    :func:`communicator_at_once`): torchft's
                                                           error path, still a quorum member; the
                                                           next quorum rebuilds the group with it
step           a live process whose step raised            in place: the step dropped, a new
               (the ``exception`` fault)                   communicator, the same step again
process        a dead or hung process (kill, segfault,     a warm spare, else fresh processes;
               exit, hang, a call that failed)             the new group heals from a live peer
hosts          an allocation or node the scheduler ended   a new allocation; heals from a peer
               (preempt, node_down)
checkpoint     no live peer holds the run's state          every group loads the newest durable
               (every group lost)                          checkpoint (``total_loss.py``)
=============  ==========================================  ==========================================

A failure enters at the lowest rung that can fix it (:func:`entry_rung`, from what the detector
saw: a stalled trainer names its cause; a dead process or an ended allocation start higher). A
rung that fails or does not bring the group back within its bound escalates to the next one up
(:data:`ESCALATES_TO`), with the reason; ``RunConfig.lowest_rung="process"`` skips the in-place
rungs (every fault replaces the process: the reference run's way). Each attempt is a
``rung_started`` event and each escalation a ``rung_escalated`` one; the group's ``rung`` says
where it is. Controller side: runs in the failed group's supervisor thread.
"""

from __future__ import annotations

import time
from typing import ClassVar

from ...telemetry.events import FailureDetected, GaveUp, Respawned, RungEscalated, RungStarted
from .groups import FAILED, GAVE_UP, HEALING, REPAIRING, RESPAWNING, TRAINING, Failure, ReplicaGroup
from ..settings.config import RunConfig
from .means import ResponseMeans

RUNGS = ("communicator", "step", "process", "hosts", "checkpoint")
ESCALATES_TO = {"communicator": "process", "step": "process", "process": None, "hosts": None}
IN_PLACE_CAUSES = {"comms": "communicator", "exception": "step"}  # a stalled trainer's cause -> its rung


def communicator_at_once(config: RunConfig) -> bool:
    """Whether a worker whose own collective failed rebuilds its communicator at once, before
    this controller has seen the stall: exactly when a ``comms`` fault enters at
    ``communicator`` (:func:`entry_rung`). The controller still climbs the ladder from the
    stall it sees (its repair call collects the rebuild, or escalates), and the others' next
    quorum waits for the rebuild alone, not for the next poll."""
    return config.on_failure == "peer" and in_place_rung("comms", config) is not None


def in_place_rung(cause: str | None, config: RunConfig) -> str | None:
    """The in-place rung for a stalled trainer's ``cause``, if the ladder may start below
    ``process`` (``config.lowest_rung``). ``communicator`` at any group size and under LocalSGD /
    DiLoCo: torchft's error path fails the step's commit (or the meeting's) in every rank of
    every group and the next quorum rebuilds each rank's process group, the broken rank's
    included; the Manager, which their optimizer hooks hold, is kept. ``step`` only for one
    process per group under per-step sync: the other ranks of a group whose step raised wait in
    that step's collectives, so the group is replaced, and a semi-synchronous step that raised
    may have half-moved its optimizer."""
    rung = IN_PLACE_CAUSES.get(cause or "")
    if config.lowest_rung != "communicator" or rung is None:
        return None
    if rung == "step" and (config.group_size > 1 or config.sync != "step"):
        return None
    return rung


def entry_rung(failure: Failure, config: RunConfig, allocation_gone: bool) -> str:
    """The lowest rung that can fix ``failure``: in place for a stalled trainer
    (:func:`in_place_rung`), ``hosts`` when the scheduler ended the group's allocation, else
    ``process``."""
    if allocation_gone:
        return "hosts"
    return in_place_rung(failure.cause, config) or "process"


class Rung:
    """One way of bringing a group back. ``attempt`` returns None once it has (or has handed
    the group to what follows: a respawned group's heal and rejoin), else why it could not."""

    name: ClassVar[str]

    def __init__(self, means: ResponseMeans) -> None:
        self.means = means

    def attempt(self, g: ReplicaGroup, failure: Failure) -> str | None:
        raise NotImplementedError


class InPlaceRung(Rung):
    """Rungs ``communicator`` and ``step``: the group's processes are alive and keep their model,
    optimizer and step; each rank gets a new communicator and drops the step that broke. Fixed
    when the group commits a step again within ``repair_timeout_s``."""

    def attempt(self, g: ReplicaGroup, failure: Failure) -> str | None:
        means = self.means
        bound = means.config.repair_timeout_s
        deadline = time.monotonic() + bound
        means.set_state(g, REPAIRING, failure.reason[:200])
        try:
            means.repair(g, bound)
        except Exception as exc:  # a repair that raised or did not answer within the bound
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            cause = lines[-1] if lines else type(exc).__name__  # a remote error ends with its own
            return f"the repair failed or did not answer within {bound:g} s: {cause[:240]}"
        means.groups.clear_failure(g)  # the stall's reports (its notice's echo) are handled: news from here on
        means.groups.touch(g, time.monotonic())  # it answered: its silence counts from here, not from the stall
        means.set_state(g, HEALING, "repaired in place; rejoins at its next committed step")
        while time.monotonic() < deadline:
            if means.stopping.is_set() or means.closed():
                return None
            result = means.poll(g, max(0.2, min(1.0, deadline - time.monotonic())))
            if g.state == TRAINING:  # the poll carried its first committed step: rejoined
                return None
            told = means.groups.take_failure(g)
            if told is not None:
                return f"it failed again while rejoining: {told.reason[:200]}"
            if result.errors:
                rank, err = sorted(result.errors.items())[0]
                return f"rank {rank} stopped answering after the repair: {type(err).__name__}: {str(err)[:200]}"
            stalled = [v.get("failure") for v in result.values.values() if v.get("state") in ("stalled", "failed")]
            if stalled:
                return f"it stalled again after the repair: {stalled[0]}"
            means.stopping.wait(0.05)
        return f"repaired, but no committed step within {bound:g} s"


class CommunicatorRung(InPlaceRung):
    name = "communicator"


class StepRung(InPlaceRung):
    name = "step"


class ProcessRung(Rung):
    """The group's processes are torn down and replaced (a warm spare, or fresh processes as
    often as ``RunConfig.respawn`` allows); the new group heals from a live peer at its first
    quorum, and its first committed step is its rejoin (recorded by the supervisor's polls)."""

    name = "process"

    def attempt(self, g: ReplicaGroup, failure: Failure) -> str | None:
        means = self.means
        means.set_state(g, FAILED, failure.reason[:200])
        means.identity.left_out(g.index)  # its digests at a checked step will never come
        backoff = means.config.respawn
        while not means.stopping.is_set() and not means.closed():
            means.teardown(g)
            if not backoff.allows(g.in_a_row + 1):
                means.emit(GaveUp(replica=g.index, attempts=g.in_a_row))
                means.set_state(g, GAVE_UP, f"after {g.in_a_row} attempts in a row")
                return None
            if means.finish_if_run_is_over(g):
                return None
            in_a_row = means.groups.failed_again(g)  # reset when the group rejoins: a cause that persists backs off
            delay = backoff.wait_before(in_a_row)
            if delay:
                means.set_state(g, FAILED, f"attempt {g.attempts + 1} in {delay:g} s (attempt {in_a_row} in a row)")
                if means.stopping.wait(delay):
                    return None
            attempt = means.groups.begin_attempt(g)
            means.set_state(g, RESPAWNING, f"attempt {attempt}")
            t0 = time.time()
            try:
                means.acquire(g, t0)
                if means.stopping.is_set():
                    return None
                means.start_training(g, min_step=means.progress())
            except Exception as e:  # the respawn itself failed: counts as an attempt, try again
                if means.stopping.is_set():
                    return None
                means.emit(FailureDetected(replica=g.index, rank=None, reason=f"respawn failed: {e}"[:300]))
                means.set_state(g, FAILED, f"respawn attempt {attempt} failed")
                continue
            means.emit(Respawned(replica=g.index, attempt=attempt, seconds=time.time() - t0))
            means.set_state(g, HEALING)
            means.groups.touch(g, time.monotonic())
            return None
        return None


class HostsRung(ProcessRung):
    """The scheduler ended the group's allocation (preempted, node down): the same replacement,
    on a new allocation (the launcher asks the scheduler for one)."""

    name = "hosts"


class Ladder:
    """Climbs from a failure's entry rung until one brings the group back (see the module
    docstring). The ``checkpoint`` rung is entered by :class:`~.total_loss.TotalLoss`."""

    def __init__(self, means: ResponseMeans) -> None:
        self.means = means
        self.rungs: dict[str, Rung] = {r.name: r(means) for r in (CommunicatorRung, StepRung, ProcessRung, HostsRung)}

    def action(self, cause: str | None = None) -> str:
        """What happens after a failure of this ``cause``, as its notice says it."""
        spare = " (a warm spare if one is ready)" if self.means.spares is not None else ""
        config = self.means.config
        if in_place_rung(cause, config) is not None:
            return ("its communicator is rebuilt in place (model, optimizer and step kept); if that fails, "
                    f"its group is replaced{spare}")
        return f"its group is torn down and replaced{spare}; the replacement heals from a live peer"

    def climb(self, g: ReplicaGroup, failure: Failure) -> None:
        means = self.means
        rung: str | None = entry_rung(failure, means.config, failure.cause is None and means.allocation_gone(g))
        reason = failure.reason
        while rung is not None and not means.stopping.is_set():
            means.groups.set_rung(g, rung)
            means.emit(RungStarted(replica=g.index, rung=rung, reason=reason[:300]))
            t0 = time.time()
            why = self.rungs[rung].attempt(g, failure)
            if why is None:
                return
            up = ESCALATES_TO[rung]
            means.emit(RungEscalated(replica=g.index, rung=rung, to=up or "", reason=why[:300],
                                     seconds=time.time() - t0))
            reason = f"{rung} rung: {why}"
            rung = up
