"""What the tests of a run's controller on a cluster (tests/test_slurm_run_host.py,
tests/test_k8s_run_host.py) do alike: start one, drive it from a second client, leave nothing."""

from __future__ import annotations

import os

from helpers.proc_checks import processes_of


def start_on_cluster(tmp_path, name: str, job: str, **config):
    from monarch_nb.ft import FTRun, RunConfig

    return FTRun.detached(RunConfig(replicas=2, model="tiny", job=job, controller_on="cluster",
                                    runs_root=str(tmp_path), run_name=name, **config))


def attach_heal_and_check(run, name: str, root) -> None:
    """As a second kernel would (over TCP, with the run's token): the groups train, a kill injected
    from the first client is healed, the replicas are identical after."""
    from monarch_nb.ft import FTRun
    from monarch_nb.ft.control.waiting import wait_for_rejoin

    other = FTRun.attach(name, root)
    try:
        other.wait_for_step(3, timeout=120)
        assert {g.state for g in other.groups} == {"training"}
        run.inject("kill", replica=1)
        [healed] = wait_for_rejoin(other, 1, timeout=180)
        assert healed.replica == 1, healed
        assert other.check_identical(timeout=120).identical
    finally:
        other.detach()


def leave_nothing(run, name: str, release_cluster) -> None:
    """A failed test leaves nothing either: what the cluster holds of the run (``release_cluster()``),
    no process carrying the run's id, no log followed."""
    release_cluster()
    for pid in processes_of(name):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    run.detach()


def stop_and_nothing_left(run, name: str, root, cluster_empty) -> None:
    """A stop from the client ends the run once; the cluster holds nothing of it after
    (``cluster_empty()``), and no process carries its id."""
    from monarch_nb.ft.control.run_client import live_runs
    from monarch_nb.telemetry.events import RunStopped
    from helpers.proc_checks import wait_for

    run.stop()
    assert run.stopped and len(run.events.events(RunStopped)) == 1
    wait_for(cluster_empty, 60, "the cluster to hold nothing of the run")
    wait_for(lambda: not processes_of(name), 30, "every process of the run to end")
    assert not live_runs(root)


def ended_by_the_cluster(run, name: str, root, end_host, cluster_empty) -> None:
    """What an administrator does to the host's job (``end_host()``) stops the run: recorded as the
    host terminated, the groups' allocations released, nothing left."""
    from monarch_nb.ft.control.run_client import live_runs
    from monarch_nb.telemetry.events import CheckpointSaved, RunStopped
    from helpers.proc_checks import wait_for

    run.wait_for(lambda e: isinstance(e, CheckpointSaved), timeout=120)  # a checkpoint to resume from
    end_host()
    stop = run.wait_for(lambda e: isinstance(e, RunStopped), timeout=90, what="the run's stop")
    assert "terminated" in stop.reason, stop
    wait_for(cluster_empty, 90, "the cluster to hold nothing of the run")
    wait_for(lambda: not processes_of(name), 30, "every process of the run to end")
    assert run.stopped and not live_runs(root)


def resumed_where_it_lived(run, name: str, placed_as: str, cluster_empty) -> None:
    """A run whose host the cluster ended resumes from its checkpoint in a host placed on the cluster
    again (its log says where it lived), trains on, and stops leaving nothing."""
    from monarch_nb.ft import FTRun
    from helpers.proc_checks import wait_for

    again = FTRun.resume_detached(run.run_dir)
    try:
        assert again.host.get(placed_as) and again.resumed_step is not None, again.host
        again.wait_for_step(again.resumed_step + 2, timeout=120)
        again.stop()
        assert again.stopped
        wait_for(cluster_empty, 60, "the cluster to hold nothing of the resumed run")
        wait_for(lambda: not processes_of(name), 30, "every process of the resumed run to end")
    finally:
        again.detach()
