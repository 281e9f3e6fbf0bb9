"""Monarch meshes on the real one-machine Kubernetes cluster (`./run.sh test` starts it): a host mesh
on pods through Monarch's KubernetesJob, calls and slicing on pods, pods spread over both nodes and
deleted when the mesh goes; a pod deleted under a live mesh fails it at once; bad input fails
within its deadline naming the pod and Kubernetes' own reason, leaving nothing; a kernel killed
while it holds pods has them deleted by the reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from monarch.actor import Actor, current_rank, endpoint

from monarch_nb.jobs.kubernetes_api import KubernetesPodError
from helpers.proc_checks import wait_for

pytestmark = [pytest.mark.k8s]



@pytest.fixture
def k8s(k8s_cluster):
    yield k8s_cluster
    wait_for(lambda: not k8s_cluster.project_pods(), 60, "every pod of the test deleted")


def pod_spec(k8s, **overrides):
    """The local cluster's spec (pods get the kernel's directory and PYTHONPATH, so workers import
    this module's actor classes as local workers do)."""
    return k8s.spec(**overrides)


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, str, str]:
        import socket

        return current_rank().rank, socket.gethostname(), os.environ.get("POD_IP", "")


def test_a_mesh_on_two_pods_spreads_over_both_nodes_and_down_deletes_them(session, k8s):
    mesh = session.up("cluster", procs=2, hosts=2, job=pod_spec(k8s))
    allocation = mesh.allocation
    assert allocation.kind == "kubernetes" and len(allocation.pods) == 2
    assert sorted(allocation.nodes) == ["n1", "n2"], "the spread constraint puts one pod on each node"
    where = session.spawn("where", Where)
    seen = dict(session.deadline(where, 30).where.call())
    assert sorted({host for _, host, _ in seen.values()}) == sorted(allocation.pods)
    assert all(ip.startswith("10.244.") for _, _, ip in seen.values())
    first_pod = session.deadline(where.slice(hosts=0), 30).where.call()  # slicing by Monarch's dims
    assert {host for _, host, _ in dict(first_pod).values()} == {allocation.pods[0]}
    assert k8s.project_pods("monarch"), "the pod set is there while the mesh lives"
    session.down("cluster")
    wait_for(lambda: not k8s.project_pods("monarch"), 30, "the pod set deleted by down")


def test_a_deleted_pod_fails_its_mesh_within_seconds(session, k8s):
    mesh = session.up("victim", procs=1, hosts=1, job=pod_spec(k8s))
    failures = []
    session.on_failure(failures.append)
    from kubernetes import client

    t0 = time.monotonic()
    with k8s.api() as api:
        client.CoreV1Api(api).delete_namespaced_pod(mesh.allocation.pods[0], "monarch", grace_period_seconds=0)
    wait_for(lambda: failures, 15, "the mesh failed after its pod was deleted")
    took = time.monotonic() - t0
    assert took < 5, f"detection took {took:.1f} s"
    assert "deleted" in failures[0].reason or "POD_DELETED" in failures[0].reason, failures[0].reason
    session.down("victim")


@pytest.mark.parametrize("overrides, reason", [
    ({"namespace": "nosuchspace"}, r"namespace: 'nosuchspace' does not exist.*kubectl create namespace"),
    ({"image": "docker.io/monarch-nb/absent:1"}, r"pod \S+-0 is in (ErrImagePull|ImagePullBackOff)"),
    ({"python": "/bin/false"}, r"pod \S+-0( is in CrashLoopBackOff|'s container exited)"),
    ({"node_selector": {"monarch-nb/pool": "gpu"}}, r"pod \S+-0 is Unschedulable: 0/2 nodes"),
], ids=["missing-namespace", "image-not-in-containerd", "crash-at-start", "no-node-matches"])
def test_bad_input_names_the_pod_and_kubernetes_reason_and_leaves_nothing(session, k8s, overrides, reason):
    t0 = time.monotonic()
    with pytest.raises(KubernetesPodError, match=reason):
        session.up("bad", procs=1, hosts=1, job=pod_spec(k8s, timeout_s=60, **overrides))
    assert time.monotonic() - t0 < 60
    assert not k8s.project_pods(), "a refused mesh leaves no pod or pod set"


def test_a_worker_that_crashes_at_start_says_its_last_log_line(session, k8s):
    """A worker image whose torchmonarch differs from the kernel's exits at once; the error carries
    the worker's own last line (its CrashLoopBackOff log), not a timeout."""
    mismatch = pod_spec(k8s, timeout_s=60, env={"MONARCH_NB_VERSIONS": "torchmonarch==0.0.1"})
    with pytest.raises(KubernetesPodError) as err:
        session.up("crash", procs=1, hosts=1, job=mismatch)
    assert "this image has torchmonarch 0.7.0 but the notebook kernel has 0.0.1" in str(err.value)
    assert not k8s.project_pods()


KERNEL = textwrap.dedent("""
    import os, signal, sys
    from monarch_nb import Session
    from monarch_nb.jobs import local_k8s
    s = Session(default_timeout=30)
    mesh = s.up("held", procs=1, hosts=1, job=local_k8s.spec())
    print("UP", mesh.allocation.pod_set, flush=True)
    sys.stdin.read()
""")


def test_a_kernel_killed_while_it_holds_pods_has_them_deleted(k8s):
    proc = subprocess.Popen([sys.executable, "-c", KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("UP "), line
        pod_set = line.split()[1]
        assert any(pod_set in p for p in k8s.project_pods("monarch"))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not k8s.project_pods("monarch"), 60, f"the reaper deleting {pod_set}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
