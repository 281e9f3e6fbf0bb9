"""A SLURM node set to DRAIN is noticed by the run, and its group moves before the node goes (issue 54).

On the real one-machine SLURM cluster (two virtual nodes): two groups, each on an allocation of
its own; an administrator's ``scontrol update nodename=N state=drain`` on the node of a group alone
there. The run moves that group (a replacement allocation - SLURM schedules nothing on N - heals
and commits a step with the others, then the group leaves): recorded as ``draining``/``drained``
with the node named, never as a failure; the replacement is on the other node; identical after.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from monarch_nb.jobs.slurm import resume_node
from monarch_nb.telemetry.events import Drained, Draining, FailureDetected

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]


def test_a_group_on_a_draining_node_is_moved_before_the_node_goes(tmp_path):
    from monarch_nb.ft import FTRun, RunConfig

    run = FTRun(RunConfig(replicas=2, job="slurm", runs_root=str(tmp_path), run_name="node-drain"))
    node = other = None
    try:
        run.start()
        run.wait_for_step(3, timeout=180)
        nodes = {g.index: run.session.mesh(g.name).allocation.nodes[0] for g in run.groups}
        alone = [r for r, n in nodes.items() if list(nodes.values()).count(n) == 1]
        assert alone, f"groups did not spread over the nodes: {nodes}"
        victim, node = alone[0], nodes[alone[0]]
        since = time.time()
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=maintenance"], check=True)
        moved = run.wait_for(lambda e: isinstance(e, Drained), timeout=240, since=since)
        began = next(e for e in run.events.events(Draining) if e.t >= since)
        assert moved.replica == victim and f"node {node} set to DRAIN" in began.reason, (moved, began)
        assert began.t - since < 10, "noticed within a few looks of the node's state"
        assert not [e for e in run.events.events(FailureDetected) if e.t >= since]  # a move, not a failure
        replacement = run.session.mesh(f"replica{moved.replacement}").allocation.nodes[0]
        assert replacement != node, (replacement, node)
        same = run.check_identical(timeout=120)
        assert same.identical and len(same.hashes) == 2, same
        # Both nodes draining, no spare: a move has nowhere to go - refused up front, nothing started.
        other = replacement
        subprocess.run(["scontrol", "update", f"nodename={other}", "state=drain", "reason=maintenance"], check=True)
        jobs = _our_jobs()
        refused_at = time.time()
        with pytest.raises(ValueError, match=r"no warm spare is ready and no SLURM node can start an allocation"):
            run.drain(moved.replacement)
        assert _our_jobs() == jobs, "a refused drain started an allocation"
        assert not [e for e in run.events.events(Draining) if e.t >= refused_at]
        run.wait_for_step(max(g.step for g in run.groups.active()) + 2, timeout=60)  # the groups train on
    finally:
        run.stop()
        for n in {node, other} - {None}:
            resume_node(n)


def _our_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, check=True).stdout
    return sorted(line for line in out.splitlines() if "monarch_nb-" in line)
