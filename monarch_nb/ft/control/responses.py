"""What the supervisor does about a failed group: one small class per ``RunConfig.on_failure``.

* :class:`PeerResponse` ("peer"): only the failed group is brought back, at the lowest rung of
  the recovery ladder that can fix what broke (``ladder.py``: its communicator rebuilt in place,
  or its processes replaced and healed from a live peer); the others train on.
* :class:`RestartResponse` ("restart"): every group stops and all of them restart from the
  newest durable checkpoint, loading it at once; torchft's quorum still runs every step.
* :class:`PlainRestartResponse` ("plain_restart"): the same restart for a job without torchft (one
  process group over every group, see plain_replication.py); what differs is only how the workers find each
  other, which the run passes them.

The supervisor watches, detects and asks its response; a response uses only the means
:class:`~.means.ResponseMeans` names (the supervisor provides them: teardown, acquire, start, emit, ...)
and never holds a lock across them.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from ...telemetry.events import Acquired, Respawned, RestartedFromCheckpoint, RungStarted
from ..settings.checkpoint_format import latest_complete
from .groups import FAILED, HEALING, RESPAWNING, Failure, ReplicaGroup
from .ladder import Ladder, communicator_at_once
from .means import ResponseMeans


class FailureResponse:
    """The interface the supervisor calls."""

    name: ClassVar[str]

    def __init__(self, means: ResponseMeans) -> None:
        self.means = means

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
        raise NotImplementedError

    def action(self, cause: str | None = None) -> str:
        """What happens after a group's failure (a stalled trainer's ``cause``), as its notice says it."""
        raise NotImplementedError

    def busy(self) -> bool:
        """True while the response is bringing every group back (the watchers then stand aside)."""
        return False


class PeerResponse(FailureResponse):
    """Only the failed group is brought back, at the lowest rung of the ladder that can fix
    what broke (``ladder.py``); the others train on."""

    name = "peer"

    def __init__(self, means: ResponseMeans) -> None:
        super().__init__(means)
        self.ladder = Ladder(means)

    def action(self, cause: str | None = None) -> str:
        return self.ladder.action(cause)

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
        means = self.means
        fired = means.fired_time(g)
        at_once = failure.cause == "comms" and communicator_at_once(means.config)
        means.ingest.expect_rejoin(g.index, fired or failure.t, maybe_back=at_once)
        means.announce(g, failure, fired)
        means.report(g, failure)
        self.ladder.climb(g, failure)


class RestartResponse(FailureResponse):
    name = "restart"

    def __init__(self, means: ResponseMeans) -> None:
        super().__init__(means)
        self.lock = threading.Lock()  # guards the claim of ``restarting``; never held across a call
        self.restarting = threading.Event()

    def action(self, cause: str | None = None) -> str:
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
        means.emit(RungStarted(replica=g.index, rung="checkpoint", reason=f"on_failure={self.name!r}: "
                                                                        f"{failure.reason}"[:300]))
        # What the others committed until now goes into the log before they are torn down: a
        # restart redoes the steps the log shows since the checkpoint, and a teardown used to
        # take the last poll's worth of them along (a restart then "lost" none it threw away).
        try:
            means.at_once([h for h in groups if h is not g], lambda h: means.poll(h, 1.0), "drain")
        except Exception:  # noqa: BLE001 - a group that cannot answer has nothing more to give
            pass
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
