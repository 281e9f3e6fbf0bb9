"""Semi-synchronous training under faults: torchft's LocalSGD and DiLoCo (``RunConfig(sync=...)``).

Each group trains on its own and the groups meet every ``sync_every`` steps. One run per mode
(R=3, tiny, a meeting every 10 steps) on real processes and a real Lighthouse: a group killed in
the middle of an inner loop is replaced, trains provisionally (its steps uncommitted) until the
next meeting heals it from a peer, and then every group holds the same parameters at a meeting
("identical" here: the model's parameters at a meeting step; each group's inner optimizer state
is its own). No healthy group fails for it, and the loss falls.
"""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import (FailureDetected, Healed, Rejoined, ReplicasIdentical, Respawned, RungStarted,
                                         Step)

pytestmark = pytest.mark.slow

SYNC_EVERY = 10


def _run(sync: str, tmp_path_factory, fault: str) -> tuple[FTRun, dict]:
    run = FTRun(RunConfig(replicas=3, sync=sync, sync_every=SYNC_EVERY, runs_root=str(tmp_path_factory.mktemp(sync)),
                          run_name=f"semi-{sync}"))
    seen: dict = {}
    try:
        run.start()
        run.wait_for_step(SYNC_EVERY + 3, timeout=180)  # inside the second inner loop
        seen["since"] = time.time()
        run.inject(fault, replica=1)
        seen["rejoined"] = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=180,
                                        since=seen["since"])
        seen["identical"] = run.check_identical(timeout=120)
    finally:
        run.stop()
    return run, seen


@pytest.fixture(scope="module")
def local_sgd(tmp_path_factory):
    return _run("local_sgd", tmp_path_factory, "kill")


@pytest.fixture(scope="module")
def diloco(tmp_path_factory):
    return _run("diloco", tmp_path_factory, "comms")


def _promises(run: FTRun, seen: dict) -> None:
    since = seen["since"]
    failed = {e.replica for e in run.events.events(FailureDetected) if e.t >= since}
    assert failed == {1}, failed  # no healthy group failed for the victim's fault
    assert [e.rung for e in run.events.events(RungStarted) if e.t >= since] == ["process"]
    heal = next(e for e in run.events.events(Healed) if e.replica == 1 and e.t >= since)
    assert heal.source_replica in (0, 2) and heal.cause == "recovery", heal  # from a live peer, at a meeting
    first = seen["rejoined"].step
    assert first % SYNC_EVERY == 0, first  # back at a meeting step, the peers' count
    back = next(e for e in run.events.events(Respawned) if e.replica == 1 and e.t >= since)  # the new process
    provisional = [e for e in run.events.events(Step) if e.replica == 1 and back.t <= e.t < seen["rejoined"].t]
    assert provisional and not any(e.committed for e in provisional), provisional[:3]
    same: ReplicasIdentical = seen["identical"]
    assert same.step % SYNC_EVERY == 0 and same.identical and len(same.hashes) == 3, same
    summary = run.history().summary()
    assert summary["loss_end"] < summary["loss_start"] - 1.0, summary


def test_local_sgd_a_group_killed_between_meetings_heals_at_the_next_and_all_agree_there(local_sgd):
    _promises(*local_sgd)


def test_diloco_a_comms_fault_replaces_the_process_and_it_heals_at_the_next_meeting(diloco):
    """In-place repair is not built for semi-synchronous training (torchft's hooks hold the
    Manager): the ladder enters at ``process`` for the comms fault."""
    _promises(*diloco)


def test_diloco_and_local_sgd_mark_their_meetings_in_the_step_records(local_sgd, diloco):
    for run, _ in (local_sgd, diloco):
        meetings = [e for e in run.events.events(Step) if e.replica == 0 and e.synced is not None]
        assert meetings and all(e.step % SYNC_EVERY == 0 for e in meetings if e.synced), meetings[:3]
        between = [e for e in run.events.events(Step) if e.replica == 0 and e.synced is None and e.committed]
        assert between and all(e.step % SYNC_EVERY for e in between)
