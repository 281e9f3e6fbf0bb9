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
from monarch_nb.jobs.slurm import alive
from helpers.cluster_hosts import (attach_heal_and_check, ended_by_the_cluster, leave_nothing,
                                   resumed_where_it_lived, start_on_cluster, stop_and_nothing_left)
from helpers.proc_checks import processes_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]


def _jobs_of(name: str) -> dict[str, str]:
    """job id -> name of every SLURM job the run holds (its host's and its groups')."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, check=True).stdout
    return {i: n for i, _, n in (line.partition("|") for line in out.splitlines()) if name in n or "replica" in n}


def _start(tmp_path, name, **config):
    return start_on_cluster(tmp_path, name, "slurm", **config)


def _cancel_jobs_of(name):
    for job in _jobs_of(name):
        subprocess.run(["scancel", job], check=False)


def test_a_runs_controller_in_a_slurm_job_of_its_own_is_attached_heals_and_stops(tmp_path):
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

        attach_heal_and_check(run, "onslurm", tmp_path)

        stop_and_nothing_left(run, "onslurm", tmp_path, lambda: not _jobs_of("onslurm"))
        assert not alive(host["slurm_job"])
    finally:
        leave_nothing(run, "onslurm", lambda: _cancel_jobs_of("onslurm"))


def test_cancelling_the_hosts_job_stops_the_run_releases_its_groups_and_it_resumes_in_a_job_again(tmp_path):
    run = _start(tmp_path, "cancelled", checkpoint_every=4)
    try:
        ended_by_the_cluster(run, "cancelled", tmp_path,  # an administrator, or its time limit
                             lambda: subprocess.run(["scancel", run.host["slurm_job"]], check=True),
                             lambda: not _jobs_of("cancelled"))
        resumed_where_it_lived(run, "cancelled", "slurm_job", lambda: not _jobs_of("cancelled"))
    finally:
        leave_nothing(run, "cancelled", lambda: _cancel_jobs_of("cancelled"))
