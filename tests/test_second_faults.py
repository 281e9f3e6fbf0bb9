"""Second faults during a recovery, on real processes: a peer that dies while a victim is being
brought back never gets a healthy group failed, the state is never lost while a group holds it,
and every group comes back bit-identical. A fault aimed at a moment of a recovery is armed in
the worker (``inject(..., during=PHASE)``) and fires when that process enters the phase, so the
cells do not depend on timing. Also: total loss without a checkpoint is said truthfully and has
a way out, and an allocation whose controller dies before its mesh is up is released."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from monarch_nb.ft import FTRun, RunConfig
from lab.chaos import survivors_quorum
from monarch_nb.telemetry.events import (
    AllGroupsLost,
    CommsRetry,
    FailureDetected,
    Healed,
    Rejoined,
    RestartedFromScratch,
    Step,
)
from helpers.proc_checks import assert_gone, wait_for


@pytest.fixture(scope="module")
def second_faults(tmp_path_factory):
    """One 3-group run for the module's cells: first the overlapping ones (in each, replica 1 is
    killed and, while it is brought back, replica 2 is hit at the moment the victim's quorum
    builds its process group: the issue's "preempt during a heal", where the donor, replica 0,
    waited on a peer that was gone and was killed); then the matrix's trials, one per phase."""
    from lab.chaos import Cell, run_trial

    run = FTRun(RunConfig(replicas=3, runs_root=str(tmp_path_factory.mktemp("second"))))
    cells: dict = {}
    records: dict = {}
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        for kind in ("kill", "comms"):
            since = time.time()
            donor_pids = list(run.groups[0].pids)
            run.inject("kill", replica=1)
            survivors_quorum(run, 1, since, timeout=60)
            run.inject(kind, replica=2, during="pg_setup")  # fires in the victim's quorum
            back = [run.wait_for(lambda e, v=v: isinstance(e, Rejoined) and e.replica == v, timeout=240, since=since)
                    for v in (1, 2)]
            until = time.time()  # both rejoins recorded (a rebuild at once rejoins before the controller's events)
            identical = run.check_identical(timeout=120)
            cells[kind] = dict(since=since, back=back, until=until, identical=identical, donor_pids=donor_pids,
                               donor_pids_after=list(run.groups[0].pids))
        cells["end"] = time.time()  # the matrix's trials come after: the overlapping cells' window ends here
        for n, cell in enumerate(MATRIX):
            records[cell] = run_trial(run, Cell(*cell), trial=n)
    finally:
        run.stop()
    return run, cells, records


@pytest.fixture(scope="module")
def overlapping(second_faults):
    run, cells, _ = second_faults
    return run, cells


@pytest.fixture(scope="module")
def matrix(second_faults):
    run, _, records = second_faults
    return run, records


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kill", "comms"])
def test_a_peer_lost_while_the_victims_process_group_is_built_fails_no_healthy_group(overlapping, kind):
    run, cells = overlapping
    cell = cells[kind]
    since, until = cell["since"], cell["until"]
    fired = [line for line in open(run.fault_log) if '"during": "pg_setup"' in line
             and json.loads(line)["t"] <= cells["end"]]
    assert len(fired) == 2, "each cell's second fault fired inside a process-group setup"
    failed = [e for e in run.events.events(FailureDetected) if since <= e.t <= until]
    assert sorted({e.replica for e in failed}) == [1, 2], [(e.replica, e.reason) for e in failed]
    assert cell["donor_pids_after"] == cell["donor_pids"], "the donor, replica 0, kept its process"
    committed = [e for e in run.events.events(Step) if e.replica == 0 and e.committed and since <= e.t <= until]
    assert committed, "replica 0 went on committing while the others were brought back"
    healed = [e for e in run.events.events(Healed) if since <= e.t <= until and e.replica in (1, 2)]
    assert healed and all(h.source_replica is not None for h in healed), "the victims healed from a live peer"
    assert cell["identical"].identical and len(cell["identical"].hashes) == 3


@pytest.mark.slow
def test_a_survivor_whose_quorum_broke_retries_instead_of_failing(overlapping):
    run, cells = overlapping
    retries = [e for e in run.events.events(CommsRetry) if e.t <= cells["end"]]
    # Whoever was building the quorum's group with the lost peer retried (with a rebuilt
    # Manager) rather than failing; no retry was ever turned into a failure of replica 0.
    assert retries, "a group whose process-group setup lost a peer records a comms_retry"
    # a peer killed in its process-group setup never connects: the others find out within the
    # connect window (a quarter of pg_timeout_s), not a whole pg_timeout_s (10 s before)
    window = run.config.pg_timeout_s / 4
    for line in open(run.fault_log):
        fired = json.loads(line)
        if fired.get("during") == "pg_setup" and fired["fault"] == "kill" and fired["t"] <= cells["end"]:
            first = min(e.t for e in retries if e.t >= fired["t"])
            assert first - fired["t"] < window + 2.0, (first - fired["t"], window)
    assert not [e for e in run.events.events(FailureDetected) if e.replica == 0 and e.t <= cells["end"]]
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=20)


@pytest.mark.slow
def test_total_loss_without_a_checkpoint_waits_truthfully_and_can_restart_from_scratch(tmp_path):
    run = FTRun(RunConfig(replicas=2, runs_root=str(tmp_path)))
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        run.scale(1)
        assert run.status()[1]["state"] == "retired" and run.status()[1]["pids"] == [], "retired: no pids"
        run.wait_for_step(run.status()[0]["step"] + 2, timeout=60)  # waits on live groups, not the retired one
        since = time.time()
        run.inject("kill", replica=0)
        lost = run.wait_for(lambda e: isinstance(e, AllGroupsLost), timeout=120, since=since)
        wait_for(lambda: run.status()[0]["state"] == "waiting", 60, "replica 0 to say it waits for a state holder")
        with pytest.raises(TimeoutError):  # nothing trains from scratch unasked
            run.wait_for(lambda e: isinstance(e, Step) and e.committed and e.t > lost.t, timeout=3, since=lost.t)
        restarted = run.restart_from_scratch()
        run.wait_for(lambda e: isinstance(e, Step) and e.committed and e.step >= 3, timeout=120, since=restarted.t)
        with pytest.raises(RuntimeError, match="hold the run's state"):
            run.restart_from_scratch()
    finally:
        run.stop()
    assert lost.checkpoint is None and "restart_from_scratch" in lost.detail
    assert len(run.events.events(AllGroupsLost)) == 1, "total loss is said once"
    assert isinstance(restarted, RestartedFromScratch) and restarted.replicas == [0] and restarted.lost_step >= 3
    after = [e for e in run.events.events(Step) if e.committed and e.t > restarted.t]
    assert after[0].step == 1, "training starts again at step 1 from the initial weights"


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_an_allocation_requested_by_a_controller_that_dies_before_its_mesh_is_up_is_released(tmp_path):
    name = f"orphan{os.getpid()}"
    script = textwrap.dedent(f"""
        import monarch_nb
        from monarch_nb.jobs.slurm import SlurmSpec
        session = monarch_nb.Session()
        # held PENDING for an hour: the controller dies while the allocation is being made
        session.up({name!r}, procs=1, hosts=1, job=SlurmSpec(start_timeout_s=600, slurm_args=("--begin=now+3600",)))
        print("mesh up", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True)

    def pending_job() -> list[str] | None:  # [job id, state, time limit] of our job, if queued
        lines = subprocess.run(["squeue", "-h", "-o", "%i %j %T %l"], capture_output=True, text=True).stdout
        ours = [line.split() for line in lines.splitlines() if f" monarch_nb-{name}" in line]
        return [ours[0][0], ours[0][2], ours[0][3]] if ours else None

    def guarded() -> bool:  # the controller's reaper is watching (it learnt the job at submission)
        return any(str(proc.pid) in " ".join(p.info["cmdline"] or []) and "monarch_nb.reaper" in
                   " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))

    try:
        job_id, state, limit = wait_for(pending_job, 60, "the allocation to be submitted")
        wait_for(guarded, 30, "the reaper to guard the submitted allocation")
        assert state == "PENDING" and limit == "1-00:00:00", (state, limit)  # finite by default
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: pending_job() is None, 30, f"job {job_id} to be cancelled by the reaper")
    finally:
        if proc.poll() is None:
            proc.kill()
        left = pending_job()
        if left:
            subprocess.run(["scancel", left[0]], capture_output=True)
    assert "mesh up" not in (proc.stdout.read() if proc.stdout else "")


# ---- the second-fault matrix: one cell per phase the controller sees ------------------------

MATRIX = [("detect", "survivor", "kill"), ("teardown", "donor", "comms"), ("acquire", "donor", "kill"),
          ("build", "survivor", "comms"), ("quorum", "victim", "kill"), ("rejoin", "victim", "comms")]


@pytest.mark.slow
@pytest.mark.parametrize("cell", MATRIX, ids=["-".join(c) for c in MATRIX])
def test_a_second_fault_at_each_phase_fails_no_healthy_group_and_loses_nothing(matrix, cell):
    run, records = matrix
    rec = records[cell]
    assert rec.fired, rec
    assert rec.healthy_failed == 0, rec
    assert not rec.state_lost and rec.recovered and rec.identical, rec
    assert (rec.second == rec.victim) == (cell[1] == "victim"), rec


@pytest.mark.slow
def test_the_matrix_run_left_no_process(matrix):
    run, _ = matrix
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=20)
