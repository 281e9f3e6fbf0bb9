"""Meshes and fault-tolerant runs on a real SLURM cluster (two virtual nodes of this machine,
started by `./run.sh slurm up` / `./run.sh test`): allocations through Monarch's SlurmJob,
processes on both nodes, allocations released by down, a downed node detected and recovered on a
fresh allocation (a preemption: the cluster notebook's test), second faults while a victim's quorum
forms, and bad input refused with nothing left queued."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
from monarch.actor import Actor, current_rank, endpoint

from monarch_nb import Session
from monarch_nb.errors import MonarchNbError
from monarch_nb.jobs.slurm import SlurmSpec, job_states, resume_node
from monarch_nb.telemetry.events import Healed, Rejoined, ReplicasIdentical, Respawned, Step
from helpers.proc_checks import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, str | None, str | None, str]:
        import socket

        return current_rank().rank, os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURMD_NODENAME"), \
            socket.gethostname()


def queued(job_id: str) -> bool:
    return job_states([job_id])[job_id].state not in ("GONE", "CANCELLED", "COMPLETED", "NODE_FAIL", "FAILED")


def test_a_two_node_mesh_runs_on_both_nodes_and_down_releases_the_allocation(session):
    mesh = session.up("cluster", procs=2, hosts=2, job="slurm")
    job_id = mesh.allocation.job_id
    assert queued(job_id) and sorted(mesh.allocation.nodes) == ["n1", "n2"]
    assert {(p.job_id, p.node) for p in mesh.procs} == {(job_id, "n1"), (job_id, "n2")}
    where = session.spawn("where", Where)
    seen = session.deadline(where, 30).where.call()
    assert {v[1] for _, v in seen} == {job_id}  # the workers see their SLURM_JOB_ID
    assert {(v[2], v[3]) for _, v in seen} == {("n1", "n1"), ("n2", "n2")}  # each on its own node
    from monarch_nb.notebook.html import mesh_html

    table = mesh_html(mesh)
    assert f"job <b>{job_id}</b>" in table and "<th" in table and ">node<" in table
    session.down("cluster")
    assert not queued(job_id), "down must leave nothing in squeue"


def test_a_cancelled_allocation_fails_its_mesh_within_seconds(session):
    mesh = session.up("victim", procs=1, hosts=1, job="slurm")
    failures = []
    session.on_failure(failures.append)
    t0 = time.monotonic()
    subprocess.run(["scancel", mesh.allocation.job_id], check=True)
    wait_for(lambda: failures, 10, "the session to notice the cancelled allocation")
    took = time.monotonic() - t0
    # the job watcher polls every 1 s (JOB_WATCH_INTERVAL_S): typically ~1-2 s; 10 s is >= 5x
    assert took < 10, f"scancel -> mesh failure took {took:.1f} s"
    assert "CANCELLED" in failures[0].reason and failures[0].mesh == "victim"
    t0 = time.monotonic()
    session.down("victim")  # nothing left to stop politely: no wait
    took = time.monotonic() - t0
    assert took < 10, f"down of a cancelled allocation took {took:.1f} s: it waited out the polite stop's 10 s"


@pytest.mark.parametrize("spec, hosts, expected", [
    (SlurmSpec(partition="nope"), 1, "partition: 'nope' is not a partition of this cluster; partitions: debug"),
    (SlurmSpec(), 5, "hosts: 5 nodes asked for, but partition 'debug' has 2; ask for at most 2"),
    (SlurmSpec(start_timeout_s=2, slurm_args=("--begin=now+1hour",)), 1, "is PENDING (BeginTime) after 2 s"),
])
def test_bad_requests_are_refused_naming_the_fix_and_leave_no_job(session, spec, hosts, expected):
    before = set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split())
    with pytest.raises(MonarchNbError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        session.up("bad", hosts=hosts, job=spec)
    after = set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split())
    assert after <= before, f"a refused request left jobs queued: {after - before}"
    assert "bad" not in session.meshes


def test_slurm_missing_or_unreachable_is_a_clear_error(session, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/local/nonexistent")
    with pytest.raises(MonarchNbError, match="SLURM is not installed here .*./run.sh slurm up"):
        session.up("nowhere", job="slurm")
    monkeypatch.undo()
    conf = tmp_path / "slurm.conf"  # a cluster whose controller nobody runs
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=6999\nAuthType=auth/munge\n"
                    "NodeName=x CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=x Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    with pytest.raises(MonarchNbError, match="cannot reach the SLURM controller"):
        session.up("nowhere", job="slurm")


# ---- a fault-tolerant run on SLURM allocations ------------------------------------------------


# A second fault while replica 1's first quorum after its kill forms (its process group is
# being built): the case 1 (a survivor preempted: the donor waited on it and was
# killed) and case 2 (the node holding that quorum's store goes down: a healthy group on
# another node was killed as "comms"). See lab/chaos.py for the trial.
SECOND_FAULTS = {"preempt-survivor": ("formed", "survivor", "preempt"),
                 "node_down-of-the-store": ("formed", "store", "node_down")}


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory):
    from monarch_nb.ft import FTRun, RunConfig
    from lab.chaos import Cell, run_trial

    # checkpoints: a node_down may take every holder of the state; the run then resumes from disk
    run = FTRun(RunConfig(replicas=3, job="slurm", checkpoint_every=10,
                          runs_root=str(tmp_path_factory.mktemp("slurm_ft"))))
    outcomes, second = {}, {}
    try:
        run.start()
        run.wait_for_step(3, timeout=180)
        jobs_before = {g.index: run.session.mesh(g.name).allocation.job_id for g in run.groups}
        nodes = {g.index: run.session.mesh(g.name).allocation.nodes[0] for g in run.groups}
        # node_down: a group alone on its node (a preemption and its recovery on a fresh allocation:
        # the cluster notebook's test, test_notebooks.py)
        alone = [r for r, n in nodes.items() if list(nodes.values()).count(n) == 1]
        assert alone, f"groups did not spread over the nodes: {nodes}"
        plan = [("node_down", alone[0])]
        for kind, victim in plan:
            since = time.time()
            run.inject(kind, replica=victim)
            rejoined = run.wait_for(lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v, 180, since=since)
            identical = run.wait_for(lambda e, t=rejoined.t: isinstance(e, ReplicasIdentical) and e.t >= t, 120)
            new_job = run.session.mesh(f"replica{victim}").allocation.job_id
            outcomes[kind] = (victim, since, rejoined, identical, jobs_before[victim], new_job, nodes[victim])
            if kind == "node_down":
                resume_node(nodes[victim])
        for n, (case, cell) in enumerate(SECOND_FAULTS.items()):
            second[case] = run_trial(run, Cell(*cell), trial=n, victim=1)
    finally:
        run.stop()
    return run, outcomes, second


@pytest.mark.parametrize("kind", ["node_down"])
def test_cluster_fault_is_recovered_on_a_fresh_allocation_healed_from_a_peer(slurm_run, kind):
    run, outcomes, _ = slurm_run
    victim, since, rejoined, identical, old_job, new_job, node = outcomes[kind]
    recovery = next(r for r in run.history().recoveries() if r.fault == kind)
    assert recovery.replica == victim and recovery.status == "recovered"
    assert recovery.rung == "hosts", recovery  # the ladder entered at the rung for an ended allocation
    # noticed by the session's job watcher (polls every 1 s): typically ~1-2 s; 10 s is >= 5x
    assert recovery.detection_s is not None and recovery.detection_s < 10, \
        f"detection_s={recovery.detection_s}: {kind} -> failure noticed; {recovery}"
    assert recovery.acquired_how == "allocation" and new_job != old_job and not queued(old_job)
    (healed,) = [e for e in run.events.events(Healed) if since <= e.t <= rejoined.t and e.replica == victim]
    assert healed.source_replica in {0, 1, 2} - {victim} and healed.bytes > 1_000_000
    assert identical.identical, identical.hashes
    # the survivors kept committing while the victim was out
    (respawned,) = [e for e in run.events.events(Respawned) if since <= e.t <= rejoined.t and e.replica == victim]
    # (in quorums without the victim: a node noticed down within 50 ms can precede the commit of a step
    # the victim took part in - twice in CI, once after its own last commit: it died after the average)
    theirs = {e.quorum_id for e in run.events.events(Step) if e.replica == victim and e.t < respawned.t}
    commits = [e for e in run.events.events(Step) if recovery.detected_t <= e.t <= respawned.t and e.committed
               and e.replica != victim and e.quorum_id not in theirs]
    assert commits and all(e.participants == 2 for e in commits)


@pytest.mark.parametrize("case", list(SECOND_FAULTS))
def test_a_second_fault_while_the_victims_quorum_forms_fails_no_healthy_group(slurm_run, case):
    run, _, second = slurm_run
    rec = second[case]
    assert rec.fired and rec.second != rec.victim, rec  # a group other than the victim was hit
    assert rec.healthy_failed == 0, rec
    assert not rec.state_lost and rec.recovered and rec.identical and rec.left_in_squeue == 0, rec


def test_the_run_leaves_no_allocation_behind(slurm_run):
    run, outcomes, _ = slurm_run
    jobs = [o[4] for o in outcomes.values()] + [o[5] for o in outcomes.values()]
    assert not [j for j in jobs if queued(j)]


def test_a_killed_kernel_releases_its_allocations(kernel):
    from helpers.kernel_client import run_in_kernel

    km, client = kernel
    status, out = run_in_kernel(client, "%monarch up --slurm --hosts 2 --procs 1\n"
                                        "import monarch_nb\n"
                                        "print('JOB', monarch_nb.current_session().mesh('main').allocation.job_id)")
    assert status == "ok", out
    job_id = re.search(r"JOB (\d+)", out).group(1)
    assert queued(job_id)
    os.kill(km.provisioner.process.pid, 9)
    t0 = time.monotonic()
    wait_for(lambda: not queued(job_id), 15, f"the reaper to cancel SLURM job {job_id}")
    took = time.monotonic() - t0
    # the reaper polls every 0.25 s, then scancel: typically ~1-2 s; 10 s is >= 5x
    assert took < 10, f"kernel killed -> SLURM job {job_id} gone took {took:.1f} s"


def test_a_jobs_worker_port_is_free_and_below_the_ephemeral_range(monkeypatch):
    """32 allocations at once on one machine: a port taken with bind(0) was handed out again
    before the worker bound it ("Address already in use", the job failed). Ports now come from
    below the kernel's ephemeral range, and are free when chosen."""
    import socket

    from monarch_nb.jobs import slurm

    low, _ = slurm._ephemeral_range()
    ports = {slurm._free_port() for _ in range(20)}
    assert all(1024 <= p < low - slurm.EPHEMERAL_GAP for p in ports) and len(ports) > 1
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("", port))  # free: it binds
