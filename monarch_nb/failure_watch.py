"""Finding failed workers, and saying so once: the session's three watchers and its listeners.

A worker's death is seen by whichever check comes first: Monarch's supervision (its fault hook,
which monarch_nb turns into a report instead of an exit of the kernel), a pid check of the
processes on this machine 4 times a second, or the scheduler of an allocation polled once a
second (a cancelled, preempted or lost SLURM job). ``FailureWatch`` runs them, marks each rank
failed once (``MeshHandle.mark_failed``), asks the scheduler for the real cause before it uses
anyone else's words, and announces one ``WorkerFailed`` per rank to the event log and to the
``on_failure`` listeners; Monarch's later account of a death already reported is a
``WorkerExitReported``. It finds the meshes through ``MeshDirectory``, never adds or removes
one, and changes only their ranks' health, each through the handle's own lock.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable, Protocol

from . import _runtime, seam
from .meshes import MeshHandle
from .telemetry import EventStore
from .telemetry.events import WorkerExitReported, WorkerFailed

log = logging.getLogger(__name__)

FailureListener = Callable[["WorkerFailed | WorkerExitReported"], None]
JOB_WATCH_INTERVAL_S = 1.0
PID_WATCH_INTERVAL_S = 0.25
JOB_SETTLE_S = 2.0  # how long a COMPLETING job is given to show its final state (CANCELLED, NODE_FAIL, ...)


class MeshDirectory(Protocol):
    """What the watcher needs to know of the session's meshes (``MeshLifecycle`` provides it)."""

    def get(self, name: str) -> MeshHandle | None: ...

    def snapshot(self) -> list[MeshHandle]: ...

    def live(self) -> list[MeshHandle]: ...

    def holder_of(self, actor_full_name: str) -> MeshHandle | None: ...

    def torn_down(self, actor_full_name: str) -> MeshHandle | None: ...


def parse_failure(failure: Any) -> tuple[str, list[int], str]:
    """(unique actor mesh name, crashed ranks, a one-line reason) of a Monarch ``MeshFailure``."""
    name, ranks, reason = seam.failure_details(failure)
    if "Traceback" in reason:
        # An exception escaped the actor: the traceback's "SomeError: message" line says what.
        lines = [ln.strip() for ln in reason.splitlines()]
        raised = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
        reason = "exception escaped the actor: " + (raised[-1] if raised else "see the worker log")
    if reason.endswith(")") and reason.count(")") > reason.count("("):
        reason = reason[:-1]  # the closing parenthesis of "MeshFailure(...)"
    reason = " ".join(reason.split())
    return name, ranks, reason[:500]


class FailureWatch:
    """Monarch's fault reports, the pid watcher and the scheduler polls of one session.

    Args:
        meshes: the session's meshes, looked up (never changed) to place a report.
        events: where ``worker_failed`` and ``worker_exit_reported`` go.

    Listens to Monarch's fault hook from construction until ``stop()``; the watcher thread runs
    from ``start()`` (each mesh's ``up``) until no mesh has a live rank.
    """

    def __init__(self, meshes: MeshDirectory, events: EventStore) -> None:
        self._meshes, self.events = meshes, events
        self._lock = threading.Lock()  # guards _listeners and _watcher
        self._listeners: list[FailureListener] = []
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._remove_hook = _runtime.add_fault_listener(self._on_fault)

    def on_failure(self, listener: FailureListener) -> Callable[[], None]:
        """``Session.on_failure``: ``listener`` is called on every announcement; returns its remover."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def stop(self) -> None:
        """Stop the watcher thread and stop listening to Monarch's fault hook."""
        self._watch_stop.set()
        self._remove_hook()

    # ---- reports from others ----------------------------------------------------------------

    def report_failure(self, mesh: str, rank: int | None, cause: str, action: str | None = None) -> bool:
        """``Session.report_failure``: a rank the caller found dead, announced unless it already was."""
        handle = self._meshes.get(mesh)
        if handle is None or rank is None or not handle.mark_failed(rank, cause):
            return False
        self._record_failure(handle, rank, cause, action)
        return True

    def check_now(self) -> list[MeshHandle]:
        """Every mesh, with the pids of its processes on this machine checked now (``Session.status``)."""
        handles = self._meshes.snapshot()
        for handle in handles:
            for rank in handle.refresh():
                self._record_failure(handle, rank, handle.procs[rank].reason)
        return handles

    def _on_fault(self, failure: Any) -> None:
        """Monarch's supervision report of a failed actor mesh. A process of an allocation its
        scheduler ended died of that, whichever check saw it first: the scheduler's account
        ("SLURM job 60 is CANCELLED") is asked for before Monarch's ("Killed(sig=9)") is used."""
        actor_full_name, ranks, reason = parse_failure(failure)
        late = self._meshes.torn_down(actor_full_name)
        if late is not None:
            # Monarch's account of how a process ended, after we tore its mesh down: our own kill
            # or stop, or the failure already reported (we act on our own checks first). Recorded
            # as an explanation, never as a failure of its own.
            for rank in ranks:
                if late.first_account(rank, reason):
                    self._announce(WorkerExitReported(mesh=late.name, rank=rank, reason=reason))
            return
        owner = self._meshes.holder_of(actor_full_name)
        if owner is not None:
            cause = self._cause_of_death(owner, reason) if set(ranks) & set(owner.healthy_ranks) else reason
            for rank in ranks:
                words = self._fired_words(owner, rank, cause)
                if owner.mark_failed(rank, words):
                    self._record_failure(owner, rank, words)
                elif owner.first_account(rank, reason):  # our own check reported it: Monarch's words explain it
                    self._announce(WorkerExitReported(mesh=owner.name, rank=rank, reason=reason))
            return
        # Monarch's internal meshes (e.g. its logger) report too; find the dead pid ourselves.
        for handle in self._meshes.snapshot():
            cause = self._cause_of_death(handle, reason) if handle.gone_here() else reason
            for rank in handle.refresh(cause):
                self._record_failure(handle, rank, cause)

    # ---- the watcher thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start (once) the thread that checks every mesh's health: the pids of processes on this
        machine 4 times a second (a dead process is failed within ~0.25 s, without waiting for
        Monarch's supervision poll, which monarch_nb leaves at Monarch's 10 s: each poll costs the
        client memory it never gives back), and each allocation's scheduler once a second (a
        preempted or cancelled allocation, or a node gone down under it, fails its mesh's ranks
        at once instead of after Monarch's supervision timeouts). It ends with the last mesh."""
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_loop, name="monarch_nb-watch", daemon=True)
                self._watcher.start()

    def _watch_loop(self) -> None:
        next_jobs = time.monotonic() + JOB_WATCH_INTERVAL_S
        while not self._watch_stop.wait(PID_WATCH_INTERVAL_S):
            with self._lock:  # the meshes are read under it: an up() that start()s after sees _watcher None
                live = self._meshes.live()
                if not live:
                    self._watcher = None
                    return
            for handle in live:
                if handle.local and handle.pid_watch and handle.gone_here():
                    # a process of an allocation that its scheduler ended died of that: say so
                    for rank in handle.refresh(self._cause_of_death(handle)):
                        self._record_failure(handle, rank, handle.procs[rank].reason)
            if time.monotonic() >= next_jobs:
                next_jobs = time.monotonic() + JOB_WATCH_INTERVAL_S
                for handle in live:
                    if handle.allocation is not None:
                        self._check_allocation(handle)

    def _scheduler_cause(self, handle: MeshHandle) -> str | None:
        """The scheduler's account of an allocation it no longer runs ("SLURM job 60 is CANCELLED"),
        or None while it runs it or does not answer. A job still COMPLETING (its processes being
        killed) is given up to JOB_SETTLE_S to reach its final state, which names the cause."""
        settle = time.monotonic() + JOB_SETTLE_S
        while True:
            try:
                status = handle.allocation.status()
            except Exception as exc:  # the scheduler did not answer: try again next round
                log.debug("status of %s: %s", handle.name, exc)
                return None
            if status is None or status.running:
                return None
            if status.state != "COMPLETING" or time.monotonic() >= settle:
                return status.describe(handle.allocation.kind.upper())
            time.sleep(0.05)

    def _cause_of_death(self, handle: MeshHandle, fallback: str | None = None) -> str | None:
        """Why a process of ``handle`` died, as the scheduler of its allocation tells it (the
        allocation was cancelled, preempted, its node lost), else ``fallback``: every check
        that finds a death asks this first, so the first to report it names the real cause."""
        cause = self._scheduler_cause(handle) if handle.allocation is not None else None
        return cause or fallback

    @staticmethod
    def _fired_words(handle: MeshHandle, rank: int, reason: str) -> str:
        """Monarch's words for a death, led by the owner's account when the process recorded
        firing a fault that ends it (Monarch saw a segfaulted worker as Killed(sig=9) at times)."""
        if handle.fired_fault is None or not 0 <= rank < len(handle.procs) or not handle.procs[rank].pid:
            return reason
        told = handle.fired_fault(handle.procs[rank].pid)
        return f"{told}; Monarch reported: {reason}" if told else reason

    def _check_allocation(self, handle: MeshHandle) -> None:
        reason = self._scheduler_cause(handle)
        if reason is None or handle.stopped:
            return
        for rank in list(handle.healthy_ranks):
            if handle.mark_failed(rank, reason):
                self._record_failure(handle, rank, reason)

    # ---- announcing ---------------------------------------------------------------------------

    def _record_failure(self, handle: MeshHandle, rank: int, reason: str, action: str | None = None) -> None:
        """Record and announce a newly failed rank (callers mark it failed first: once per rank)."""
        self._announce(WorkerFailed(mesh=handle.name, rank=rank, reason=reason,
                                    action=action or handle.failure_action))

    def _announce(self, event: WorkerFailed | WorkerExitReported) -> None:
        self.events.append(event)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("failure listener raised")
