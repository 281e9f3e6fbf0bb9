"""Where a mesh's hosts come from: this machine, a local ProcessJob, a SLURM allocation, or
Kubernetes pods - one small interface, one module per backend.

An :class:`Allocation` is asked for hosts once (``start`` returns Monarch's ``HostMesh``), can
say whether the scheduler still runs it (``status``: how the session notices a preempted
allocation or a downed node within about a second), and is given back with ``release``.
A failed mesh is never respawned on its old hosts: it gets a fresh allocation. What the
reaper must do if the controller dies (kill pids, cancel a job) comes from the allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class JobStatus:
    """What the scheduler says about an allocation."""

    job_id: str
    state: str  # RUNNING, PENDING, CANCELLED, NODE_FAIL, ... or GONE (no longer listed)
    reason: str = ""
    nodes: str = ""

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    def describe(self, kind: str = "SLURM") -> str:
        why = f" ({self.reason})" if self.reason and self.reason not in ("None", "(null)") else ""
        where = f" on {self.nodes}" if self.nodes and self.nodes not in ("(null)",) else ""
        return f"{kind} job {self.job_id} is {self.state}{why}{where}"


class Allocation:
    """Hosts for one mesh (the interface; see the module docstring)."""

    kind = "local"
    local = True  # every host is this machine: loopback networking, pid checks, reaper kills pids
    job_id: str | None = None

    def start(self) -> Any:
        """Ask for the hosts; returns Monarch's HostMesh. Releases everything if it fails."""
        raise NotImplementedError

    def status(self) -> JobStatus | None:
        """The scheduler's view, or None when there is nothing to watch."""
        return None

    def release(self, timeout: float = 10.0) -> None:
        """Give the hosts back and wait (bounded) until they are gone. Idempotent."""

    def pids(self) -> list[int]:
        """Local processes the allocation started (the reaper kills them if the controller dies)."""
        return []

    def reaper_commands(self) -> list[list[str]]:
        """Commands the reaper runs if the controller dies (e.g. ``scancel JOB``)."""
        return []

    job_state: Any = None  # Monarch's JobState once started (hosts, and the job's own views)
    # Called by start() with reaper_commands() as soon as the scheduler has taken the request, before
    # the hosts are up: a controller that dies in between must not leave the request behind.
    on_submit: Callable[[list[list[str]]], None] | None = None

    def views(self) -> dict[str, str]:
        """Monarch's own views of this job, when its job enabled them: the web ``dashboard``
        (``job.enable_telemetry(include_dashboard=True)``) and the ``admin`` API that
        ``monarch-tui --addr`` reads (``job.enable_admin()``)."""
        state = self.job_state
        urls = {"dashboard": getattr(state, "dashboard_url", None), "admin": getattr(state, "admin_url", None)}
        return {kind: url for kind, url in urls.items() if url}


class ProcessAllocation(Allocation):
    """``hosts`` separate local "host" processes through Monarch's ``ProcessJob``."""

    kind = "process"

    def __init__(self, hosts: int, env: dict[str, str] | None = None) -> None:
        self.hosts, self.env = hosts, env
        self._job: Any = None

    def start(self) -> Any:
        from monarch.job import ProcessJob

        self._job = ProcessJob({"hosts": self.hosts}, env=self.env)
        try:
            self.job_state = self._job.state(cached_path=None)
            return self.job_state.hosts
        except BaseException:
            self.release()
            raise

    def pids(self) -> list[int]:
        from .. import seam

        return seam.job_host_pids(self._job) if self._job is not None else []

    def release(self, timeout: float = 10.0) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.kill()


def allocate(job: Any, *, hosts: int, procs: int, name: str, log_dir: Path,
             env: dict[str, str] | None = None) -> Allocation | None:
    """The allocation ``job`` asks for, or None for this machine's own host.

    ``job``: None or "local" (this machine; ``hosts > 1`` runs separate local host processes),
    "process", "slurm" or a :class:`~monarch_nb.jobs.slurm.SlurmSpec`, or a
    :class:`~monarch_nb.jobs.kubernetes.KubernetesSpec`.
    """
    from .kubernetes import KubernetesSpec
    from .slurm import SlurmAllocation, SlurmSpec

    if job in (None, "local"):
        return ProcessAllocation(hosts, env) if hosts > 1 else None
    if job == "process":
        return ProcessAllocation(hosts, env)
    if job == "slurm" or isinstance(job, SlurmSpec):
        spec = job if isinstance(job, SlurmSpec) else SlurmSpec()
        return SlurmAllocation(spec.validate(), hosts=hosts, name=name, log_dir=log_dir / "slurm")
    if isinstance(job, KubernetesSpec):
        from .kubernetes_allocation import KubernetesAllocation

        return KubernetesAllocation(job, hosts=hosts, procs=procs, name=name, session_dir=log_dir)
    raise ValueError(f"job: unknown value {job!r}; allowed values: local, process, slurm, a SlurmSpec "
                     "or a KubernetesSpec")
