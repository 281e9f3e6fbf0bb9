"""Watches of a pod set's pods and their nodes: how a mesh on Kubernetes learns of a fault at once.

Two threads per pod set, each a ``kubernetes`` watch (pods by the set's selector; the nodes the
pods run on), keep what Kubernetes last said; ``status()`` reads it without an API call, once a
second from the session's failure watch. A pod deleted or evicted (with no grace period left to
serve in), a pod whose container stopped being ready, or a node gone NotReady (its kubelet stopped
posting status) turns the status from RUNNING into the state and reason that fail the mesh, usually
before Monarch's own supervision notices a silent host.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from . import JobStatus

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 30  # a watch is renewed this often (the server ends long watches anyway)


class PodSetWatch:
    """Pods ``names`` picked by ``selector`` and the nodes under them, watched until ``close``."""

    def __init__(self, api: Any, target: Any, selector: str, names: list[str]) -> None:
        self._api, self._target, self._selector = api, target, selector
        self._names = set(names)
        self._lock = threading.Lock()
        self._problems: dict[str, tuple[str, str]] = {}  # pod or node -> (state, reason); guarded by _lock
        self._node_of: dict[str, str] = {}  # pod -> node name; guarded by _lock
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(watcher,), daemon=True,
                                          name=f"monarch_nb-k8s-{kind}")
                         for kind, watcher in (("pods", self._watch_pods), ("nodes", self._watch_nodes))]
        for thread in self._threads:
            thread.start()

    def status(self, job_id: str) -> JobStatus:
        with self._lock:
            if not self._problems:
                return JobStatus(job_id, "RUNNING", nodes=",".join(sorted(set(self._node_of.values()))))
            what, (state, reason) = sorted(self._problems.items())[0]
            return JobStatus(job_id, state, reason=reason, nodes=self._node_of.get(what, what))

    def close(self) -> None:
        self._stop.set()

    # ---- the watches -----------------------------------------------------------------------------

    def _loop(self, watcher: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                watcher()
            except Exception as exc:  # the API server restarted or the watch expired: watch again
                if self._stop.wait(0.5):
                    return
                log.debug("kubernetes watch: %s", exc)

    def _stream(self, list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes import watch

        stream = watch.Watch()
        try:
            for event in stream.stream(list_call, *args, timeout_seconds=WATCH_TIMEOUT_S, **kwargs):
                if self._stop.is_set():
                    return
                yield event
        finally:
            stream.stop()

    def _watch_pods(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        for event in self._stream(core.list_namespaced_pod, self._target.namespace, label_selector=self._selector):
            pod = event["object"]
            name = pod.metadata.name
            if name not in self._names:
                continue
            problem = _pod_problem(event["type"], pod)
            with self._lock:
                if pod.spec.node_name:
                    self._node_of[name] = pod.spec.node_name
                if problem is not None:
                    self._problems.setdefault(name, problem)  # the first account names the cause

    def _watch_nodes(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        for event in self._stream(core.list_node):
            node = event["object"]
            with self._lock:
                if node.metadata.name not in self._node_of.values():
                    continue
                ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
                if event["type"] == "DELETED":
                    self._problems.setdefault(node.metadata.name, ("NODE_GONE", f"node {node.metadata.name} deleted"))
                elif ready is not None and ready.status != "True":
                    self._problems.setdefault(node.metadata.name, (
                        "NODE_NOT_READY", f"node {node.metadata.name} is NotReady: {ready.reason}: {ready.message}"))


def _pod_problem(event_type: str, pod: Any) -> tuple[str, str] | None:
    """(state, reason) for a pod that no longer serves its mesh, else None. A pod evicted with a
    grace period (``kubectl drain``) still serves: the run moves its group (ft/control/node_drains.py);
    when the grace ends its deletion is the problem."""
    from .kubernetes_api import graceful_departure

    name = pod.metadata.name
    disruption = next((c for c in pod.status.conditions or [] if c.type == "DisruptionTarget"
                       and c.status == "True"), None)
    evicting = disruption is not None and disruption.reason == "EvictionByEvictionAPI" \
        and pod.metadata.deletion_timestamp is None  # the Eviction API marks the pod, then deletes it
    if event_type != "DELETED" and pod.status.phase == "Running" and (evicting or graceful_departure(pod)):
        return None  # its deletion says how long it serves on: none (a problem when DELETED comes) or a grace
    if disruption is not None:
        return "POD_EVICTED" if disruption.reason == "EvictionByEvictionAPI" else "POD_DISRUPTED", \
            f"pod {name}: {disruption.reason}: {disruption.message}"
    if event_type == "DELETED" or pod.metadata.deletion_timestamp is not None:
        return "POD_DELETED", f"pod {name} deleted"
    if pod.status.phase in ("Failed", "Succeeded"):
        return "POD_FAILED", f"pod {name} is {pod.status.phase}: {pod.status.reason or ''}".rstrip(": ")
    for cs in pod.status.container_statuses or []:
        if cs.restart_count:
            return "POD_RESTARTED", f"pod {name}'s worker restarted ({cs.restart_count}x)"
    return None
