"""A ``kubectl drain`` of a node is noticed by the run, and its group moves before the pod goes (issue 54).

On the real one-machine Kubernetes cluster (two nodes): two groups, each a pod set of its own; the
node of a group alone there is drained as ``kubectl drain`` does it - cordoned, then its pods
evicted through the Eviction API with their own grace period (``kubernetes.DRAIN_GRACE_S``, the
worker serving on through a preStop sleep; the PodDisruptionBudget allows one). The run moves the
group (a replacement pod set - scheduled on the other node, the cordoned one takes nothing -
heals and commits a step with the others, then the group's pod set is deleted): recorded as
``draining``/``drained`` naming the node or the pod, never as a failure, within the grace period;
identical after.
"""

from __future__ import annotations

import time

import pytest

from monarch_nb.jobs.kubernetes import DRAIN_GRACE_S
from monarch_nb.telemetry.events import Drained, Draining, FailureDetected

from helpers.fresh_process import in_a_fresh_process

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def _cordon(local_k8s, node: str, on: bool) -> None:
    from kubernetes import client

    with local_k8s.api() as api:
        client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": on}})


def _evict_with_its_grace(local_k8s, pod: str) -> None:
    """What ``kubectl drain`` sends for each pod: an Eviction naming no grace period."""
    from kubernetes import client

    with local_k8s.api() as api:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace="monarch"))
        client.CoreV1Api(api).create_namespaced_pod_eviction(pod, "monarch", body)


def test_a_drained_node_moves_its_group_within_the_pods_grace_period_and_nothing_fails(tmp_path, k8s_cluster):
    in_a_fresh_process(_drain_a_groups_node, str(tmp_path), timeout=600)


def _drain_a_groups_node(runs_root: str) -> None:
    """The test's body, in a process whose first mesh is on the cluster (a kernel that trains there)."""
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.jobs import local_k8s as k8s_cluster

    run = FTRun(RunConfig(replicas=2, job="kubernetes", model="tiny", runs_root=runs_root, run_name="k8s-drain"))
    node = other = None
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        where = {g.index: run.session.mesh(g.name).allocation for g in run.groups}
        nodes = {r: a.nodes[0] for r, a in where.items()}
        alone = [r for r, n in nodes.items() if list(nodes.values()).count(n) == 1]
        assert alone, f"groups did not spread over the nodes: {nodes}"
        victim, node, pod = alone[0], nodes[alone[0]], where[alone[0]].pods[0]
        since = time.time()
        _cordon(k8s_cluster, node, True)
        _evict_with_its_grace(k8s_cluster, pod)
        moved = run.wait_for(lambda e: isinstance(e, Drained), timeout=DRAIN_GRACE_S, since=since)
        began = next(e for e in run.events.events(Draining) if e.t >= since)
        assert moved.replica == victim, (moved, nodes)
        assert f"node {node} is cordoned" in began.reason or f"pod {pod} is being evicted" in began.reason, began
        assert moved.t - since < DRAIN_GRACE_S - 5, "moved while the evicted pod still served"
        assert not [e for e in run.events.events(FailureDetected) if e.t >= since]  # a move, not a failure
        replacement = run.session.mesh(f"replica{moved.replacement}").allocation.nodes[0]
        assert replacement != node, (replacement, node)
        same = run.check_identical(timeout=120)
        assert same.identical and len(same.hashes) == 2, same
        assert pod not in "".join(k8s_cluster.project_pods()), "the evicted pod was deleted by the move"
        # Both nodes cordoned, no spare: a move has nowhere to go - refused up front, nothing started.
        other = replacement
        _cordon(k8s_cluster, other, True)
        pods = k8s_cluster.project_pods()
        refused_at = time.time()
        try:
            run.drain(moved.replacement)
            raise AssertionError("a drain with no node to go to was not refused")
        except ValueError as refused:
            assert "no warm spare is ready and no node takes a new pod" in str(refused), refused
            assert f"{other} is cordoned" in str(refused) and f"{node} is cordoned" in str(refused), refused
        assert k8s_cluster.project_pods() == pods, "a refused drain made a pod set"
        assert not [e for e in run.events.events(Draining) if e.t >= refused_at]
        run.wait_for_step(max(g.step for g in run.groups.active()) + 2, timeout=60)  # the groups train on
    finally:
        run.stop()
        for n in {node, other} - {None}:
            _cordon(k8s_cluster, n, False)
