"""Fast recovery on real processes: a warm spare takes a failed group's place (no process is
started on the critical path), the pool refills itself, the run is resized up and down while it
trains, and waves of faults swing the number of live groups without restarting a survivor."""

from __future__ import annotations

import threading
import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import (
    Acquired,
    FailureDetected,
    Rejoined,
    ReplicasIdentical,
    ReplicaState,
    Respawned,
    SpareState,
)
from helpers.proc_checks import assert_gone

pytestmark = pytest.mark.slow


def _spare_ready(run, since=0.0):
    """The first spare that became ready at or after ``since`` (and is ready still)."""
    return run.wait_for(lambda e: isinstance(e, SpareState) and e.state == "ready"
                        and run.supervisor.spares.ready() > 0, timeout=240, since=since)


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    run = FTRun(RunConfig(replicas=3, spares=1, runs_root=str(tmp_path_factory.mktemp("elastic"))))
    facts: dict = {}
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        _spare_ready(run)
        spare_pids = run.status()["spare0"]["pids"]
        spawned_before = list(run.spawned_pids)
        since = time.time()
        run.inject("kill", replica=1)
        rejoined = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=120, since=since)
        facts["spare"] = dict(since=since, rejoined=rejoined, spare_pids=spare_pids,
                              group_pids=run.status()[1]["pids"], spawned_before=spawned_before,
                              spawned_at_rejoin=list(run.spawned_pids),
                              identical=run.wait_for(lambda e: isinstance(e, ReplicasIdentical) and
                                                     e.t >= rejoined.t, timeout=120))
        facts["refilled"] = _spare_ready(run, since=since)
        facts["refill_pids"] = run.status()[f"spare{facts['refilled'].spare}"]["pids"]

        # bad input, on a live run: nothing may change
        for bad in (0, 1000, "4"):
            with pytest.raises(ValueError, match="^replicas: "):
                run.scale(bad)
        facts["groups_before_scale"] = sorted(str(k) for k in run.status())

        # scale up by one while a second scale is refused, then down by one
        t_up = time.time()
        errors = []
        up = threading.Thread(target=lambda: facts.setdefault("up", run.scale(4)))
        up.start()
        deadline = time.monotonic() + 10
        while up.is_alive() and time.monotonic() < deadline and not errors:
            try:
                run.scale(2)
            except RuntimeError as exc:
                errors.append(str(exc))
            time.sleep(0.01)
        up.join()
        facts["concurrent"] = errors
        run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 3, timeout=120, since=t_up)
        facts["after_up"] = run.check_identical(timeout=120)
        facts["down"] = run.scale(3)
        facts["after_down"] = run.check_identical(timeout=120)
    finally:
        run.stop()
    with pytest.raises(RuntimeError, match="not running"):
        run.scale(3)
    return run, facts


def test_a_ready_spare_takes_the_failed_groups_place_without_starting_a_process(elastic):
    run, facts = elastic
    f = facts["spare"]
    (acquired,) = [e for e in run.events.events(Acquired) if f["since"] <= e.t <= f["rejoined"].t]
    assert acquired.how == "spare" and acquired.replica == 1
    assert f["group_pids"] == f["spare_pids"], "the group must run in the spare's processes"
    # the only processes started between the fault and the rejoin are the refill spare's,
    # built in the background (it may still have been coming up at the rejoin)
    new = set(f["spawned_at_rejoin"]) - set(f["spawned_before"])
    assert new <= set(facts["refill_pids"]), ("no process may be started on the critical path", new)
    assert not new & set(f["group_pids"]), "no process may be started for the victim on the critical path"
    recovery = next(r for r in run.history().recoveries() if r.fault == "kill")
    assert recovery.acquired_how == "spare" and recovery.heal_source in (0, 2)
    assert recovery.status == "recovered" and recovery.acquired_t <= recovery.respawned_t <= recovery.rejoined_t
    # the spare was taken by replica 1 in this recovery, and only one spare was
    taken = [e for e in run.events.events(SpareState) if e.state == "taken" and f["since"] <= e.t <= f["rejoined"].t]
    assert [(e.spare, e.detail) for e in taken] == [(0, "by replica1")], taken
    assert f["identical"].identical, f["identical"].hashes


def test_the_spare_pool_is_refilled_in_the_background(elastic):
    run, facts = elastic
    f = facts["spare"]
    assert facts["refilled"].spare != 0  # a new spare, not the one that was taken
    # its building started while the victim was still out (when the spare was taken), not after
    (building,) = [e for e in run.events.events(SpareState)
                   if e.spare == facts["refilled"].spare and e.state == "building"]
    assert f["since"] <= building.t <= f["rejoined"].t, (f["since"], building.t, f["rejoined"].t)
    assert set(facts["refill_pids"]).isdisjoint(f["spare_pids"]), "fresh processes for the new spare"


def test_scale_up_and_down_mid_run_keeps_replicas_identical(elastic):
    run, facts = elastic
    up, down = facts["up"], facts["down"]
    assert up.added == [3] and up.retired == [] and down.retired == [3] and down.added == []
    assert facts["after_up"].identical and len(facts["after_up"].hashes) == 4
    assert facts["after_down"].identical and len(facts["after_down"].hashes) == 3
    states = [e.state for e in run.events.events(ReplicaState) if e.replica == 3]
    assert "retired" in states and "failed" not in states
    assert not [e for e in run.events.events(FailureDetected) if e.replica == 3], "retiring is not failing"


def test_bad_scale_requests_change_nothing(elastic):
    run, facts = elastic
    assert facts["groups_before_scale"] == ["0", "1", "2", "spare1"]
    assert facts["concurrent"] and "in progress" in facts["concurrent"][0]


def test_no_process_is_left_behind(elastic):
    run, _ = elastic
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=20)


def test_waves_of_faults_swing_the_live_groups_and_never_restart_a_survivor(tmp_path):
    run = FTRun(RunConfig(replicas=4, runs_root=str(tmp_path)))
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        t0 = time.time()
        # kills: a comms fault is now repaired in place in ~0.3 s, too fast for two to be out together
        run.schedule(every=0.5, kinds=["kill"], at_once=2, max_faults=2, seed=1)
        victims = {e.replica for e in [run.wait_for(lambda e: e.kind == "fault_injected", timeout=60, since=t0)]}
        deadline = time.monotonic() + 30
        while len(victims) < 2 and time.monotonic() < deadline:
            victims = {e.replica for e in run.events.events("fault_injected") if e.t >= t0}
            time.sleep(0.05)
        back = [run.wait_for(lambda e, v=v: isinstance(e, Rejoined) and e.replica == v, timeout=180, since=t0)
                for v in victims]
        check = run.check_identical(timeout=120)
        t_back = time.time()  # both victims back and checked; before the stop
    finally:
        run.stop()
    assert len(victims) == 2 and check.identical and len(back) == 2
    before = [n for t, n in run.history().live_groups() if t < t0]
    during = [n for t, n in run.history().live_groups() if t0 <= t <= t_back]
    assert before[-1] == 4 and min(during) == 2 and during[-1] == 4, (before, during)
    # only the victims' processes are replaced: no survivor restarts
    assert {e.replica for e in run.events.events(Respawned)} == victims, "only the victims restart"
    spent = run.history().time_at_group_counts()
    assert spent.get(2, 0) > 0 and spent.get(4, 0) > 0, spent
