"""What the controller knows about one process mesh: its shape, processes and their health.

A ``MeshHandle`` wraps a real Monarch ``ProcMesh`` (and, when its hosts came from a job - a
local ProcessJob, a SLURM allocation, Kubernetes pods - that allocation). Health is kept per
process: ``refresh()`` checks the pids of a mesh on this machine (``failure_watch`` calls it
4 times a second), and Monarch supervision marks a rank failed (``FailureWatch``), so ``status``
is truthful even for a process that died while nothing was calling it. Each handle's own lock
guards its processes' ``state``, ``reason`` and ``accounts``. Starting and stopping meshes is
``mesh_lifecycle``'s job.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

if TYPE_CHECKING:
    from .jobs import Allocation

ALIVE, FAILED, STOPPED = "alive", "failed", "stopped"


@dataclass
class ProcInfo:
    rank: int
    coords: dict[str, int]
    pid: int | None = None
    host: str | None = None
    job_id: str | None = None  # the scheduler's job holding this process (SLURM_JOB_ID)
    node: str | None = None  # the scheduler's name for its node (SLURMD_NODENAME)
    state: str = ALIVE
    reason: str = ""
    accounts: set[str] = field(default_factory=set)  # Monarch's words for it, once failed (each reported once)
    expected: str = ""  # the cause, when the controller ends it on purpose (%monarch kill): the pid check says it

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.coords.items())


@dataclass(frozen=True)
class ActorSpec:
    """How an actor mesh was spawned, so ``replace`` can spawn it again on a fresh mesh."""

    name: str
    cls: type
    args: tuple
    kwargs: dict


def coords_of(rank: int, shape: dict[str, int]) -> dict[str, int]:
    coords: dict[str, int] = {}
    for dim, size in reversed(list(shape.items())):
        coords[dim] = rank % size
        rank //= size
    return dict(reversed(list(coords.items())))


@dataclass
class MeshHandle:
    name: str
    shape: dict[str, int]
    proc_mesh: Any
    job: Any = None  # what Session.up was asked for (replace asks again)
    allocation: Allocation | None = None  # when the hosts came from a job
    env: dict[str, str] | None = None
    procs: list[ProcInfo] = field(default_factory=list)
    actors: dict[str, Any] = field(default_factory=dict)
    actor_specs: dict[str, ActorSpec] = field(default_factory=dict)
    actor_full_names: dict[str, str] = field(default_factory=dict)
    agent: Any = None
    stopped: bool = False
    log_dir: Path | None = None  # where the workers' output goes (Session.logs)
    failure_action: str | None = None  # what the mesh's owner does when a rank fails (said in the notice)
    local: bool = True  # its processes run on this machine (their pids can be checked here)
    pid_watch: bool = True  # the session's watcher checks its pids (False: its owner does, naming the fault)
    # The owner's account of how process ``pid`` ended, from a fault it recorded firing (None: none):
    # Monarch's report of that death may say only what it saw, e.g. Killed(sig=9) for a segfault.
    fired_fault: Callable[[int], str | None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def size(self) -> int:
        n = 1
        for v in self.shape.values():
            n *= v
        return n

    @property
    def failed_ranks(self) -> list[int]:
        return [p.rank for p in self.procs if p.state == FAILED]

    @property
    def healthy_ranks(self) -> list[int]:
        return [p.rank for p in self.procs if p.state == ALIVE]

    @property
    def state(self) -> str:
        if self.stopped:
            return STOPPED
        failed = len(self.failed_ranks)
        return "healthy" if failed == 0 else ("failed" if failed == self.size else "degraded")

    def mark_failed(self, rank: int, reason: str) -> bool:
        """Mark one rank failed; False if it already was (the hook fires more than once per death,
        and several checks may find the same death) or the mesh is being stopped (our own doing)."""
        if not 0 <= rank < len(self.procs):
            return False
        proc = self.procs[rank]
        with self._lock:
            if proc.state != ALIVE or self.stopped:
                return False
            proc.state, proc.reason = FAILED, reason
        return True

    def mark_repaired(self, rank: int) -> bool:
        """A failed rank whose process lives, being repaired in place (the recovery ladder's
        communicator or step rung), is alive again; False if it was not failed or is gone."""
        if not 0 <= rank < len(self.procs):
            return False
        proc = self.procs[rank]
        with self._lock:
            if proc.state != FAILED or self.stopped or (proc.pid and not pid_alive(proc.pid)):
                return False
            proc.state, proc.reason = ALIVE, None
        return True

    def first_account(self, rank: int, reason: str) -> bool:
        """True the first time ``reason`` is given for ``rank`` (Monarch's hook repeats itself)
        when it is not already the reason the rank was reported failed with; recorded in the
        rank's ``accounts`` under the same lock as its state."""
        if not 0 <= rank < len(self.procs):
            return False
        proc = self.procs[rank]
        with self._lock:
            if reason == proc.reason or reason in proc.accounts:
                return False
            proc.accounts.add(reason)
        return True

    def gone_here(self) -> list[ProcInfo]:
        """Live-marked processes on this machine whose pid is gone."""
        here = socket.gethostname()
        return [proc for proc in self.procs
                if proc.state == ALIVE and proc.pid and (self.local or proc.host == here) and not pid_alive(proc.pid)]

    def refresh(self, reason: str | None = None) -> list[int]:
        """Check the pids of processes on this machine; returns ranks newly found dead, marked
        failed with ``reason`` (default: how the process ended, as ``gone`` words it)."""
        dead = []
        for proc in self.gone_here():
            cause = reason or proc.expected or gone(proc.pid, proc.rank, exit_status(proc.pid))
            if self.mark_failed(proc.rank, cause):
                dead.append(proc.rank)
        return dead

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        failed = f", failed ranks {self.failed_ranks}" if self.failed_ranks else ""
        return f"<MeshHandle {self.name!r} ({dims}) {self.state}{failed}>"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this host (a zombie counts as gone)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pid: int, rank: int, how: str | None, found: str = "found by pid check") -> str:
    """A dead process's failure reason: "process 123 of rank 0 killed by signal 9 (SIGKILL)
    (found by pid check)"; ``how`` None when its exit status was already reaped."""
    return f"process {pid} of rank {rank} {how or 'is gone'} ({found})"


def exit_status(pid: int) -> str | None:
    """How a dead child process ended ("killed by signal 11 (SIGSEGV)", "exited with code 13"),
    read without reaping it (``WNOWAIT``: Monarch, its parent's owner, still reaps it); None
    for a process that is not our child or has not ended."""
    import os
    import signal

    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if info is None:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            name = signal.Signals(info.si_status).name
        except ValueError:
            name = "?"
        return f"killed by signal {info.si_status} ({name})"
    if info.si_code == os.CLD_EXITED:
        return f"exited with code {info.si_status}"
    return None
