"""What the supervisor does about a failed group: one small class per ``RunConfig.recovery``.

* :class:`PeerRecovery` ("peer"): only the failed group is torn down and brought back (a warm
  spare, or fresh processes, as often as its :class:`~.respawn.RespawnPolicy` allows); it heals
  from a live peer while the others train on.
* :class:`CheckpointRestart` ("restart"): every group stops and all of them restart from the
  newest durable checkpoint, loading it at once; torchft's quorum still runs every step.
* :class:`PlainRestart` ("plain_restart"): the same restart for a job without torchft (one
  process group over every group, see plain.py); what differs is only how the workers find each
  other, which the run passes them.

The supervisor watches, detects and asks its policy; a policy calls the supervisor's means
(teardown, spawn, start, emit) and never holds a lock across them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from ...telemetry.events import Acquired, FailureDetected, GaveUp, Respawned, RestartedFromCheckpoint, TornDown
from ..spec.checkpoint_format import latest_complete
from .groups import FAILED, GAVE_UP, HEALING, RESPAWNING, Failure, ReplicaGroup


class RecoveryPolicy:
    """The interface the supervisor calls."""

    name: ClassVar[str]

    def __init__(self, sup: Any) -> None:
        self.sup = sup  # the Supervisor (not imported: it imports this module)

    def recover(self, g: ReplicaGroup, failure: Failure) -> None:
        raise NotImplementedError

    def action(self) -> str:
        """What happens after a group's failure, as its notice says it."""
        raise NotImplementedError

    def busy(self) -> bool:
        """True while the policy is bringing every group back (the watchers then stand aside)."""
        return False


class PeerRecovery(RecoveryPolicy):
    name = "peer"

    def action(self) -> str:
        spare = " (a warm spare if one is ready)" if self.sup.spares is not None else ""
        return f"its group is torn down and replaced{spare}; the replacement heals from a live peer"

    def recover(self, g: ReplicaGroup, failure: Failure) -> None:
        sup = self.sup
        fired = sup.fired_time(g)
        sup.ingest.expect_rejoin(g.index, fired or failure.t)
        sup.announce(g, failure, fired)
        sup.set_state(g, FAILED, failure.reason[:200])
        sup.identity.left_out(g.index)  # its digests at a checked step will never come
        sup.report(g, failure)
        backoff = sup.config.respawn
        while not sup.stopping.is_set() and not getattr(sup.session, "_closed", False):
            sup.teardown(g)
            if not backoff.allows(g.in_a_row + 1):
                sup._emit(GaveUp(replica=g.index, attempts=g.in_a_row))
                sup.set_state(g, GAVE_UP, f"after {g.in_a_row} attempts in a row")
                return
            if sup._finish_if_run_is_over(g):
                return
            in_a_row = sup.groups.failed_again(g)  # reset when the group rejoins: a cause that persists backs off
            delay = backoff.wait_before(in_a_row)
            if delay:
                sup.set_state(g, FAILED, f"attempt {g.attempts + 1} in {delay:g} s (attempt {in_a_row} in a row)")
                if sup.stopping.wait(delay):
                    return
            attempt = sup.groups.begin_attempt(g)
            sup.set_state(g, RESPAWNING, f"attempt {attempt}")
            t0 = time.time()
            try:
                sup.acquire(g, t0)
                if sup.stopping.is_set():
                    return
                sup.start_training(g, min_step=sup.progress())
            except Exception as e:  # the respawn itself failed: counts as an attempt, try again
                if sup.stopping.is_set():
                    return
                sup._emit(FailureDetected(replica=g.index, rank=None, reason=f"respawn failed: {e}"[:300]))
                sup.set_state(g, FAILED, f"respawn attempt {attempt} failed")
                continue
            sup._emit(Respawned(replica=g.index, attempt=attempt, seconds=time.time() - t0))
            sup.set_state(g, HEALING)
            sup.groups.touch(g, time.monotonic())
            return


class CheckpointRestart(RecoveryPolicy):
    name = "restart"

    def __init__(self, sup: Any) -> None:
        super().__init__(sup)
        self.lock = threading.Lock()  # guards the claim of ``restarting``; never held across a call
        self.restarting = threading.Event()

    def action(self) -> str:
        return f"recovery={self.name!r}: every group stops and restarts from the newest checkpoint"

    def busy(self) -> bool:
        return self.restarting.is_set()

    def recover(self, g: ReplicaGroup, failure: Failure) -> None:
        """A failure stops every group and all restart from the newest durable checkpoint (from
        the start when there is none). One thread does it; failures the restart itself causes
        in the other groups are not recoveries of their own."""
        with self.lock:
            if self.restarting.is_set():
                return
            self.restarting.set()
        try:
            self._restart_all(g, failure)
        finally:
            self.restarting.clear()

    def _restart_all(self, g: ReplicaGroup, failure: Failure) -> None:
        sup = self.sup
        fired = sup.fired_time(g)
        sup.announce(g, failure, fired)
        groups = sup.groups.active()
        for h in groups:
            sup.set_state(h, FAILED if h is g else RESPAWNING, failure.reason[:200] if h is g else "restart")
        sup.report(g, failure)
        t0 = time.monotonic()
        sup.session.down_many([h.name for h in groups], kill=True)
        sup._emit(TornDown(replica=g.index, seconds=time.monotonic() - t0))
        last = sup.last_recorded_step()  # read once no group trains: a poll in flight has landed
        checkpoint = latest_complete(sup.checkpoint_dir) if sup.checkpoint_dir else None
        start = time.time()
        for h in groups:
            sup.groups.begin_attempt(h)
            sup.set_state(h, RESPAWNING, f"restart from {'step ' + str(checkpoint.step) if checkpoint else 'scratch'}")
        acquired_s = sup.spawn_all(groups)[g.index]
        sup._emit(Acquired(t=start + acquired_s, replica=g.index, how="spawn", seconds=acquired_s))
        for h in groups:
            sup.wait_ready(h, time.monotonic() + sup.config.init_timeout_s)
        for h in groups:
            sup.ingest.expect_rejoin(h.index, (fired or failure.t) if h is g else time.time())
            sup.set_state(h, HEALING, "loading the checkpoint" if checkpoint else "from scratch")

        def load(h: ReplicaGroup) -> None:  # each group reads the checkpoint itself, all at once
            sup.start_training(h, resume_from=str(checkpoint.path) if checkpoint else None)

        sup.at_once(groups, load, "ft-restart")
        sup._emit(Respawned(replica=g.index, attempt=g.attempts, seconds=time.time() - start))
        sup._emit(RestartedFromCheckpoint(step=checkpoint.step if checkpoint else 0,
                                          checkpoint=str(checkpoint.path) if checkpoint else None,
                                          lost_steps=max(0, last - (checkpoint.step if checkpoint else 0)),
                                          seconds=time.time() - start))


class PlainRestart(CheckpointRestart):
    name = "plain_restart"


POLICIES: dict[str, type[RecoveryPolicy]] = {p.name: p for p in (PeerRecovery, CheckpointRestart, PlainRestart)}


def policy_for(sup: Any) -> RecoveryPolicy:
    return POLICIES[sup.config.recovery](sup)
