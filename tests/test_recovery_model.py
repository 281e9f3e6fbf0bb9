"""The one recovery model: which events make one recovery, its phases, and the figures the
history adds. Event sequences are synthetic on purpose: they specify the rules, and the
dashboard, the run history and the benchmark all read recoveries through this model."""

from __future__ import annotations

import pytest

from monarch_nb.ft import RecoveryTracker, open_run
from monarch_nb.ft.history import RunHistory
from monarch_nb.notebook.dashboard_model import DashboardModel
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.events import (
    Acquired,
    FailureDetected,
    FaultInjected,
    GaveUp,
    Healed,
    Rejoined,
    ReplicasIdentical,
    Respawned,
    RunStarted,
    Step,
    TornDown,
    WorkerFailed,
)

T = 1000.0


def steps(replicas, t0, t1, dt=1.0, start_step=1):
    """Committed steps of ``replicas`` every ``dt`` seconds in [t0, t1)."""
    out, t, s = [], t0, start_step
    while t < t1:
        out += [Step(t=t, replica=r, step=s, loss=3.0, tokens_per_s=1.0, committed=True) for r in replicas]
        t += dt
        s += 1
    return out


def recovery(replica, at, fault="kill", detect=0.5, teardown=0.1, acquire=0.4, build=2.0, heal=0.2, rejoin=0.3):
    """A complete recovery of ``replica`` whose fault fires at ``at``."""
    t = at + detect
    evs = [FaultInjected(t=at - 0.2, fault=fault, replica=replica, rank=0, step=None),
           FailureDetected(t=t, replica=replica, rank=0, reason=fault, detection_s=detect)]
    t += teardown
    evs.append(TornDown(t=t, replica=replica, seconds=teardown))
    t += acquire
    evs.append(Acquired(t=t, replica=replica, how="spawn", seconds=acquire))
    t += build
    evs.append(Respawned(t=t, replica=replica, attempt=1, seconds=acquire + build))
    t += heal
    evs.append(Healed(t=t, replica=replica, step=50, bytes=1000, seconds=heal, source_replica=0))
    t += rejoin
    evs.append(Rejoined(t=t, replica=replica, step=51, seconds_since_failure=t - at))
    return evs


def tracked(events):
    tracker = RecoveryTracker()
    tracker.apply_all(sorted(events, key=lambda e: e.t))
    return tracker.recoveries


def history_of(events) -> RunHistory:
    store = EventStore()
    for e in sorted(events, key=lambda e: e.t):
        store.append(e)
    return RunHistory(store)


def test_phases_run_back_to_back_and_add_up_to_fault_to_first_committed_step():
    (rec,) = tracked(recovery(1, at=T + 10))
    assert rec.status == "recovered" and rec.fault == "kill"
    assert rec.durations() == pytest.approx({"detect": 0.5, "teardown": 0.1, "acquire": 0.4, "build": 2.0,
                                             "heal": 0.2, "rejoin": 0.3})
    assert sum(rec.durations().values()) == pytest.approx(rec.total_s) == pytest.approx(3.5)
    assert rec.start_t == pytest.approx(T + 10)  # the fault fired, not when it was injected


def test_a_duplicate_failure_report_is_one_recovery_for_the_history_and_the_dashboard():
    evs = recovery(1, at=T + 10)
    evs.insert(2, FailureDetected(t=T + 10.6, replica=1, rank=0, reason="reported again"))
    assert len(tracked(evs)) == 1
    assert len(history_of(evs).recoveries()) == 1
    dashboard = DashboardModel()
    dashboard.apply_all(sorted(evs, key=lambda e: e.t))
    assert len(dashboard.recoveries) == 1 and dashboard.recoveries[0].reason == "kill"


def test_two_injections_before_one_detection_are_blamed_on_the_first_fault():
    evs = recovery(1, at=T + 10, fault="kill")
    evs.insert(1, FaultInjected(t=T + 10.1, fault="exception", replica=1, rank=0))
    (rec,) = tracked(evs)
    assert rec.fault == "kill" and rec.injections == 2
    (from_history,) = history_of(evs).recoveries()
    dashboard = DashboardModel()
    dashboard.apply_all(sorted(evs, key=lambda e: e.t))
    assert from_history.fault == dashboard.recoveries[0].fault == "kill"


def test_a_failure_before_the_rejoin_ends_the_recovery_and_starts_another():
    first = recovery(1, at=T + 10)
    cut = [e for e in first if not isinstance(e, (Healed, Rejoined))]
    again = [FailureDetected(t=T + 14, replica=1, rank=0, reason="crashed while healing")]
    recs = tracked(cut + again)
    assert [r.status for r in recs] == ["failed again", "respawning"]
    assert recs[1].fault is None and recs[1].reason == "crashed while healing"


def test_a_fault_aimed_at_a_later_step_does_not_take_the_rejoin_of_the_recovery_before_it():
    # Seen in the soak: the group healed and committed step 51, a segfault aimed at step 53 was
    # injected, and only then did the controller record the rejoin at step 51.
    first = [e for e in recovery(1, at=T + 10) if not isinstance(e, Rejoined)]
    late = [FaultInjected(t=T + 13.4, fault="segfault", replica=1, rank=0, step=53),
            FailureDetected(t=T + 13.45, replica=1, rank=0, reason="Killed(sig=11)", detection_s=0.05),
            Rejoined(t=T + 13.5, replica=1, step=51, seconds_since_failure=3.5)]
    recs = tracked(first + late)
    assert [r.status for r in recs] == ["recovered", "respawning"]
    assert recs[0].rejoined_step == 51 and recs[1].fault == "segfault" and recs[1].reason == "Killed(sig=11)"
    # a rejoin at or past the new fault's step is the new recovery's (it cannot be the old one's)
    recs = tracked(first + [FaultInjected(t=T + 13.4, fault="kill", replica=1, rank=0, step=51)] + recovery(1, at=T + 20)[1:])
    assert [r.status for r in recs] == ["failed again", "recovered"]


def test_a_respawn_that_fails_stays_in_the_same_recovery_until_the_policy_gives_up():
    evs = recovery(2, at=T + 10)[:3] + [
        FailureDetected(t=T + 12, replica=2, rank=None, reason="respawn failed: boom"),
        GaveUp(t=T + 13, replica=2, attempts=1)]
    (rec,) = tracked(evs)
    assert rec.status == "gave up" and rec.reason == "kill"


def test_identity_is_the_first_check_at_or_after_the_rejoin():
    evs = recovery(1, at=T + 10) + [ReplicasIdentical(t=T + 13, step=40, identical=False, hashes={}),
                                    ReplicasIdentical(t=T + 20, step=55, identical=True, hashes={})]
    (rec,) = tracked(evs)
    assert rec.identical is True


def test_an_older_log_without_teardown_or_acquire_events_still_adds_up():
    evs = [e for e in recovery(1, at=T + 10) if not isinstance(e, (TornDown, Acquired))]
    (rec,) = tracked(evs)
    d = rec.durations()
    assert d["teardown"] is None and d["acquire"] is None and d["build"] == pytest.approx(2.5)
    assert sum(v for v in d.values() if v is not None) == pytest.approx(rec.total_s)


def test_survivor_stall_counts_only_groups_that_stayed_up():
    # Groups 1 and 2 are down at overlapping times; group 0 alone stayed up. It stalled 1.7 s
    # after the first failure and not at all after the second; the other victim, which had no
    # commit for 10 s, must not count as a survivor of either.
    down = {1: (T + 10, T + 20), 2: (T + 12, T + 22)}
    evs = [RunStarted(t=T, run_id="r", config={"replicas": 3})]
    evs += steps([0, 1, 2], T + 1, T + 10, dt=0.5)
    evs += steps([0], T + 11.2, T + 30, dt=0.5, start_step=100)  # one 1.2 s gap, then steady
    evs += steps([1], T + 20, T + 30, dt=0.5, start_step=200)
    evs += steps([2], T + 22, T + 30, dt=0.5, start_step=300)
    for replica, (at, back) in down.items():
        evs += [FaultInjected(t=at, fault="kill", replica=replica, rank=0),
                FailureDetected(t=at + 0.1, replica=replica, rank=0, reason="kill", detection_s=0.1),
                Respawned(t=back - 1, replica=replica, attempt=1, seconds=3.0),
                Rejoined(t=back, replica=replica, step=0, seconds_since_failure=back - at)]
    recs = {r.replica: r for r in history_of(evs).recoveries()}
    assert recs[1].survivor_stall_s == pytest.approx(1.7) and recs[1].survivor_stall_steps == pytest.approx(3.4)
    assert recs[2].survivor_stall_s == pytest.approx(0.5) and recs[2].survivor_stall_steps == pytest.approx(1.0)


def test_monarchs_late_report_explains_a_pid_check_that_only_knew_the_process_was_gone():
    def detected(reason):
        return [FaultInjected(t=T, fault="segfault", replica=1, rank=0, step=None),
                FailureDetected(t=T + 0.1, replica=1, rank=0, reason=reason, detection_s=0.1, source="pid")]

    late = WorkerFailed(t=T + 0.5, mesh="replica1", rank=0, reason="the process ... failed: Killed(sig=11)", late=True)
    (rec,) = tracked(detected("process 7 of rank 0 is gone (found by pid check)") + [late])
    assert (rec.reason, rec.detected_by) == (late.reason, "pid, explained by supervision")
    # the pid check said how it ended: a later report that says less (or nothing) does not replace it
    knew = "process 7 of rank 0 killed by signal 11 (SIGSEGV) (found by pid check)"
    no_status = WorkerFailed(t=T + 0.5, mesh="replica1", rank=0, late=True,
                             reason="the process this actor was running on failed: Failed(wait failed: No child processes)")
    (rec,) = tracked(detected(knew) + [no_status])
    assert (rec.reason, rec.detected_by) == (knew, "pid")
    timeout = WorkerFailed(t=T + 30, mesh="replica1", rank=0, late=True,
                           reason="timeout waiting for message from proc mesh agent. The process likely crashed")
    (rec,) = tracked(detected("process 7 of rank 0 is gone (found by pid check)") + [timeout])
    assert rec.detected_by == "pid", "a timeout is no account of how the process ended"


def test_open_run_gives_the_same_recoveries_as_the_live_store(tmp_path):
    store = EventStore(tmp_path / "events.jsonl")
    for e in sorted([RunStarted(t=T, run_id="r", config={})] + steps([0, 1], T + 1, T + 9)
                    + recovery(1, at=T + 10) + steps([0], T + 10, T + 15, start_step=10), key=lambda e: e.t):
        store.append(e)
    live = RunHistory(store).recoveries()
    store.close()
    assert open_run(tmp_path).recoveries() == live and live[0].survivor_commits_while_down == 4
