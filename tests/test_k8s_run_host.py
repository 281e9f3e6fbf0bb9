"""A named run's controller placed on Kubernetes (issue 52): ``controller_on="cluster"`` with
job="kubernetes" runs the run's host as the pod of a Kubernetes Job of its own, on the real
one-machine cluster.

The host pod makes its groups' pod sets itself, as a service account allowed only that; a client
reaches it at its pod IP with the run's token; attach, status, a fault healed and a stop work as
for a host on this machine; deleting the host's Job (what an operator does) stops the run and
deletes its groups' pod sets; nothing of the run is left either way.
"""

from __future__ import annotations

import json

import pytest

from monarch_nb.ft.control.run_client import CONTROL_DIR, HOST, live_runs
from monarch_nb.jobs import local_k8s
from monarch_nb.jobs.kubernetes_host import HOST_ACCOUNT, HOST_LABEL
from monarch_nb.telemetry.events import Step
from helpers.cluster_hosts import (attach_heal_and_check, ended_by_the_cluster, leave_nothing,
                                   resumed_where_it_lived, start_on_cluster, stop_and_nothing_left)
from helpers.proc_checks import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.usefixtures("k8s_cluster")]


def _pods() -> list[str]:
    """Every pod and host Job of ours on the cluster (the groups' and the host's)."""
    return local_k8s.project_pods("monarch")


def _can(verb: str, resource: str, namespace: str | None = "monarch") -> bool:
    """What the run host's service account may do, as the API server's authorizer answers it."""
    from kubernetes import client

    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:monarch:{HOST_ACCOUNT}",
        groups=["system:serviceaccounts", "system:serviceaccounts:monarch", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace,
                                                        group="apps" if resource == "statefulsets" else
                                                        "batch" if resource == "jobs" else "")))
    with local_k8s.api() as api:
        return bool(client.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed)


def _delete_host_jobs() -> None:
    from kubernetes import client

    with local_k8s.api() as api:
        batch = client.BatchV1Api(api)
        for job in batch.list_namespaced_job("monarch", label_selector=HOST_LABEL).items:
            batch.delete_namespaced_job(job.metadata.name, "monarch",
                                        body=client.V1DeleteOptions(propagation_policy="Foreground"))


def _start(tmp_path, name, **config):
    return start_on_cluster(tmp_path, name, "kubernetes", **config)


def test_a_runs_controller_in_a_pod_of_its_own_makes_its_groups_pods_is_attached_heals_and_stops(tmp_path):
    run = _start(tmp_path, "onpods")
    try:
        host = json.loads((run.run_dir / CONTROL_DIR / HOST).read_text())
        assert host["kubernetes_job"] == "monarch-nb-host-onpods" and host["node"] in ("n1", "n2"), host
        assert host["address"][0].startswith("10.244."), host  # its pod IP: a pod's name resolves nowhere else
        from kubernetes import client

        with local_k8s.api() as api:
            [pod] = client.CoreV1Api(api).list_namespaced_pod(
                "monarch", label_selector=f"{HOST_LABEL}={host['kubernetes_job']}").items
        assert pod.spec.service_account_name == HOST_ACCOUNT and pod.status.pod_ip == host["address"][0]
        assert len([p for p in _pods() if p.startswith("pod/")]) == 3, _pods()  # the host's pod and each group's
        [row] = live_runs(tmp_path)
        assert row["where"] == f"Kubernetes Job monarch/monarch-nb-host-onpods on {host['node']}", row
        # the host's account may make pod sets and read nodes, and nothing beyond
        assert _can("create", "statefulsets") and _can("list", "nodes", None) and _can("delete", "pods")
        for verb, resource, namespace in (("get", "secrets", "monarch"), ("create", "pods", "monarch"),
                                          ("create", "statefulsets", "default"), ("delete", "nodes", None),
                                          ("create", "jobs", "monarch")):
            assert not _can(verb, resource, namespace), (verb, resource, namespace)

        attach_heal_and_check(run, "onpods", tmp_path)

        stop_and_nothing_left(run, "onpods", tmp_path, lambda: not _pods())
    finally:
        leave_nothing(run, "onpods", _delete_host_jobs)


def test_deleting_the_hosts_job_stops_the_run_deletes_its_groups_pods_and_it_resumes_on_a_pod_again(tmp_path):
    run = _start(tmp_path, "deleted", checkpoint_every=4)
    try:
        ended_by_the_cluster(run, "deleted", tmp_path, _delete_host_jobs, lambda: not _pods())  # an operator
        resumed_where_it_lived(run, "deleted", "kubernetes_job", lambda: not _pods())
    finally:
        leave_nothing(run, "deleted", _delete_host_jobs)


def test_a_host_killed_outright_leaves_no_pod_set_kubernetes_deletes_them_with_its_pod(tmp_path):
    """SIGKILL of the host (a node lost does the same): nothing of ours runs to delete the groups'
    pod sets; they are the host pod's, and Kubernetes' garbage collector deletes them with it."""
    import psutil
    from kubernetes import client

    run = _start(tmp_path, "killed")
    try:
        run.wait_for(lambda e: isinstance(e, Step) and e.committed, timeout=120)
        [host] = [p for p in psutil.process_iter(["cmdline"])
                  if "monarch_nb.ft.control.run_host" in " ".join(p.info["cmdline"] or [])
                  and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
        with local_k8s.api() as api:
            sets = client.AppsV1Api(api).list_namespaced_stateful_set("monarch").items
        assert len(sets) == 2 and all(s.metadata.owner_references[0].kind == "Pod" for s in sets), sets
        host.kill()

        def all_going() -> bool:  # the Job, its pod, the Services and budgets gone; the rest being deleted
            with local_k8s.api() as api:
                core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
                if (client.BatchV1Api(api).list_namespaced_job("monarch").items
                        or core.list_namespaced_pod("monarch", label_selector=HOST_LABEL).items
                        or core.list_namespaced_service("monarch").items
                        or policy.list_namespaced_pod_disruption_budget("monarch").items):
                    return False
                rest = (apps.list_namespaced_stateful_set("monarch").items  # foreground: until their pods
                        + core.list_namespaced_pod("monarch").items)       # end their drain grace
                return all(o.metadata.deletion_timestamp is not None for o in rest)

        wait_for(all_going, 90, "Kubernetes to delete the host's Job and pod and the groups' pod sets")
        wait_for(lambda: run.stopped, 30, "the client to see the run's host gone")
        with pytest.raises(ValueError, match=r"is not live|is gone"):
            from monarch_nb.ft import FTRun

            FTRun.attach("killed", tmp_path)
    finally:
        leave_nothing(run, "killed", _delete_host_jobs)
        with local_k8s.api() as api:
            core = client.CoreV1Api(api)
            for pod in core.list_namespaced_pod("monarch").items:  # not 2 minutes of their drain grace
                core.delete_namespaced_pod(pod.metadata.name, "monarch", grace_period_seconds=0)
        wait_for(lambda: not _pods(), 60, "the workers' pods to go")
