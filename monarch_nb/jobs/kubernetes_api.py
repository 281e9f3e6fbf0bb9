"""The Kubernetes API as monarch_nb uses it: create a pod set, wait for it with Kubernetes' own reasons, delete it.

Every call goes through the ``kubernetes`` Python client. A pod set (Service + StatefulSet) is what
one host mesh stands on; ``wait_ready`` watches its pods and turns what Kubernetes says into one
clear error - the pod's name and Kubernetes' reason (ErrImagePull, ImagePullBackOff, CrashLoopBackOff
with the last log line, Unschedulable, a missing namespace) - instead of waiting out a timeout.
``delete`` removes the pod set and waits until no pod of it is left, so a released mesh leaves
nothing behind. Run as ``python -m monarch_nb.jobs.kubernetes_api delete ...`` it is also what the
orphan reaper runs when a kernel dies holding pods.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from monarch_nb.errors import MonarchNbError

# Waiting reasons that will not fix themselves: fail at once with the pod's name and the reason.
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError",
                 "RunContainerError")


class KubernetesPodError(MonarchNbError, RuntimeError):
    """A pod of a mesh cannot run; the message names the pod and Kubernetes' reason."""


@dataclass(frozen=True)
class ApiTarget:
    """Which cluster and namespace: a kubeconfig path (None: in-cluster) and its context."""

    namespace: str
    kubeconfig: str | None = None
    context: str | None = None


def api_client(target: ApiTarget) -> Any:
    """An ``ApiClient`` of its own (not the process-wide default Monarch's KubernetesJob sets)."""
    from kubernetes import client, config

    if target.kubeconfig is None:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=target.kubeconfig, context=target.context)


def require_namespace(api: Any, target: ApiTarget) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).read_namespace(target.namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise KubernetesPodError(
                f"namespace: {target.namespace!r} does not exist on the cluster; create it "
                f"(kubectl create namespace {target.namespace}) or set KubernetesSpec(namespace=...)") from None
        if exc.status == 403:  # an account allowed into its namespace only may not read namespaces
            return
        raise


def apply(api: Any, docs: Sequence[dict[str, Any]], *, dry_run: bool = False) -> None:
    """Create each document (server-side), or replace it when it exists. ``dry_run``: the API
    server validates and admits every document and stores nothing."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(api)
    extra = {"dry_run": "All"} if dry_run else {}
    for doc in docs:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = doc["metadata"].get("namespace") if resource.namespaced else None
        try:
            resource.create(body=doc, namespace=namespace, **extra)
        except ApiException as exc:
            if exc.status != 409:
                raise _api_error(doc, exc) from None
            resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=namespace,
                                       field_manager="monarch-nb", force_conflicts=True, **extra)


def _api_error(doc: dict[str, Any], exc: Any) -> KubernetesPodError:
    import json

    try:
        message = json.loads(exc.body).get("message", exc.reason)
    except (TypeError, ValueError):
        message = exc.reason
    return KubernetesPodError(f"{doc['kind']} {doc['metadata']['name']!r}: the API server refused it "
                              f"({exc.status} {exc.reason}): {message}")


def pod_problem(api: Any, pod: Any) -> str | None:
    """Why ``pod`` cannot run, in Kubernetes' words, or None while it may still become ready."""
    name = pod.metadata.name
    status = pod.status
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
            return f"pod {name} is Unschedulable: {condition.message}"
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING:
            detail = waiting.message or ""
            if waiting.reason == "CrashLoopBackOff" or cs.restart_count:
                detail = f"its last log line: {last_log_line(api, pod) or '(no output)'}"
            return f"pod {name} is in {waiting.reason}: {detail}".rstrip(": ")
        terminated = cs.state.terminated if cs.state else None
        if terminated is not None and cs.restart_count >= 1:
            return (f"pod {name}'s container exited ({terminated.reason}, code {terminated.exit_code}); "
                    f"its last log line: {last_log_line(api, pod) or '(no output)'}")
    if status.phase == "Failed":
        return f"pod {name} failed: {status.reason or ''} {status.message or ''}".strip()
    return None


def last_log_line(api: Any, pod: Any) -> str:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    for previous in (False, True):  # the container that just exited, else the one before it
        try:  # the raw bytes: the client's own decoding returns the repr of bytes (kubernetes 36)
            text = core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, previous=previous,
                                                tail_lines=5, _preload_content=False).data.decode(errors="replace")
        except ApiException:
            continue
        if text.startswith("unable to retrieve container logs"):  # the kubelet's words for "none kept"
            continue
        lines = [line for line in (text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    return ""


def is_ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def wait_ready(api: Any, target: ApiTarget, selector: str, count: int, timeout_s: float) -> list[Any]:
    """The ``count`` pods ``selector`` picks once all are Ready; raises KubernetesPodError naming
    the first pod that cannot run (or, at the deadline, each pod's phase)."""
    from kubernetes import client, watch

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout_s
    listed = core.list_namespaced_pod(target.namespace, label_selector=selector)
    pods: dict[str, Any] = {p.metadata.name: p for p in listed.items}
    version = listed.metadata.resource_version
    events = iter(())
    while True:
        for pod in pods.values():
            problem = pod_problem(api, pod)
            if problem is not None:
                raise KubernetesPodError(f"{problem} (namespace {target.namespace})")
        ready = [p for p in pods.values() if is_ready(p)]
        if len(ready) >= count:
            return sorted(ready, key=lambda p: p.metadata.name)[:count]
        left = deadline - time.monotonic()
        if left <= 0:
            seen = ", ".join(f"{n}: {p.status.phase}" for n, p in sorted(pods.items())) or "no pod at all"
            raise KubernetesPodError(f"{count} pods of {selector!r} not Ready within {timeout_s:.0f} s "
                                     f"(namespace {target.namespace}; {seen})")
        event = next(events, None)
        if event is None:  # (re)start the watch where the last list or event left off
            events = watch.Watch().stream(core.list_namespaced_pod, target.namespace, label_selector=selector,
                                          resource_version=version, timeout_seconds=max(1, int(min(left, 5))))
            continue
        pod = event["object"]
        version = pod.metadata.resource_version
        if event["type"] == "DELETED":
            pods.pop(pod.metadata.name, None)
        else:
            pods[pod.metadata.name] = pod


def delete(api: Any, target: ApiTarget, name: str, *, selector: str, timeout_s: float = 60.0) -> None:
    """Delete pod set ``name`` (StatefulSet, Service, PodDisruptionBudget) and wait until none of its
    pods is left. A pod still there after FORCE_AFTER_S (its node's kubelet is gone, so nothing
    confirms the deletion) is removed from the API at once, as ``kubectl delete --force`` does."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    apps, core, policy = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    body = client.V1DeleteOptions(propagation_policy="Background", grace_period_seconds=0)
    for call in (lambda: apps.delete_namespaced_stateful_set(name, target.namespace, body=body),
                 lambda: core.delete_namespaced_service(f"{name}-svc", target.namespace),
                 lambda: policy.delete_namespaced_pod_disruption_budget(name, target.namespace)):
        try:
            call()
        except ApiException as exc:
            if exc.status != 404:
                raise
    start = time.monotonic()
    while True:
        left = core.list_namespaced_pod(target.namespace, label_selector=selector).items
        if not left:
            return
        waited = time.monotonic() - start
        for pod in left:  # the StatefulSet is gone; its pods go at once (not in turn, not after their grace)
            if pod.metadata.deletion_timestamp is None or waited > FORCE_AFTER_S or graceful_departure(pod):
                delete_pod(api, target, pod.metadata.name)
        if waited > timeout_s:
            raise KubernetesPodError(f"pods of {name} still present {timeout_s:.0f} s after deleting it: "
                                     + ", ".join(p.metadata.name for p in left))
        time.sleep(0.2)


FORCE_AFTER_S = 3.0


def planned_departures(api: Any, target: ApiTarget, selector: str) -> dict[str, str]:
    """What is about to leave, planned (``kubectl drain``): ``"node N"`` for each cordoned node,
    ``"pod P"`` for each pod ``selector`` picks that is evicted or deleted with a grace period left."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    out = {f"node {n.metadata.name}": "is cordoned" for n in core.list_node().items if n.spec.unschedulable}
    for pod in core.list_namespaced_pod(target.namespace, label_selector=selector).items:
        if graceful_departure(pod):
            out[f"pod {pod.metadata.name}"] = f"is being evicted ({pod.metadata.deletion_grace_period_seconds} s grace)"
    return out


def no_room(api: Any, cpu: str | None) -> str | None:
    """Why no node takes one more pod now (None: one does): every node cordoned or not Ready, or,
    for a pod requesting ``cpu``, none with that much allocatable CPU unrequested."""
    from kubernetes import client
    from kubernetes.utils import parse_quantity

    core = client.CoreV1Api(api)
    closed, open_ = [], []
    for n in core.list_node().items:
        ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        if n.spec.unschedulable or not ready:
            closed.append(f"{n.metadata.name} is {'cordoned' if n.spec.unschedulable else 'not Ready'}")
        else:
            open_.append(n)
    if not open_:
        return f"no node takes a new pod ({', '.join(closed) or 'the cluster has no node'})"
    if cpu is None:
        return None
    requested: dict[str, Any] = {}
    for pod in core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items:
        for c in pod.spec.containers:
            asked = ((c.resources and c.resources.requests) or {}).get("cpu")
            if asked and pod.spec.node_name:
                requested[pod.spec.node_name] = requested.get(pod.spec.node_name, 0) + parse_quantity(asked)
    free = {n.metadata.name: parse_quantity(n.status.allocatable.get("cpu", "0")) - requested.get(n.metadata.name, 0)
            for n in open_}
    best = max(free, key=free.get)
    if free[best] >= parse_quantity(cpu):
        return None
    return f"no node has {cpu} CPU unrequested for a new pod (the most is {free[best]} on {best})"


def graceful_departure(pod: Any) -> bool:
    """A running pod evicted or deleted with a grace period: it serves on until the grace ends."""
    return (pod.metadata.deletion_timestamp is not None and (pod.metadata.deletion_grace_period_seconds or 0) > 0
            and pod.status.phase == "Running")


def delete_pod(api: Any, target: ApiTarget, pod: str) -> None:
    """Delete ``pod`` with no grace period (the ``pod_delete`` fault; a forced delete of a pod
    whose node no longer answers)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).delete_namespaced_pod(pod, target.namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def evict_pod(api: Any, target: ApiTarget, pod: str) -> None:
    """Evict ``pod`` through the Eviction API (what ``kubectl drain`` does); refused with the
    PodDisruptionBudget's words when the budget allows no disruption now."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=target.namespace),
                             delete_options=client.V1DeleteOptions(grace_period_seconds=0))
    try:
        client.CoreV1Api(api).create_namespaced_pod_eviction(pod, target.namespace, body)
    except ApiException as exc:
        raise KubernetesPodError(f"evicting pod {pod}: {exc.status} {exc.reason}: {exc.body}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``delete``: what the reaper runs for a kernel that died holding a pod set."""
    p = argparse.ArgumentParser(prog="python -m monarch_nb.jobs.kubernetes_api")
    p.add_argument("action", choices=["delete"])
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--selector", required=True)
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--context", default=None)
    a = p.parse_args(argv)
    target = ApiTarget(a.namespace, a.kubeconfig, a.context)
    delete(api_client(target), target, a.name, selector=a.selector)
    return 0


if __name__ == "__main__":
    sys.exit(main())
