"""Where a replica group's processes come from: this host, a ProcessJob host, or a cluster job.

A placement answers one question for the supervisor: the keyword arguments for
``Session.up`` that bring up group ``index``'s processes. A failed group always gets fresh
processes (Monarch cannot spawn onto a damaged proc mesh), through the same call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ... import seam
from ..spec.config import slurm_spec


class Placement:
    """Every group on this host, as local processes (the default)."""

    name = "local"
    bind_host = "127.0.0.1"  # what the Lighthouse binds: only this host must reach it
    advertise_host = "127.0.0.1"  # what workers advertise to peers ("auto": their node's address)
    shares_this_host = True  # every group's processes share this host's cores

    def up_kwargs(self, index: int) -> dict[str, Any]:
        return {}

    def spare_kwargs(self) -> dict[str, Any]:
        """Where a warm spare group runs (any group may take its place)."""
        return {}

    def extra_pids(self) -> list[int]:
        """Processes the placement started besides the workers (checked for orphans after stop)."""
        return []

    def close(self) -> None:
        pass


class HostMeshPlacement(Placement):
    """Each group on the host mesh a function returns (a slice of a cluster job's hosts)."""

    name = "host_mesh"
    bind_host = "0.0.0.0"
    advertise_host = "auto"
    shares_this_host = False

    def __init__(self, host_mesh_for: Callable[[int], Any]) -> None:
        self._host_mesh_for = host_mesh_for

    def up_kwargs(self, index: int) -> dict[str, Any]:
        return {"host_mesh": self._host_mesh_for(index)}

    def spare_kwargs(self) -> dict[str, Any]:
        raise ValueError("spares: not available with host_mesh_for (its host meshes are per group)")


class ProcessJobPlacement(Placement):
    """Each group on its own "host" of one Monarch ``ProcessJob`` (separate local processes)."""

    name = "process"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self._job: Any = None
        self._hosts: Any = None
        # Groups start in parallel: without the lock two threads each started a job, and the
        # hosts of the one not kept were never killed (orphans after stop).
        self._lock = threading.Lock()

    def up_kwargs(self, index: int) -> dict[str, Any]:
        with self._lock:
            if self._job is None:
                from monarch.job import ProcessJob

                self._job = ProcessJob({"hosts": self.replicas})
                self._hosts = self._job.state(cached_path=None).hosts
            return {"host_mesh": self._hosts.slice(hosts=index)}

    def spare_kwargs(self) -> dict[str, Any]:
        raise ValueError("spares: not available with job='process' (one ProcessJob host per group); "
                         "use job='local' or 'slurm'")

    def extra_pids(self) -> list[int]:
        return seam.job_host_pids(self._job) if self._job is not None else []

    def close(self) -> None:
        if self._job is not None:
            self._job.kill()


class SlurmPlacement(Placement):
    """Each group on its own SLURM allocation; a failed group gets a fresh one (a real cluster
    replaces a dead node that way, and Monarch cannot respawn onto a damaged host mesh)."""

    name = "slurm"
    bind_host = "0.0.0.0"  # the Lighthouse must be reachable from the nodes
    advertise_host = "auto"
    shares_this_host = False  # a node per allocation (on the test cluster the nodes share a host, unknown here)

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        from ...jobs.slurm import controller_address

        # this machine's hostname resolves only to loopback (a one-machine cluster): bind the
        # address the nodes route to, which the Lighthouse then advertises
        self.bind_host = controller_address() or "0.0.0.0"

    def up_kwargs(self, index: int) -> dict[str, Any]:
        return {"job": self.spec}

    def spare_kwargs(self) -> dict[str, Any]:
        return {"job": self.spec}


def placement_for(config: Any, host_mesh_for: Callable[[int], Any] | None = None) -> Placement:
    job = config.job
    if host_mesh_for is not None:
        return HostMeshPlacement(host_mesh_for)
    if job == "local":
        return Placement()
    if job == "process":
        return ProcessJobPlacement(config.replicas)
    if job == "slurm":
        return SlurmPlacement(slurm_spec(config))
    raise ValueError(f"job: {job!r} needs host_mesh_for=lambda r: <that job's host mesh>; "
                     "see monarch.job.KubernetesJob")
