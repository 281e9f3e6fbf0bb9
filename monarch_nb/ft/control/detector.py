"""Deciding that a replica group has failed, and how.

A group fails in one of five ways (:class:`~.groups.Failure`): Monarch supervision reports a dead
process, the pid check finds one gone, a call to its trainer raises, the trainer reports a
failure it survived (an exception in the step, aborted comms), or the group stays silent past
its hang deadline - which is longer when the silence says more about an overloaded host than
about the group (a process is failed for its own fault, never for being starved of CPU). The
detector owns the per-group poll deadlines; each group's supervisor thread calls
:meth:`Detector.check` once a poll interval. Controller side: runs in the kernel's threads.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable

from ...calls import MeshResult
from ...meshes import exit_status, gone, pid_alive
from ..settings.config import RunConfig
from ..settings.faults import ENDS_PROCESS
from .groups import FINISHED, HEALING, TRAINING, WAITING, Failure, GroupTable, ReplicaGroup

if TYPE_CHECKING:
    from ...session import Session

OVERLOAD_PATIENCE = 4  # hang timeouts a group may stay silent while most groups are (hang_deadline)
STARVED_PATIENCE = 8.0  # at most this many hang timeouts on an oversubscribed host (hang_deadline)
POLLS_PER_S = 32  # the controller's polls per second in all, once there are enough groups (poll_interval)
MAX_STACK_CHARS = 8000  # a stack kept with a failure event (its innermost frames are at the top)


class Detector:
    """Polls a group and says whether it failed (see the module docstring)."""

    def __init__(self, config: RunConfig, session: "Session", groups: GroupTable,
                 poll: Callable[[ReplicaGroup, float], MeshResult], set_state: Callable[[ReplicaGroup, str, str], None],
                 awaiting_rejoin: Callable[[int], bool], no_peer_left: Callable[[], None],
                 fired_by: Callable[[int], str | None]) -> None:
        """``poll(group, timeout)``: one telemetry poll; ``awaiting_rejoin(index)``: the group is
        recovering; ``no_peer_left()``: a group waits for a state holder (every group may be
        lost); ``fired_by(pid)``: the fault a process recorded firing, if any."""
        self.config, self.session, self.groups = config, session, groups
        self._poll, self._set_state, self._awaiting_rejoin = poll, set_state, awaiting_rejoin
        self._no_peer_left, self._fired_by = no_peer_left, fired_by
        self._poll_deadlines: dict[int, float] = {}  # per group index; written by that group's thread only
        self.host_load: Callable[[], float] = host_oversubscription

    def poll_interval(self) -> float:
        """Seconds between two polls of one group: ``poll_interval_s`` up to POLLS_PER_S / 4
        groups, then longer in proportion, so the controller's polling (Monarch messages, a
        few ms of CPU each) stays flat in R instead of growing with it; at most a quarter of
        the hang timeout, so a hang is still noticed in time."""
        cfg = self.config
        return min(max(cfg.poll_interval_s, len(self.groups.active()) / POLLS_PER_S), cfg.hang_timeout_s / 4)

    def dead_rank(self, g: ReplicaGroup) -> Failure | None:
        """A pid check for ranks on this host: Monarch supervision usually reports a dead
        process first (with its exit status), but not always; this never misses one."""
        here = socket.gethostname()
        for rank, (pid, host) in enumerate(g.procs):
            if host == here and not pid_alive(pid):
                how, found = exit_status(pid), "found by pid check"
                if how is None:
                    # Monarch's runtime reaps its children at once, so the exit status is usually
                    # gone; a process that wrote in the fault log that it fired a fault which
                    # ends a process ended the way that fault does.
                    kind = self._fired_by(pid)
                    how = ENDS_PROCESS.get(kind or "")
                    found += f"; it fired an injected {kind} fault, per the fault log" if how else ""
                return Failure(gone(pid, rank, how, found), rank, time.time(), "pid")
        return None

    def check(self, g: ReplicaGroup) -> Failure | None:
        """Poll the group once; the failure, if it has failed."""
        failure = self.groups.take_failure(g)
        if failure is not None:
            return failure
        dead = self.dead_rank(g)
        if dead is not None:
            # No wait for Monarch's report of how it died: it may come later, and the run's
            # history then takes it as the explanation (see on_worker_failed).
            return dead
        # Short polls while answers are quick: a hung group is then noticed within hang_timeout_s
        # + about one poll; longer ones while they are slow (poll_deadline).
        deadline = self._poll_deadlines.get(g.index, self._poll_deadline_floor())
        result = self._poll(g, deadline)
        self._poll_deadlines[g.index] = next_poll_deadline(deadline, result, self._poll_deadline_floor(),
                                                           self.config.hang_timeout_s / 2)
        now = time.monotonic()
        told = self.groups.take_failure(g)
        if told is not None:  # supervision spoke while we were waiting
            return told
        if result.errors:
            dead = self.dead_rank(g)  # a call fails when its process died during it: say how it ended
            if dead is not None:
                return dead
            rank, err = sorted(result.errors.items())[0]
            return Failure(f"unreachable: {type(err).__name__}: {str(err)[:300]}", rank, time.time(), "endpoint")
        for rank, value in sorted(result.values.items()):
            if value.get("state") == "failed":
                return Failure(value.get("failure") or "trainer reported failure", rank, time.time(), "trainer")
            if value.get("state") == "stalled":  # alive, its training stopped: the ladder may repair it in place
                return Failure(value.get("failure") or "trainer stalled", rank, time.time(), "trainer",
                               cause=value.get("cause"))
        if any(v.get("state") == "waiting_for_peer" for v in result.values.values()):
            if g.state != WAITING:
                self._set_state(g, WAITING, "behind the run's progress, and its quorum has no peer that holds the "
                                           "run's state")
            self._no_peer_left()
        elif g.state == WAITING and result.values:
            # It trains again (a poll can carry its first committed step while the state it read
            # was still the wait's): back to what the events say it is.
            self._set_state(g, HEALING if self._awaiting_rejoin(g.index) else TRAINING, "")
        if not result.missing:
            self.groups.touch(g, now)
            if all(v.get("state") == "finished" for v in result.values.values()):
                self._set_state(g, FINISHED, "")
        elif now - g.last_answer > self.hang_deadline(now, g):
            t = time.time()
            return Failure(f"hang: no answer from ranks {result.missing} for {now - g.last_answer:.1f} s",
                           result.missing[0], t, "hang", stack=self.stack_of(g, result.missing[0]))
        return None

    def _poll_deadline_floor(self) -> float:
        return max(0.2, min(0.5, self.config.hang_timeout_s / 4))

    def hang_deadline(self, now: float, g: ReplicaGroup | None = None) -> float:
        """Seconds of silence after which a group is failed as hung: ``hang_timeout_s``, longer
        when the silence says more about the host than about the group (a process is failed for
        its own fault, never for being starved of CPU):

        * at least half of the (4 or more) training groups silent at once: an overloaded host or
          controller; failing them all would kill healthy groups and feed the overload with
          respawns: OVERLOAD_PATIENCE times as long;
        * ``g`` runs on this host and the host is oversubscribed (1-minute load over cores > 1):
          that many times as long, up to STARVED_PATIENCE. At 32 groups on two cores (load ~35)
          a healthy group went 7-8 s between answers while a spare was built, and 14 answering
          groups were failed as hung against 5 s. A hang is still caught, later on a starved host.
        """
        timeout = self.config.hang_timeout_s
        factor = 1.0
        silent, watched = self.groups.silent(now, timeout / 2)
        if watched >= 4 and silent >= watched / 2:
            factor = OVERLOAD_PATIENCE
        if g is not None and _runs_here(g):
            factor = max(factor, min(STARVED_PATIENCE, self.host_load()))
        return factor * timeout

    def stack_of(self, g: ReplicaGroup, rank: int) -> str:
        """Where a silent rank is stuck, read from outside (it cannot answer); kept with the
        failure, because the teardown that follows destroys the evidence."""
        try:
            stacks = self.session.stacks(g.name, [rank])
        except Exception as exc:  # no stack must not stop the recovery
            return f"(no stack: {exc})"
        return stacks[0].text[:MAX_STACK_CHARS]


def next_poll_deadline(current: float, result: Any, floor: float, cap: float) -> float:
    """How long the next poll of a group waits for its answers (as TCP sizes its retransmission
    timeout): doubled after a poll that some rank did not answer in time, three times the last
    full answer's latency after one that all answered; never under ``floor`` (a quick check on
    a quiet host) nor over ``cap`` (half the hang timeout: a real hang is still caught within
    1.5 hang timeouts). A late answer is dropped with its poll, so with a fixed deadline a group
    whose answers take just longer than it is silent for ever: at 32 groups on two cores, answers
    took 0.5-0.7 s against a 0.5 s deadline and 27 of 32 answering groups were failed as hung."""
    if result.errors:
        return current
    if result.missing:
        return min(cap, max(floor, current * 2))
    return min(cap, max(floor, 3 * result.seconds))


def host_oversubscription() -> float:
    """Runnable work per core on this host (1-minute load average over CPUs): above 1, each
    process gets less than a core, and a poll's answer waits its turn."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def _runs_here(g: ReplicaGroup) -> bool:
    here = socket.gethostname()
    return any(host == here for _, host in g.procs)
