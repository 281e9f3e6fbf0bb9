"""The one recovery model: which events make one recovery, its phases, and the figures the
history adds. Event sequences are synthetic on purpose: they specify the rules, and the
dashboard, the run history and the benchmark all read recoveries through this model."""

from __future__ import annotations

import pytest

from monarch_nb.ft import RecoveryTracker, open_run
from monarch_nb.ft.record.history import RunHistory
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
    WorkerExitReported,
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
    # today's logs: Monarch's late account is a worker_exit_reported; our own worker_failed (the
    # one notice, with the pid check's words) explains nothing
    exit_report = WorkerExitReported(t=T + 0.5, mesh="replica1", rank=0, reason=late.reason)
    (rec,) = tracked(detected("process 7 of rank 0 is gone (found by pid check)") + [exit_report])
    assert (rec.reason, rec.detected_by) == (late.reason, "pid, explained by supervision")
    ours = WorkerFailed(t=T + 0.2, mesh="replica1", rank=0, reason="process 7 of rank 0 is gone (found by pid check)",
                        action="its group is torn down and replaced")
    (rec,) = tracked(detected(ours.reason) + [ours])
    assert rec.detected_by == "pid"
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


# The seed-cluster extrapolation (lab/costmodel.py): what it takes from the fit of the
# failures measured here, and what it assumes.

from dataclasses import replace  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from helpers.bench_scripts import load_bench  # noqa: E402

from lab.costmodel import OVERLAP, SEED_CLUSTERS, Cluster, Parts, compose, extrapolate, fit  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def measured_fit():
    return fit(json.loads((REPO / "bench/results/scale_model.json").read_text())["failures"])


def test_extrapolation_to_the_seed_clusters_keeps_goodput_in_range_and_peer_cheaper():
    for cluster in SEED_CLUSTERS:
        x = extrapolate(measured_fit(), cluster)
        for key in ("goodput_peer", "goodput_peer_spare", "goodput_restart"):
            assert 0.0 <= x[key] <= 1.0
        assert x["peer_spare_group_s"] < x["peer_group_s"] < x["restart_group_s"]
        assert x["goodput_restart"] < x["goodput_peer"] < x["goodput_peer_spare"]
        assert x["ratio"] == pytest.approx(x["restart_group_s"] / x["peer_group_s"])
        assert x["goodput_ratio"] == pytest.approx(x["goodput_peer"] / x["goodput_restart"])


def test_every_input_of_the_extrapolation_is_named_with_its_source():
    x = extrapolate(measured_fit(), SEED_CLUSTERS[0])
    inputs = x["assumptions"]
    assert {"step_s", "heal_GBps", "restart_s", "fault_every_s", "checkpoint_read_GBps", "save_stall_s"} <= set(inputs)
    measured = {k for k, v in inputs.items() if v["source"].startswith("measured here (fit)")}
    assert measured == {"back_fixed_s", "restart_fixed_s", "stall_fixed_s", "stall_steps_per_step"}
    assert all(v["source"].startswith(("measured here", "assumed: ")) for v in inputs.values())
    assert all(isinstance(text, str) and text for text in x["model"].values())


def test_the_fit_decides_the_outcome():
    # Fails if the extrapolation ignored the fit: each measured coefficient moves the cost it is part of.
    base = measured_fit()
    cluster = SEED_CLUSTERS[0]
    r = cluster.groups
    x = extrapolate(base, cluster)
    slower_back = extrapolate(replace(base, back_s=(base.back_s[0] + 10.0, base.back_s[1])), cluster)
    assert slower_back["peer_group_s"] == pytest.approx(x["peer_group_s"] + 10.0)
    assert slower_back["restart_group_s"] == pytest.approx(x["restart_group_s"])
    slower_restart = extrapolate(replace(base, restart_s=(base.restart_s[0] + 5.0, base.restart_s[1])), cluster)
    assert slower_restart["restart_group_s"] == pytest.approx(x["restart_group_s"] + 5.0 * r)
    a, b = base.stall_vs_step
    more_steps = extrapolate(replace(base, stall_vs_step=(a, b + 1.0)), cluster)
    assert more_steps["peer_group_s"] == pytest.approx(x["peer_group_s"] + (r - 1) * cluster.step_s)
    assert more_steps["goodput_peer"] < x["goodput_peer"]


def test_the_assumed_inputs_move_the_outcome_as_named():
    base, c = measured_fit(), SEED_CLUSTERS[0]
    x = extrapolate(base, c)
    faster_net = extrapolate(base, replace(c, heal_GBps=c.heal_GBps * 2))
    assert faster_net["peer_group_s"] == pytest.approx(x["peer_group_s"] - c.state_gb / c.heal_GBps / 2)
    assert faster_net["restart_group_s"] == x["restart_group_s"]
    rarer = extrapolate(base, replace(c, fault_every_s=c.fault_every_s * 10))
    assert rarer["goodput_peer"] > x["goodput_peer"] and rarer["goodput_restart"] > x["goodput_restart"]
    # restart's goodput pays its save stalls: save_stall_s every Young/Daly interval
    lost = x["restart_group_s"] / (c.groups * c.fault_every_s) + c.save_stall_s / c.young_daly_interval_s()
    assert x["goodput_restart"] == pytest.approx(1 - lost)


def test_scale_records_replace_the_fits_stall_only_with_a_trend_in_r():
    base, c = measured_fit(), Cluster("16", groups=16, params_b=8.0)
    x = extrapolate(base, c)

    def kill(groups, stall_steps, spare=False):
        return {"groups": groups, "kind": "kill", "spare": spare, "detect_s": 0.9, "stall_steps": stall_steps,
                "stall_s": stall_steps * 0.1, "back_s": 6.0, "heal_s": 0.3}

    one_r = [kill(4, 3.0), kill(4, 5.0)]
    assert extrapolate(base, c, one_r)["peer_group_s"] == x["peer_group_s"]  # no trend in R: the fit stays
    comms = {"groups": 8, "kind": "comms", "stall_steps": 99.0}
    at_16 = [kill(4, 2.0), kill(16, 3.0), kill(16, 5.0, spare=True), comms]
    y = extrapolate(base, c, at_16)
    assert y["assumptions"]["stall_steps"]["value"] == 4.0  # the median of the kills at R=16
    assert "stall_fixed_s" not in y["assumptions"] and "--scale" in y["assumptions"]["stall_steps"]["source"]
    assert y["derived"]["survivor_stall_s"] == pytest.approx(4.0 * c.step_s)
    assert y["peer_group_s"] == pytest.approx(x["peer_group_s"] + (c.groups - 1) * (8.0 - x["derived"]["survivor_stall_s"]))
    # an R not measured: a straight line in R through the medians (2 at R=4, 3 at R=8: 5 at R=16)
    z = extrapolate(base, c, [kill(4, 2.0), kill(8, 3.0)])
    assert z["assumptions"]["stall_steps"]["value"] == pytest.approx(5.0)
    assert "straight line in R" in z["assumptions"]["stall_steps"]["source"]



def _parts_json(restart=(4.0, 3.0), peer=(3.0, 2.5)):
    """bench_cost_parts.py's shape: store + process group grow 0.01 s per group, quorum 1 ms per 8."""
    parts = []
    for groups in (1, 2, 4, 8, 16):
        parts += [{"part": "store", "groups": groups, "wall_s": 0.01 * groups, "cpu_s": 0.001 * groups},
                  {"part": "process_group", "groups": groups, "wall_s": 0.01 * groups, "cpu_s": 0.002 * groups},
                  {"part": "quorum_steady", "groups": groups, "wall_s": 0.001 * groups / 8, "cpu_s": 0.0},
                  {"part": "dcp_read", "groups": groups, "wall_s": 0.02 * groups, "cpu_s": 0.01 * groups}]
    return {"alone": {"tiny": {"peer": {"wall_s": peer[0], "cpu_s": peer[1]},
                               "restart": {"wall_s": restart[0], "cpu_s": restart[1]}}}, "parts": parts}


def test_composed_restarts_overlap_on_a_cluster_and_share_the_cores_on_one_box():
    parts = Parts.from_json(_parts_json())
    assert parts.rendezvous(1) == 0.0
    assert parts.rendezvous(16) == pytest.approx(0.02 * 15)  # beyond what one group alone paid
    assert parts.at("store", 32) == pytest.approx(0.32)  # a line in R past the largest R measured
    cluster = compose(parts, 16)
    assert cluster["restart_wall_s"] == pytest.approx(4.0 + 0.3)  # 16 nodes rebuild at once
    assert cluster["restart_group_s"] == pytest.approx(16 * 4.3)
    box = compose(parts, 16, cores=2)
    assert box["restart_wall_s"] == pytest.approx(16 * 3.0 / 2 + 0.3)  # 16 rebuilds on 2 cores
    assert compose(parts, 1, cores=2)["restart_wall_s"] == pytest.approx(4.0)  # alone: its own wall


def test_parts_replace_the_fits_intercepts_and_add_rendezvous_and_per_step_quorum():
    base, c = measured_fit(), SEED_CLUSTERS[0]
    x = extrapolate(base, c)
    slow = extrapolate(base, c, parts=Parts.from_json(_parts_json(restart=(14.0, 3.0))))
    fast = extrapolate(base, c, parts=Parts.from_json(_parts_json(restart=(4.0, 3.0))))
    assert fast["assumptions"]["restart_fixed_s"]["value"] == 4.0
    assert "alone" in fast["assumptions"]["restart_fixed_s"]["source"]
    assert slow["restart_group_s"] == pytest.approx(fast["restart_group_s"] + 10.0 * c.groups)
    assert fast["assumptions"]["rendezvous_s"]["value"] == pytest.approx(0.02 * 15)
    assert fast["assumptions"]["quorum_per_step_s"]["value"] == pytest.approx(0.002)
    assert fast["peer_group_s"] != x["peer_group_s"]  # the victim's time out alone, not the fit's
    assert fast["assumptions"]["back_fixed_s"]["value"] == 3.0
    no_quorum = 1 - fast["peer_group_s"] / (c.groups * c.fault_every_s)
    assert fast["goodput_peer"] == pytest.approx(no_quorum - 0.002 / c.step_s)
    assert set(OVERLAP) <= set(fast["model"])


def test_soak_reread_recomputes_the_logs_figures_and_keeps_the_live_ones(tmp_path):
    soak = load_bench("soak")
    run_dir = tmp_path / "soak-run"
    store = EventStore(run_dir / "events.jsonl")
    evs = ([RunStarted(t=T, run_id="r", config={"replicas": 3})] + steps([0, 1, 2], T + 1, T + 9)
           + recovery(1, at=T + 10) + recovery(2, at=T + 20, build=5.0)
           + [ReplicasIdentical(t=T + 30, step=60, identical=True, hashes={})])
    for e in sorted(evs, key=lambda e: e.t):
        store.append(e)
    store.close()
    out = tmp_path / "soak.json"
    out.write_text(json.dumps({"faults_sent": 2, "goodput_ratio": 0.9, "recoveries": 7, "median_total_s": 99.0,
                               "shots": [{"n": 0}]}))
    assert soak.main(["--reread", str(run_dir), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["recoveries"], report["recovered"], report["gave_up"]) == (2, 2, 0)
    # totals 3.5 s and 6.5 s: the median of two is the upper one, as the live soak counts it
    assert report["median_total_s"] == pytest.approx(6.5) and report["max_total_s"] == pytest.approx(6.5)
    assert report["survived_without_intervention"] is False  # the log does not end with run_stopped
    assert report["identity"] == [[60, True]] and report["events_by_kind"]["rejoined"] == 2
    assert report["event_log_bytes"] == (run_dir / "events.jsonl").stat().st_size
    assert (report["faults_sent"], report["goodput_ratio"], report["shots"]) == (2, 0.9, [{"n": 0}])
    assert "--reread" in report["note"] and report["run_dir"] == str(run_dir)


def test_print_of_a_recovery_shows_the_total_and_the_six_phases_that_add_up_to_it():
    (rec,) = tracked(recovery(1, at=T, heal=0.6))
    text = str(rec)
    assert text.startswith("replica 1, kill (rank 0): recovered, total 3.90 s = detect 0.50 + teardown 0.10 + "
                           "acquire 0.40 + build 2.00 + heal 0.60 + rejoin 0.30"), text
    assert "heal transfer 0.60 s" in text and "acquired by spawn" in text
    (open_rec,) = tracked(recovery(1, at=T)[:3])
    assert "respawning, total not yet = detect 0.50 + teardown 0.10 + acquire ? " in str(open_rec), str(open_rec)


# ---- the recovery ladder's rungs in the model -------------------------------------------------

def repaired_in_place(replica, at, fault="comms", detect=0.3, repair=0.1, rejoin=0.6):
    """A fault the ladder fixed on its communicator rung: no teardown, no new processes."""
    from monarch_nb.telemetry.events import Repaired, RungStarted

    t = at + detect
    return [FaultInjected(t=at - 0.1, fault=fault, replica=replica, rank=0, step=None),
            FailureDetected(t=t, replica=replica, rank=0, reason="comms: aborted", detection_s=detect,
                            source="trainer"),
            RungStarted(t=t, replica=replica, rung="communicator", reason="comms: aborted"),
            Repaired(t=t + repair, replica=replica, cause="comms", seconds=repair, step=20),
            Rejoined(t=t + repair + rejoin, replica=replica, step=21, seconds_since_failure=detect + repair + rejoin)]


def test_a_recovery_repaired_in_place_has_its_own_phases_and_names_its_rung():
    (rec,) = tracked(repaired_in_place(1, at=T + 10))
    assert rec.rung == "communicator" and rec.in_place and rec.status == "recovered"
    assert list(rec.durations()) == ["detect", "repair", "heal", "rejoin"]
    d = rec.durations()
    assert (d["detect"], d["repair"], d["heal"], d["rejoin"]) == (pytest.approx(0.3), pytest.approx(0.1), None,
                                                                  pytest.approx(0.6))
    assert sum(x for x in d.values() if x) == pytest.approx(rec.total_s) == pytest.approx(1.0)
    assert rec.row()["rung"] == "communicator" and "rung communicator" in str(rec)


def test_an_escalated_recovery_has_every_phase_and_says_how_it_climbed():
    from monarch_nb.telemetry.events import RungEscalated, RungStarted

    at = T + 10
    evs = [e for e in recovery(2, at=at) if not isinstance(e, Rejoined)]
    detected = next(e for e in evs if isinstance(e, FailureDetected))
    evs += [RungStarted(t=detected.t, replica=2, rung="communicator", reason="comms"),
            RungEscalated(t=detected.t + 0.05, replica=2, rung="communicator", to="process",
                          reason="the repair did not complete within 6 s", seconds=0.05),
            RungStarted(t=detected.t + 0.05, replica=2, rung="process", reason="communicator rung: ..."),
            Rejoined(t=at + 4.0, replica=2, step=51, seconds_since_failure=4.0)]
    (rec,) = tracked(evs)
    assert rec.rungs == ["communicator", "process"] and rec.rung == "process" and not rec.in_place
    assert list(rec.durations()) == ["detect", "repair", "teardown", "acquire", "build", "heal", "rejoin"]
    assert rec.escalations == ["communicator -> process: the repair did not complete within 6 s"]
    assert sum(d for d in rec.durations().values() if d) == pytest.approx(rec.total_s)


def test_a_log_from_before_the_ladder_reads_as_before():
    (rec,) = tracked(recovery(1, at=T + 10))
    assert rec.rung is None and not rec.in_place
    assert list(rec.durations()) == ["detect", "teardown", "acquire", "build", "heal", "rejoin"]


def test_a_communicator_rebuilt_at_once_counts_from_the_fault_to_its_first_commit_not_the_controllers_view():
    """The worker whose collective failed rebuilt at once and committed before the controller's
    poll saw the stall: its phases are the rebuild and the rejoin, adding up to the total, and
    the controller's detection is said beside them."""
    from monarch_nb.telemetry.events import Repaired, RungStarted

    at = T + 10  # the fault fired; the victim committed again 0.15 s later, the controller knew at 0.4 s
    evs = [FaultInjected(t=at - 0.1, fault="comms", replica=1, rank=0, step=None),
           FailureDetected(t=at + 0.4, replica=1, rank=0, reason="comms: aborted", detection_s=0.4, source="trainer"),
           RungStarted(t=at + 0.4, replica=1, rung="communicator", reason="comms: aborted"),
           Repaired(t=at + 0.41, replica=1, cause="comms", seconds=0.01, step=20, kept_member=True, at_once=True),
           Rejoined(t=at + 0.15, replica=1, step=21, seconds_since_failure=0.15)]
    tracker = RecoveryTracker()
    tracker.apply_all(evs)  # in the order they are recorded: the rejoin, earlier, comes last
    (rec,) = tracker.recoveries
    assert rec.total_s == pytest.approx(0.15) and list(rec.durations()) == ["repair", "heal", "rejoin"]
    d = rec.durations()
    assert (d["repair"], d["heal"], d["rejoin"]) == (pytest.approx(0.01), None, pytest.approx(0.14))
    assert rec.detection_s == pytest.approx(0.4) and "0.40 s after the fault, beside the rebuild" in str(rec)
    assert "repair 0.01 + heal none + rejoin 0.14" in str(rec)  # back: no heal happened, not "?"


def test_the_ingest_reports_a_rejoin_that_came_before_the_controller_expected_it():
    from monarch_nb.ft.record.ingest import EventIngest

    def step(n, t, committed=True):
        return {0: {"events": [{"kind": "step", "step": n, "loss": 1.0, "tokens_per_s": 1.0, "committed": committed,
                                "t": t}]}}

    for maybe_back, expected in ((True, (T + 1.2, 11)), (False, (T + 2.0, 13))):
        ingest = EventIngest(group_size=1)
        for n, t in ((10, T + 0.5), (11, T + 1.2), (12, T + 1.5)):  # the fault fired at T + 1: 11 is the first after
            ingest.translate(1, step(n, t))
        ingest.expect_rejoin(1, T + 1.0, maybe_back=maybe_back)
        (rejoined,) = [e for e in ingest.translate(1, step(13, T + 2.0)) if isinstance(e, Rejoined)]
        assert (rejoined.t, rejoined.step) == expected
