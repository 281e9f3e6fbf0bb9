"""A run's host as a pod: a Kubernetes Job of one pod (``controller_on="cluster"``, job="kubernetes").

The cluster keeps the run's controller alive and ends it: a Job, not a bare pod, so that it is
deleted with its pod once it ends (``ttlSecondsAfterFinished``), and not restarted when it fails
(``backoffLimit: 0``: a second host would be a second controller of the same run). Deleting the
Job is the run's host terminated: its pod gets SIGTERM and the run stops within the grace period.

The host pod calls the API itself (it makes its groups' pod sets): it runs as a service account of
its own, allowed only what that needs - pod sets (StatefulSet, Service, PodDisruptionBudget) and
their pods in the namespace (read, delete, evict, logs), and nodes read cluster-wide (the drain
watch and the room check). The worker pods still mount no token. Every pod set it makes is owned
by its pod (``ownerReferences``): a host killed outright - SIGKILL, its node lost - leaves no pod
set behind, Kubernetes' garbage collector deletes them with the pod.
"""

from __future__ import annotations

import re
import time
from typing import Any, Sequence

from .kubernetes import KubernetesSpec, host_path_volumes

HOST_ACCOUNT = "monarch-nb-run-host"
HOST_LABEL = "monarch.pytorch.org/run-host"
GRACE_S = 60  # SIGTERM to SIGKILL: the run saves and releases its groups' pod sets in it
HOST_POD_NAME, HOST_POD_UID = "MONARCH_NB_HOST_POD", "MONARCH_NB_HOST_POD_UID"


def job_name(run_name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]", "-", run_name.lower()).strip("-")
    return f"monarch-nb-host-{cleaned}"[:63].rstrip("-")


def manifests(spec: KubernetesSpec, run_name: str, argv: Sequence[str], *, read_only: Sequence[str],
              writable: Sequence[str], working_dir: str | None, env: dict[str, str],
              api_at_host_ip: bool) -> list[dict[str, Any]]:
    """The host's account, its rights, and its Job. ``api_at_host_ip``: the pod reaches the API
    server at its node's address (the one-machine cluster runs no kube-proxy for the Service)."""
    ns, name = spec.namespace, job_name(run_name)
    pod_rules = [
        {"apiGroups": ["apps"], "resources": ["statefulsets"],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    node_rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]
    cluster_name = f"{HOST_ACCOUNT}-{ns}"
    rbac = "rbac.authorization.k8s.io"
    subject = [{"kind": "ServiceAccount", "name": HOST_ACCOUNT, "namespace": ns}]
    variables = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                 # the pod sets it makes are this pod's (kubernetes_allocation.owned_by_host_pod)
                 {"name": HOST_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": HOST_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    if api_at_host_ip:
        variables += [{"name": "KUBERNETES_SERVICE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                      {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]
    variables += [{"name": k, "value": v} for k, v in env.items()]
    mounts, volumes = host_path_volumes(read_only, writable)
    container = {"name": "host", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
                 "command": list(argv), "env": variables, "volumeMounts": mounts,
                 **({"workingDir": working_dir} if working_dir else {})}
    labels = {HOST_LABEL: name}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": HOST_ACCOUNT, "namespace": ns}},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": HOST_ACCOUNT, "namespace": ns},
         "rules": pod_rules},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": HOST_ACCOUNT, "namespace": ns},
         "subjects": subject, "roleRef": {"apiGroup": rbac, "kind": "Role", "name": HOST_ACCOUNT}},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": cluster_name}, "rules": node_rules},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": cluster_name},
         "subjects": subject, "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_name}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 0,
                  "template": {"metadata": {"labels": labels},
                               "spec": {"serviceAccountName": HOST_ACCOUNT, "restartPolicy": "Never",
                                        "terminationGracePeriodSeconds": GRACE_S,
                                        "containers": [container], "volumes": volumes}}}},
    ]


def in_host_pod(spec: KubernetesSpec) -> KubernetesSpec:
    """In a run's host pod the run reads the API in-cluster, as the pod's service account, whatever
    kubeconfig the kernel that placed it used (the run's config keeps the kernel's: a resume places
    the host again from there)."""
    import dataclasses
    import os

    return dataclasses.replace(spec, kubeconfig=None, context=None) if os.environ.get(HOST_POD_UID) else spec


def state(api: Any, namespace: str, name: str) -> str:
    """RUNNING while the Job's pod may still run the host (pending, running, terminating), else
    why not: FAILED with the pod's reason, or GONE."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        job = client.BatchV1Api(api).read_namespaced_job_status(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return "GONE"
        raise
    if job.status.active:
        return "RUNNING"
    if job.status.failed:
        return "FAILED"
    return "SUCCEEDED" if job.status.succeeded else "PENDING"


def pod_problem(api: Any, namespace: str, name: str) -> str | None:
    """Why the host's pod cannot run (an image, a volume, scheduling), in Kubernetes' words."""
    from kubernetes import client

    from .kubernetes_api import pod_problem as problem

    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{HOST_LABEL}={name}").items
    return next((p for p in (problem(api, pod) for pod in pods) if p), None)


def delete(api: Any, namespace: str, name: str, timeout_s: float = 90.0) -> None:
    """Delete the Job (its pod gets SIGTERM, then SIGKILL after GRACE_S) and wait until it is gone."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.BatchV1Api(api).delete_namespaced_job(name, namespace,
                                                      body=client.V1DeleteOptions(propagation_policy="Foreground"))
    except ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + timeout_s
    while state(api, namespace, name) != "GONE" and time.monotonic() < deadline:
        time.sleep(0.2)
