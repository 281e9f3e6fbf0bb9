"""What the supervisor does about a failed group: one small class per ``RunConfig.on_failure``.

* :class:`PeerResponse` ("peer"): only the failed group is torn down and brought back (a warm
  spare, or fresh processes, as often as its :class:`~..spec.respawn.RespawnBackoff` allows); it heals
  from a live peer while the others train on.
* :class:`RestartResponse` ("restart"): every group stops and all of them restart from the
  newest durable checkpoint, loading it at once; torchft's quorum still runs every step.
* :class:`PlainRestartResponse` ("plain_restart"): the same restart for a job without torchft (one
  process group over every group, see plain_replication.py); what differs is only how the workers find each
  other, which the run passes them.

The supervisor watches, detects and asks its response; a response uses only the means
:class:`ResponseMeans` names (the supervisor provides them: teardown, acquire, start, emit, ...)
and never holds a lock across them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, ClassVar, Protocol

from ...telemetry.events import Acquired, Event, FailureDetected, GaveUp, Respawned, RestartedFromCheckpoint
from ..record.ingest import EventIngest
from ..spec.checkpoint_format import latest_complete
from ..spec.config import RunConfig
from .groups import FAILED, GAVE_UP, HEALING, RESPAWNING, Failure, GroupTable, ReplicaGroup
from .identity import IdentityChecks
from .spares import SparePool


class ResponseMeans(Protocol):
    """What a failure response may use (the supervisor provides it)."""

    config: RunConfig
    groups: GroupTable
    ingest: EventIngest
    identity: IdentityChecks
    stopping: threading.Event
    checkpoint_dir: str | None

    @property
    def spares(self) -> SparePool | None: ...
    def emit(self, event: Event) -> None: ...
    def set_state(self, g: ReplicaGroup, state: str, detail: str = "") -> None: ...
    def closed(self) -> bool: ...
    def fired_time(self, g: ReplicaGroup) -> float | None: ...
    def announce(self, g: ReplicaGroup, failure: Failure, fired: float | None) -> None: ...
    def report(self, g: ReplicaGroup, failure: Failure) -> None: ...
    def teardown(self, g: ReplicaGroup) -> None: ...
    def teardown_all(self, groups: list[ReplicaGroup], failed: ReplicaGroup) -> None: ...
    def finish_if_run_is_over(self, g: ReplicaGroup) -> bool: ...
    def acquire(self, g: ReplicaGroup, t0: float) -> None: ...
    def spawn_all(self, groups: list[ReplicaGroup]) -> dict[int, float]: ...
    def wait_ready(self, g: ReplicaGroup, deadline: float) -> None: ...
    def start_training(self, g: ReplicaGroup, min_step: int = 0, resume_from: str | None = None) -> None: ...
    def at_once(self, groups: list[ReplicaGroup], fn: Callable[[ReplicaGroup], Any], name: str) -> dict[int, Any]: ...
    def progress(self) -> int: ...
    def last_recorded_step(self) -> int: ...


class FailureResponse:
    """The interface the supervisor calls."""

    name: ClassVar[str]

    def __init__(self, means: ResponseMeans) -> None:
        self.means = means

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
        raise NotImplementedError

    def action(self) -> str:
        """What happens after a group's failure, as its notice says it."""
        raise NotImplementedError

    def busy(self) -> bool:
        """True while the response is bringing every group back (the watchers then stand aside)."""
        return False


class PeerResponse(FailureResponse):
    name = "peer"

    def action(self) -> str:
        spare = " (a warm spare if one is ready)" if self.means.spares is not None else ""
        return f"its group is torn down and replaced{spare}; the replacement heals from a live peer"

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
        means = self.means
        fired = means.fired_time(g)
        means.ingest.expect_rejoin(g.index, fired or failure.t)
        means.announce(g, failure, fired)
        means.set_state(g, FAILED, failure.reason[:200])
        means.identity.left_out(g.index)  # its digests at a checked step will never come
        means.report(g, failure)
        backoff = means.config.respawn
        while not means.stopping.is_set() and not means.closed():
            means.teardown(g)
            if not backoff.allows(g.in_a_row + 1):
                means.emit(GaveUp(replica=g.index, attempts=g.in_a_row))
                means.set_state(g, GAVE_UP, f"after {g.in_a_row} attempts in a row")
                return
            if means.finish_if_run_is_over(g):
                return
            in_a_row = means.groups.failed_again(g)  # reset when the group rejoins: a cause that persists backs off
            delay = backoff.wait_before(in_a_row)
            if delay:
                means.set_state(g, FAILED, f"attempt {g.attempts + 1} in {delay:g} s (attempt {in_a_row} in a row)")
                if means.stopping.wait(delay):
                    return
            attempt = means.groups.begin_attempt(g)
            means.set_state(g, RESPAWNING, f"attempt {attempt}")
            t0 = time.time()
            try:
                means.acquire(g, t0)
                if means.stopping.is_set():
                    return
                means.start_training(g, min_step=means.progress())
            except Exception as e:  # the respawn itself failed: counts as an attempt, try again
                if means.stopping.is_set():
                    return
                means.emit(FailureDetected(replica=g.index, rank=None, reason=f"respawn failed: {e}"[:300]))
                means.set_state(g, FAILED, f"respawn attempt {attempt} failed")
                continue
            means.emit(Respawned(replica=g.index, attempt=attempt, seconds=time.time() - t0))
            means.set_state(g, HEALING)
            means.groups.touch(g, time.monotonic())
            return


class RestartResponse(FailureResponse):
    name = "restart"

    def __init__(self, means: ResponseMeans) -> None:
        super().__init__(means)
        self.lock = threading.Lock()  # guards the claim of ``restarting``; never held across a call
        self.restarting = threading.Event()

    def action(self) -> str:
        return f"on_failure={self.name!r}: every group stops and restarts from the newest checkpoint"

    def busy(self) -> bool:
        return self.restarting.is_set()

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
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
        means = self.means
        fired = means.fired_time(g)
        means.announce(g, failure, fired)
        groups = means.groups.active()
        for h in groups:
            means.set_state(h, FAILED if h is g else RESPAWNING, failure.reason[:200] if h is g else "restart")
        means.report(g, failure)
        means.teardown_all(groups, g)
        last = means.last_recorded_step()  # read once no group trains: a poll in flight has landed
        checkpoint = latest_complete(means.checkpoint_dir) if means.checkpoint_dir else None
        start = time.time()
        for h in groups:
            means.groups.begin_attempt(h)
            means.set_state(h, RESPAWNING, f"restart from {'step ' + str(checkpoint.step) if checkpoint else 'scratch'}")
        acquired_s = means.spawn_all(groups)[g.index]
        means.emit(Acquired(t=start + acquired_s, replica=g.index, how="spawn", seconds=acquired_s))
        for h in groups:
            means.wait_ready(h, time.monotonic() + means.config.init_timeout_s)
        for h in groups:
            means.ingest.expect_rejoin(h.index, (fired or failure.t) if h is g else time.time())
            means.set_state(h, HEALING, "loading the checkpoint" if checkpoint else "from scratch")

        def load(h: ReplicaGroup) -> None:  # each group reads the checkpoint itself, all at once
            means.start_training(h, resume_from=str(checkpoint.path) if checkpoint else None)

        means.at_once(groups, load, "ft-restart")
        means.emit(Respawned(replica=g.index, attempt=g.attempts, seconds=time.time() - start))
        means.emit(RestartedFromCheckpoint(step=checkpoint.step if checkpoint else 0,
                                          checkpoint=str(checkpoint.path) if checkpoint else None,
                                          lost_steps=max(0, last - (checkpoint.step if checkpoint else 0)),
                                          seconds=time.time() - start))


class PlainRestartResponse(RestartResponse):
    name = "plain_restart"


RESPONSES: dict[str, type[FailureResponse]] = {p.name: p for p in (PeerResponse, RestartResponse, PlainRestartResponse)}


def response_for(means: ResponseMeans) -> FailureResponse:
    return RESPONSES[means.config.on_failure](means)
