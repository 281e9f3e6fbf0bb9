"""A named run's controller placed on the cluster (issue 52): ``controller_on="cluster"`` runs the
run's host as a SLURM job of its own, on the real one-machine SLURM cluster.

The host is no process of ours (slurmd starts it); a client reaches it over TCP with the run's
token; attach, status, a fault healed and a stop work as they do for a host on this machine; a
``scancel`` of the host's job (what an administrator or the job's time limit does) stops the run
and releases its groups' allocations; nothing of the run is left either way.
"""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from monarch_nb.ft.control.run_client import CONTROL_DIR, HOST, live_runs
from monarch_nb.ft.control.waiting import wait_for_rejoin
from monarch_nb.jobs.slurm import alive
from monarch_nb.telemetry.events import RunStopped, Step
from helpers.proc_checks import processes_of, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]


def _jobs_of(name: str) -> dict[str, str]:
    """job id -> name of every SLURM job the run holds (its host's and its groups')."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, check=True).stdout
    return {i: n for i, _, n in (line.partition("|") for line in out.splitlines()) if name in n or "replica" in n}


def _start(tmp_path, name):
    from monarch_nb.ft import FTRun, RunConfig

    return FTRun.detached(RunConfig(replicas=2, model="tiny", job="slurm", controller_on="cluster",
                                    runs_root=str(tmp_path), run_name=name))


def _leave_nothing(run, name):
    for job in _jobs_of(name):
        subprocess.run(["scancel", job], check=False)
    for pid in processes_of(name):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    run.detach()


def test_a_runs_controller_in_a_slurm_job_of_its_own_is_attached_heals_and_stops(tmp_path):
    from monarch_nb.ft import FTRun

    run = _start(tmp_path, "onslurm")
    try:
        host = json.loads((run.run_dir / CONTROL_DIR / HOST).read_text())
        assert host["slurm_job"] and host["address"] and host["node"] in ("n1", "n2"), host
        assert _jobs_of("onslurm")[host["slurm_job"]] == "monarch_nb-host-onslurm"
        assert os.getpid() not in [p.pid for p in psutil.Process(host["pid"]).parents()], "slurmd starts it, not us"
        assert len(_jobs_of("onslurm")) == 3, _jobs_of("onslurm")  # the host's job and each group's allocation
        assert len(processes_of("onslurm")) > 2, "its workers (and reaper, Lighthouse) carry its id"
        [row] = live_runs(tmp_path)
        assert row["name"] == "onslurm" and row["where"] == f"SLURM job {host['slurm_job']} on {host['node']}", row

        other = FTRun.attach("onslurm", tmp_path)  # as a second kernel would: over TCP, with the token
        try:
            other.wait_for_step(3, timeout=120)
            assert {g.state for g in other.groups} == {"training"}
            run.inject("kill", replica=1)
            [healed] = wait_for_rejoin(other, 1, timeout=120)
            assert healed.replica == 1, healed
            assert other.check_identical(timeout=120).identical
        finally:
            other.detach()

        run.stop()
        assert run.stopped and len(run.events.events(RunStopped)) == 1
        assert not alive(host["slurm_job"]) and not _jobs_of("onslurm"), _jobs_of("onslurm")
        wait_for(lambda: not processes_of("onslurm"), 30, "every process of the run to end")
        assert not live_runs(tmp_path)
    finally:
        _leave_nothing(run, "onslurm")


def test_cancelling_the_hosts_job_stops_the_run_and_releases_its_groups_allocations(tmp_path):
    run = _start(tmp_path, "cancelled")
    try:
        run.wait_for(lambda e: isinstance(e, Step) and e.committed, timeout=120)
        subprocess.run(["scancel", run.host["slurm_job"]], check=True)  # an administrator, or its time limit
        stop = run.wait_for(lambda e: isinstance(e, RunStopped), timeout=60, what="the run's stop")
        assert "terminated" in stop.reason, stop
        wait_for(lambda: not _jobs_of("cancelled"), 30, "the host's and the groups' SLURM jobs to end")
        wait_for(lambda: not processes_of("cancelled"), 30, "every process of the run to end")
        assert run.stopped and not live_runs(tmp_path)
    finally:
        _leave_nothing(run, "cancelled")
