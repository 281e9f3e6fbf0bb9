"""A mesh's hosts as a pod set of its own, through the Kubernetes API and Monarch's ``KubernetesJob``.

In attach mode (with ``create_pods``) the allocation creates its pod set (StatefulSet, headless
Service, PodDisruptionBudget) through the ``kubernetes`` client, waits for it with Kubernetes'
reasons, attaches Monarch's ``KubernetesJob``, watches the pods and their nodes, delivers the
Kubernetes fault kinds, and deletes the pod set on release (or, if the kernel dies, the reaper
does). The spec and the manifests are in :mod:`.kubernetes`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from . import Allocation, JobStatus

log = logging.getLogger(__name__)
from .kubernetes import KubernetesSpec, label_selector, make_kubernetes_job, pod_set, with_shape


class KubernetesAllocation(Allocation):
    """The hosts of one mesh from Kubernetes pods, through Monarch's ``KubernetesJob``.

    In attach mode (with ``create_pods``) the allocation is a pod set of its own, named after the
    mesh plus a random suffix (a replaced group never meets its predecessor's terminating pods):
    created through the API, waited for with Kubernetes' reasons, watched (a pod deleted, evicted
    or gone NotReady fails the mesh at once, as a cancelled SLURM job does), and deleted on release
    or, if the kernel dies, by the reaper. Operator mode hands the pods to Monarch's MonarchMesh.
    """

    kind = "kubernetes"
    local = False

    def __init__(self, spec: KubernetesSpec, *, hosts: int, procs: int, name: str = "workers",
                 session_dir: Path | None = None) -> None:
        spec = with_shape(spec, hosts=hosts, procs=procs)
        if spec.mount_session_dir and session_dir is not None:
            session_dir.mkdir(parents=True, exist_ok=True)
            spec = dataclasses.replace(spec, writable_paths=(*spec.writable_paths, str(session_dir.resolve())))
        self.spec = spec
        from .kubernetes_api import ApiTarget

        self.target = ApiTarget(self.spec.namespace, self.spec.kubeconfig, self.spec.context)
        owns = self.spec.mode == "attach" and self.spec.create_pods
        self.pod_set = pod_set_name(self.spec.mesh, name) if owns else None
        self.mesh_spec = dataclasses.replace(self.spec, mesh=self.pod_set) if owns else self.spec
        self.job_id = f"{self.spec.namespace}/{self.mesh_spec.mesh}"
        self.pods: list[str] = []
        self.nodes: list[str] = []
        self._job: Any = None
        self._api: Any = None
        self._watch: Any = None
        self.timings: dict[str, float] = {}

    def start(self) -> Any:
        from . import kubernetes_api as kapi
        from .kubernetes_watch import PodSetWatch

        spec = self.mesh_spec
        t0 = time.monotonic()
        dials_pods = spec.kubeconfig is not None and spec.attach_to is None and spec.client_address is not None
        if dials_pods:  # before any pod is made: a client the pods cannot reach is refused at once
            from .. import seam_cluster

            seam_cluster.refuse_an_unreachable_client("the pods of a Kubernetes mesh")
        self._api = kapi.api_client(self.target)
        try:
            if self.pod_set is not None:
                kapi.require_namespace(self._api, self.target)
                kapi.apply(self._api, owned_by_host_pod(pod_set(spec)))
                if self.on_submit is not None:  # guarded from now on: the kernel may die before it runs
                    self.on_submit(self.reaper_commands())
            pods = kapi.wait_ready(self._api, self.target, label_selector(spec), spec.hosts or 1,
                                   float(spec.timeout_s or 600))
            self.pods = [p.metadata.name for p in pods]
            self.nodes = [p.spec.node_name or "" for p in pods]
            ready_t = time.monotonic()
            self._watch = PodSetWatch(self._api, self.target, label_selector(spec), self.pods)
            direct = self._api.configuration if dials_pods else None
            self._job = make_kubernetes_job(spec, direct_configuration=direct)
            if direct is not None:
                _listen_where_pods_reach(spec.client_address, pods[0].status.pod_ip)
            self.job_state = self._job.state(cached_path=None)
            # where the wait went: the pods being made and Ready, then Monarch attaching to them
            self.timings = {"pods_ready_s": ready_t - t0, "attach_s": time.monotonic() - ready_t}
            return getattr(self.job_state, spec.mesh)
        except BaseException as failed:
            try:
                self.release()
            except Exception as exc:  # the start's own error is the one to see; say what is left
                failed.add_note(f"releasing the pod set after that also failed: {exc}")
            raise

    cluster_faults = ("pod_delete", "evict", "node_notready")  # the fault kinds Kubernetes delivers here

    def cluster_fault(self, kind: str) -> None:
        """Deliver fault ``kind`` to this pod set's first pod, as Kubernetes would: delete it, evict
        it (its PodDisruptionBudget allows one), or stop its node's kubelet (local cluster only)."""
        from . import kubernetes_api as kapi

        if not self.pods or self._api is None:
            raise RuntimeError(f"{kind}: this allocation holds no pod")
        pod = self.pods[0]
        if kind == "pod_delete":
            kapi.delete_pod(self._api, self.target, pod)
        elif kind == "evict":
            kapi.evict_pod(self._api, self.target, pod)
        elif kind == "node_notready":
            from . import local_k8s

            if self.spec.context != local_k8s.CONTEXT:
                raise ValueError("node_notready: stops a node's kubelet, which only the one-machine cluster "
                                 f"(context {local_k8s.CONTEXT!r}) lets monarch_nb do; use pod_delete or evict")
            local_k8s.stop_node(self.nodes[0])
        else:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(self.cluster_faults)}")

    def status(self) -> JobStatus | None:
        """What the pod and node watch last saw (no API call): RUNNING, or why a pod is not."""
        if self._watch is None:
            return None
        return self._watch.status(self.job_id)

    def reaper_commands(self) -> list[list[str]]:
        if self.pod_set is None:
            return []
        command = [sys.executable, "-m", "monarch_nb.jobs.kubernetes_api", "delete",
                   "--namespace", self.spec.namespace, "--name", self.pod_set,
                   "--selector", label_selector(self.mesh_spec)]
        if self.spec.kubeconfig is not None:
            command += ["--kubeconfig", self.spec.kubeconfig]
        if self.spec.context is not None:
            command += ["--context", self.spec.context]
        return [command]

    def release(self, timeout: float = 10.0) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            seen = watch.status(self.job_id)
            watch.close()
            if seen.state == "NODE_NOT_READY":
                self._fence()
        job, self._job = self._job, None
        if job is not None:
            try:
                job.kill()
            except NotImplementedError:  # attach mode: Monarch does not delete pods; we do below
                pass
        api, self._api = self._api, None
        if api is not None and self.pod_set is not None:
            from . import kubernetes_api as kapi

            kapi.delete(api, self.target, self.pod_set, selector=label_selector(self.mesh_spec),
                        timeout_s=max(timeout, 30.0))
        if api is not None:
            api.close()


    def _fence(self) -> None:
        """A NotReady node's kubelet cannot stop its pods, and their processes may still train and
        answer the quorum (only the kubelet is gone): stop them through Monarch itself before the
        pod set is deleted, so a replaced group's old processes never train beside its new ones."""
        hosts = getattr(self.job_state, self.mesh_spec.mesh, None) if self.job_state is not None else None
        if hosts is None:
            return
        try:
            hosts.shutdown().get(timeout=FENCE_TIMEOUT_S)
        except Exception as exc:  # a host that cannot be reached cannot train either
            log.warning("stopping the processes of %s on a NotReady node: %s", self.job_id, exc)


FENCE_TIMEOUT_S = 10.0


def owned_by_host_pod(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In a run's host pod (``kubernetes_host.py``) each document is the pod's: Kubernetes deletes
    them with it, so a host killed outright leaves no pod set behind. Elsewhere unchanged."""
    import os

    from .kubernetes_host import HOST_POD_NAME, HOST_POD_UID

    uid = os.environ.get(HOST_POD_UID)
    if not uid:
        return docs
    owner = {"apiVersion": "v1", "kind": "Pod", "name": os.environ[HOST_POD_NAME], "uid": uid}
    return [{**doc, "metadata": {**doc["metadata"], "ownerReferences": [owner]}} for doc in docs]


def pod_set_name(mesh: str, name: str) -> str:
    """A pod set's name: the spec's mesh, the session's mesh name (letters and digits) and a
    random suffix, within Monarch's and the StatefulSet's 52 lowercase letters and digits."""
    cleaned = re.sub(r"[^a-z0-9]", "", name.lower())
    return f"{mesh}{cleaned}"[:46] + secrets.token_hex(3)


def _listen_where_pods_reach(address: str | None, pod_ip: str) -> None:
    """Make Monarch's client listen on an address the pods route to ("auto": the local address
    of the route to ``pod_ip``); KubernetesJob set a hostname transport, and this machine's
    hostname may resolve to loopback only."""
    import socket

    from .. import seam_cluster

    if address == "auto":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((pod_ip, 9))  # a UDP connect sends nothing: it only picks the route
            address = probe.getsockname()[0]
    seam_cluster.listen_where_workers_reach(address, "the pods of a Kubernetes mesh")
