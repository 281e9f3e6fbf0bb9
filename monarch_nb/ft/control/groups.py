"""Replica groups as the controller sees them, and the one lock that guards them.

Several threads touch the groups of a run: one supervisor per group, Monarch's fault hook
(through the session's failure listener), the fault injector, identity checks and the
user's thread (``status()``, ``inject``). All of that shared state lives in
:class:`GroupTable` and changes only under its lock; a state change is returned to the
caller, which records it as a ``ReplicaState`` event outside the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

# Every state a replica group can be in; the dashboard has a style for each.
STARTING, TRAINING, FAILED, RESPAWNING, HEALING = "starting", "training", "failed", "respawning", "healing"
STOPPED, GAVE_UP, FINISHED, RETIRING, RETIRED = "stopped", "gave_up", "finished", "retiring", "retired"
# Alive, its training stalled (broken communicator, a step that raised): being repaired in its own
# processes (the ladder's communicator and step rungs).
REPAIRING = "repairing"
# Alive and behind the run's progress, with no live peer that holds the run's state (every group
# was lost): it waits for a checkpoint load, a peer, or the user's restart_from_scratch().
WAITING = "waiting"
GROUP_STATES = (STARTING, TRAINING, FAILED, REPAIRING, RESPAWNING, HEALING, WAITING, STOPPED, GAVE_UP, FINISHED,
                RETIRING, RETIRED)
# States in which the supervisor has nothing more to do.
TERMINAL = (STOPPED, GAVE_UP, FINISHED, RETIRING, RETIRED)
# States in which a new failure report is news (not a repeat of one being handled).
WATCHED = (STARTING, TRAINING, REPAIRING, HEALING, WAITING)
# States of a group being brought back (the ladder's rung says how).
RECOVERING = (FAILED, REPAIRING, RESPAWNING, HEALING, WAITING)
# States whose processes are gone for good: such a group shows no pids and is waited on by no one.
GONE = (STOPPED, GAVE_UP, RETIRING, RETIRED)


@dataclass(frozen=True)
class Failure:
    """Why the controller decided a group has failed.

    ``source`` says who noticed: ``supervision`` (Monarch reported a dead process), ``pid``
    (our own liveness check), ``endpoint`` (a call to the trainer raised), ``trainer`` (the
    trainer reported a failure it survived: an exception in the step, broken comms) or
    ``hang`` (silence past ``hang_timeout_s``). ``t`` is when it was detected (unix seconds).
    """

    reason: str
    rank: int | None
    t: float
    source: str
    stack: str | None = None  # a hang: where the stuck rank was (py-spy), read before the teardown
    cause: str | None = None  # a stalled trainer's cause ("comms", "exception"): the ladder repairs it in place


@dataclass
class ReplicaGroup:
    """Controller-side view of one replica group (a Monarch proc mesh named ``replica{index}``)."""

    index: int
    state: str = STARTING
    attempts: int = 0  # times the group was brought back, over the run
    in_a_row: int = 0  # attempts since the group last trained (the restart policy backs off on these)
    actors: Any = None
    step: int = 0
    last_answer: float = 0.0  # monotonic time of the last complete poll
    procs: list[tuple[int, str]] = field(default_factory=list)  # (pid, host) of each rank
    failure: Failure | None = None  # set by any thread that noticed; the supervisor acts on it
    rung: str | None = None  # the ladder's rung bringing it back now, or that brought it back last
    wake: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return f"replica{self.index}"

    @property
    def pids(self) -> list[int]:
        return [pid for pid, _ in self.procs]


class GroupTable:
    """The groups of one run, guarded by one lock."""

    def __init__(self, replicas: int) -> None:
        self.lock = threading.RLock()
        self.groups = [ReplicaGroup(r) for r in range(replicas)]

    def add(self) -> ReplicaGroup:
        """A new group (scale up), with the next unused index."""
        with self.lock:
            g = ReplicaGroup(len(self.groups))
            self.groups.append(g)
            return g

    def active(self) -> list[ReplicaGroup]:
        """Groups that are part of the run: not retired, given up on or stopped."""
        with self.lock:
            return [g for g in self.groups if g.state not in TERMINAL]

    def __iter__(self):  # noqa: ANN204
        return iter(list(self.groups))

    def __getitem__(self, index: int) -> ReplicaGroup:
        return self.groups[index]

    def by_name(self, name: str) -> ReplicaGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    def set_state(self, group: ReplicaGroup, state: str, detail: str = "") -> bool:
        """Change a group's state; False when it already was in it (and there is no detail)."""
        with self.lock:
            if group.state == state and not detail:
                return False
            group.state = state
            return True

    def set_rung(self, group: ReplicaGroup, rung: str) -> None:
        """The ladder's rung now bringing ``group`` back."""
        with self.lock:
            group.rung = rung

    def signal_failure(self, group: ReplicaGroup, failure: Failure) -> bool:
        """Record a failure noticed outside the supervisor (first one wins) and wake it."""
        with self.lock:
            if group.failure is not None or group.state not in WATCHED:
                return False
            group.failure = failure
        group.wake.set()
        return True

    def clear_failure(self, group: ReplicaGroup) -> None:
        """Forget a failure signalled so far (a group repaired in its own processes: the reports
        of the stall, its own notice's echo among them, are handled)."""
        with self.lock:
            group.failure = None

    def take_failure(self, group: ReplicaGroup) -> Failure | None:
        with self.lock:
            return group.failure

    def attach(self, group: ReplicaGroup, actors: Any, procs: list[tuple[int, str]], now: float) -> None:
        """A fresh mesh and trainer for ``group``: forget the old failure."""
        with self.lock:
            group.actors, group.procs = actors, procs
            group.failure = None
            group.last_answer = now

    # Each field a thread other than the group's supervisor may also write (or read mid-change)
    # changes here, under the lock; a read-modify-write (a max, an increment) is one step.

    def record_step(self, group: ReplicaGroup, step: int) -> None:
        """A poll's report of the group's last committed step. Two polls of one group (its
        supervisor's and a stop's) may land in either order: the step only moves forward here."""
        with self.lock:
            group.step = max(group.step, step)

    def rewind_progress(self, step: int) -> None:
        """The run's progress is ``step`` now (the steps after it were lost: a resume from a
        checkpoint, a restart from scratch): no group counts as further."""
        with self.lock:
            for g in self.groups:
                g.step = min(g.step, step)

    def touch(self, group: ReplicaGroup, now: float) -> None:
        """Every rank answered a poll (or the group was just brought back) at monotonic ``now``;
        the hang detection measures silence from here."""
        with self.lock:
            group.last_answer = now

    def failed_again(self, group: ReplicaGroup) -> int:
        """One more attempt to bring the group back since it last trained; returns how many in a row."""
        with self.lock:
            group.in_a_row += 1
            return group.in_a_row

    def begin_attempt(self, group: ReplicaGroup) -> int:
        """The group is being brought back once more; returns the attempt's number (over the run)."""
        with self.lock:
            group.attempts += 1
            return group.attempts

    def rejoined(self, group: ReplicaGroup) -> None:
        """The group trains again: the restart policy's backoff starts over."""
        with self.lock:
            group.in_a_row = 0

    def live(self) -> list[ReplicaGroup]:
        """Groups a wait for a step can count on: all but the retired and given-up ones
        (finished groups count: they reached the last step)."""
        with self.lock:
            return [g for g in self.groups if g.state not in (GAVE_UP, RETIRING, RETIRED)]

    def training(self) -> list[ReplicaGroup]:
        with self.lock:
            return [g for g in self.groups if g.state == TRAINING]

    def silent(self, now: float, seconds: float) -> tuple[int, int]:
        """(groups training or healing that have not answered for ``seconds``, groups training
        or healing): many silent at once points at the host or the controller, not at hangs."""
        with self.lock:
            watched = [g for g in self.groups if g.state in (TRAINING, HEALING)]
            return sum(1 for g in watched if now - g.last_answer > seconds), len(watched)

    def status(self) -> dict[int, dict[str, Any]]:
        with self.lock:
            return {g.index: {"state": g.state, "step": g.step, "attempts": g.attempts,
                              "rung": g.rung if g.state in RECOVERING else None,
                              "pids": [] if g.state in GONE else g.pids} for g in self.groups}
