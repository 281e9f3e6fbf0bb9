"""Where a replica group's processes come from: this host, a ProcessJob host, or a cluster job.

A placement answers one question for the supervisor: the keyword arguments for
``Session.up`` that bring up group ``index``'s processes. A failed group always gets fresh
processes (Monarch cannot spawn onto a damaged proc mesh), through the same call.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

from ... import seam
from ..settings.config import kubernetes_spec, slurm_spec


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

    def no_room(self) -> str | None:
        """Why one more group cannot start now (None: it can, or the placement cannot tell);
        asked before a drain that has no warm spare, so a move that cannot come is refused."""
        return None

    def share(self, run_dir: str, data_dir: str) -> None:
        """Where the run writes and what its workers read, for placements that must mount them."""

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

    def no_room(self) -> str | None:
        from ...jobs.slurm import no_room

        return no_room(self.spec.cpus_per_task or 1, self.spec.exclusive, self.spec.partition)


RUN_LABEL = "monarch.pytorch.org/run"


class KubernetesPlacement(Placement):
    """Each group on a pod set of its own (``KubernetesSpec``); a failed group gets a fresh pod
    set, as a node lost or a pod evicted on a real cluster asks for."""

    name = "kubernetes"
    advertise_host = "auto"  # a pod's hostname resolves to its pod IP inside the pod
    shares_this_host = False

    def __init__(self, spec: Any) -> None:
        import dataclasses

        self.spec = spec
        self._replace = dataclasses.replace
        # The Lighthouse must be reachable from the pods: on a cluster whose pod network this
        # host routes (the one-machine cluster) the address of that route, else every interface.
        # A run's host in a pod (controller_on="cluster"): its own pod IP (pods resolve no pod's name).
        self.bind_host = pod_facing_address(spec) or os.environ.get("POD_IP") or "0.0.0.0"

    def share(self, run_dir: str, data_dir: str) -> None:
        # Every pod set of the run carries the run's label, so the scheduler spreads the run's
        # groups and spares over the nodes: a node lost takes as few of them as it can.
        run_label = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(run_dir).name)[-63:].strip("-_.") or "run"
        self.spec = self._replace(self.spec, labels={**self.spec.labels, RUN_LABEL: run_label})
        if self.spec.mount_session_dir:  # the one-machine cluster: workers write where local ones do
            self.spec = self._replace(self.spec, writable_paths=(*self.spec.writable_paths, run_dir),
                                      host_paths=(*self.spec.host_paths, data_dir))

    def up_kwargs(self, index: int) -> dict[str, Any]:
        return {"job": self.spec}

    def spare_kwargs(self) -> dict[str, Any]:
        return {"job": self.spec}

    def no_room(self) -> str | None:
        from ...jobs import kubernetes_api as kapi

        target = kapi.ApiTarget(self.spec.namespace, self.spec.kubeconfig, self.spec.context)
        with kapi.api_client(target) as api:
            return kapi.no_room(api, self.spec.cpu)


def pod_facing_address(spec: Any) -> str | None:
    """This host's address on the local cluster's pod network when ``spec`` is for that cluster."""
    from ...jobs import local_k8s

    if spec.context != local_k8s.CONTEXT:
        return None
    import psutil

    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return next((gw for gw in local_k8s.POD_GATEWAYS if gw in mine), None)


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
    if job == "kubernetes":
        return KubernetesPlacement(kubernetes_spec(config))
    raise ValueError(f"job: {job!r} needs host_mesh_for=lambda r: <that job's host mesh>; "
                     "see monarch.job.KubernetesJob")
