"""Fault-tolerant runs on the real one-machine Kubernetes cluster: each replica group on a pod set of
its own, a deleted pod replaced by a warm spare pod set and healed from a peer, identical after;
Kubernetes fault kinds refused by name on a run that is not on Kubernetes."""

from __future__ import annotations

import time

import pytest

from monarch_nb import FTRun, RunConfig
from monarch_nb.telemetry.events import Rejoined, SpareState
from helpers.proc_checks import wait_for

pytestmark = [pytest.mark.slow]


@pytest.mark.k8s
def test_a_deleted_pod_is_replaced_by_a_spare_pod_set_and_healed_from_a_peer(k8s_cluster):
    run = FTRun(RunConfig(replicas=2, spares=1, model="tiny", job="kubernetes"))
    try:
        run.start()
        run.wait_for_step(3, timeout=180)
        placed = {g.name: run.session.mesh(g.name).allocation for g in run.groups}
        assert all(a.kind == "kubernetes" and len(a.pods) == 1 for a in placed.values())
        run.wait_for(lambda e: isinstance(e, SpareState) and e.state == "ready", timeout=180)
        victim_pod = placed["replica1"].pods[0]
        t0 = time.time()
        run.inject("pod_delete", replica=1)
        run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=120, since=t0)
        rec = run.history().recoveries()[-1]
        assert rec.fault == "pod_delete" and rec.status == "recovered" and rec.rung == "hosts", rec
        assert rec.acquired_how == "spare" and rec.heal_bytes and rec.heal_sources == [0], rec
        assert "POD_DELETED" in (rec.reason or ""), rec.reason
        # seen by the pod watch within its one-second poll; 10 s is generous on a loaded box
        assert rec.detection_s is not None and rec.detection_s < 10, rec
        assert run.session.mesh("replica1").allocation.pods[0] != victim_pod
        check = run.check_identical(timeout=60)
        assert check is not None and check.identical, check
    finally:
        run.stop()
    wait_for(lambda: not k8s_cluster.project_pods(), 60, "every pod set of the run deleted by stop")


def test_kubernetes_faults_are_refused_by_name_on_a_local_run():
    run = FTRun(RunConfig(replicas=1, model="tiny"))
    try:
        run.start()
        for kind in ("pod_delete", "evict", "node_notready"):
            with pytest.raises(ValueError, match=rf"kind: {kind} needs a run on Kubernetes pods \(job='kubernetes'\); "
                                                 r"this run's job is 'local'"):
                run.inject(kind, replica=0)
        with pytest.raises(ValueError, match=r"kind: preempt needs a run on SLURM allocations"):
            run.inject("preempt", replica=0)
    finally:
        run.stop()
