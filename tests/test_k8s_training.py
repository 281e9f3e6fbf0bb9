"""Kubernetes fault kinds refused by name on a run that is not on Kubernetes. (Runs on the cluster -
a deleted pod replaced by a warm spare pod set and healed from a peer, an eviction, a node gone
NotReady - are notebook 08's test, tests/test_notebooks.py: one run for all three, in CI's time.)"""

from __future__ import annotations

import pytest

from monarch_nb import FTRun, RunConfig

pytestmark = [pytest.mark.slow]


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
