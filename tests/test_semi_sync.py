"""Semi-synchronous training under faults: torchft's LocalSGD and DiLoCo (``RunConfig(sync=...)``).

Each group trains on its own and the groups meet every ``sync_every`` steps. One run per mode
(R=3, tiny, a meeting every 10 steps) on real processes and a real Lighthouse. LocalSGD: a group
killed in the middle of an inner loop is replaced, trains provisionally (its steps uncommitted)
until the next meeting heals it from a peer. DiLoCo: a comms fault inside an inner loop and one
at a meeting are each fixed on the communicator rung, in place. Then every group holds the same
parameters at a meeting ("identical" here: the model's parameters at a meeting step; each
group's inner optimizer state is its own). No healthy group fails for it, and the loss falls.
"""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from helpers.agree import all_agree
from monarch_nb.telemetry.events import (FailureDetected, Healed, Rejoined, Repaired, ReplicasIdentical,
                                         Respawned, RungStarted, Step)

pytestmark = pytest.mark.slow

SYNC_EVERY = 10


def _run(sync: str, tmp_path_factory, drive) -> tuple[FTRun, dict]:
    run = FTRun(RunConfig(replicas=3, sync=sync, sync_every=SYNC_EVERY, runs_root=str(tmp_path_factory.mktemp(sync)),
                          run_name=f"semi-{sync}"))
    seen: dict = {}
    try:
        run.start()
        run.wait_for_step(SYNC_EVERY + 3, timeout=180)  # inside the second inner loop
        seen["since"] = time.time()
        drive(run, seen)
        seen["identical"] = all_agree(run, 3)
    finally:
        run.stop()
    return run, seen


def _kill_between_meetings(run: FTRun, seen: dict) -> None:
    run.inject("kill", replica=1)
    seen["rejoined"] = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=180,
                                    since=seen["since"])


def _comms_between_and_at_a_meeting(run: FTRun, seen: dict) -> None:
    """A comms fault inside an inner loop, then one aimed at a meeting (inside the step whose
    optimizer step holds the outer allreduce of pseudo-gradients)."""
    seen["status"] = run.status()
    run.inject("comms", replica=1)
    seen["between"] = run.wait_for(lambda e: isinstance(e, Repaired) and e.replica == 1, timeout=60,
                                   since=seen["since"])
    meeting = (seen["between"].step // SYNC_EVERY + 2) * SYNC_EVERY
    seen["at_meeting"] = time.time()
    run.inject("comms", replica=1, at_step=meeting)
    seen["meeting"] = meeting
    seen["repaired"] = run.wait_for(lambda e: isinstance(e, Repaired) and e.replica == 1, timeout=120,
                                    since=seen["at_meeting"])
    run.wait_for_step(meeting + SYNC_EVERY, timeout=120)  # a meeting after it, by every group


@pytest.fixture(scope="module")
def local_sgd(tmp_path_factory):
    return _run("local_sgd", tmp_path_factory, _kill_between_meetings)


@pytest.fixture(scope="module")
def diloco(tmp_path_factory):
    return _run("diloco", tmp_path_factory, _comms_between_and_at_a_meeting)


def _agree_at_a_meeting_and_learn(run: FTRun, seen: dict) -> None:
    same: ReplicasIdentical = seen["identical"]
    assert same.step % SYNC_EVERY == 0 and same.identical and len(same.hashes) == 3, same
    summary = run.history().summary()
    assert summary["loss_end"] < summary["loss_start"] - 1.0, summary


def test_local_sgd_a_group_killed_between_meetings_heals_at_the_next_and_all_agree_there(local_sgd):
    run, seen = local_sgd
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
    _agree_at_a_meeting_and_learn(run, seen)


def test_diloco_a_comms_fault_is_fixed_on_the_communicator_between_meetings_and_at_one(diloco):
    """The ladder's lowest rung under DiLoCo: torchft's optimizer hooks keep the Manager, the next
    meeting's quorum rebuilds every member's process group. No process is replaced, nobody heals.
    A fault at a meeting fails that meeting in every group alike (DiLoCo goes back to the
    parameters they last agreed on; never applied in some groups and not others), and the
    groups meet again after it."""
    run, seen = diloco
    since = seen["since"]
    inner = {r: st.get("inner") for r, st in seen["status"].items()}
    assert all(v is not None and v.endswith(f"/{SYNC_EVERY}") for v in inner.values()), inner  # status says where
    failed = {e.replica for e in run.events.events(FailureDetected) if e.t >= since}
    assert failed == {1}, failed  # no healthy group failed for the victim's fault
    assert [e.rung for e in run.events.events(RungStarted) if e.t >= since] == ["communicator", "communicator"]
    assert not [e for e in run.events.events(Respawned) if e.t >= since]
    assert not [e for e in run.events.events(Healed) if e.t >= since]
    between: Repaired = seen["between"]
    assert between.kept_member and between.at_once, between
    detected = next(e for e in run.events.events(FailureDetected) if e.t >= seen["at_meeting"])
    assert seen["repaired"].t - detected.t < 2.0, (detected, seen["repaired"])  # in place: no process started
    meeting = seen["meeting"]
    first = {}
    for e in run.events.events(Step):
        if e.t >= seen["at_meeting"] and e.step == meeting and e.synced is not None:
            first.setdefault(e.replica, e.synced)
    assert sorted(first) == [0, 1, 2] and len(set(first.values())) == 1, first  # the same verdict everywhere
    met_after = {e.replica for e in run.events.events(Step) if e.t >= seen["repaired"].t and e.synced}
    assert met_after == {0, 1, 2}, met_after
    _agree_at_a_meeting_and_learn(run, seen)


def test_diloco_and_local_sgd_mark_their_meetings_in_the_step_records(local_sgd, diloco):
    for run, _ in (local_sgd, diloco):
        meetings = [e for e in run.events.events(Step) if e.replica == 0 and e.synced is not None]
        assert meetings and all(e.step % SYNC_EVERY == 0 for e in meetings if e.synced), meetings[:3]
        between = [e for e in run.events.events(Step) if e.replica == 0 and e.synced is None and e.committed]
        assert between and all(e.step % SYNC_EVERY for e in between)
