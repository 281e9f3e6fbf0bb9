"""Fault-tolerant training end to end, up the recovery ladder: real processes, a real torchft
Lighthouse, real torchtitan steps on the tiny Llama 3. One shared run (R=3) receives a ``kill``
(rung ``process``: the group is replaced and heals from a peer), an ``exception`` (rung ``step``)
and a ``comms`` fault (rung ``communicator``: both repaired in their own processes), and a
``comms`` fault whose process cannot rebuild its communicator (``stuck``: escalated to
``process`` within ``repair_timeout_s``); each test states one property per fault. Then the
striped, verified heal: a byte one donor flips in transit (the ``corrupt`` fault) is caught by
the digest check and refetched from the other donor."""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig, open_run
from monarch_nb.telemetry.events import (
    FailureDetected,
    FaultInjected,
    HealCorrupt,
    Healed,
    Quorum,
    Rejoined,
    Repaired,
    ReplicasIdentical,
    Respawned,
    RungEscalated,
    RungStarted,
    Step,
    TornDown,
)
from helpers.notice_checks import assert_one_notice, watch_notices
from helpers.proc_checks import assert_gone

pytestmark = pytest.mark.slow

# (fault kind, victim replica, what the failure reason must mention: Monarch's report, or our
# pid check's reading of the exit status, whichever noticed first)
FAULTS = [("kill", 1, ("sig=9", "signal 9")), ("exception", 2, ("exception",)), ("comms", 0, ("comms",)),
          ("stuck", 1, ("comms",))]
KINDS = [k for k, _, _ in FAULTS]
# Who must notice each kind: a dead process is found by our pid check or Monarch supervision;
# an exception or broken comms the trainer survives and reports through its status.
DETECTORS = {"kill": {"pid", "supervision"}, "exception": {"trainer"}, "comms": {"trainer"}, "stuck": {"trainer"}}
# The ladder's rungs each fault goes through, lowest first (the last one brings the group back).
RUNGS = {"kill": ["process"], "exception": ["step"], "comms": ["communicator"], "stuck": ["communicator", "process"]}
REPLACED = {k for k, rungs in RUNGS.items() if "process" in rungs}
REPAIR_TIMEOUT_S = 6.0  # the stuck fault's repair hangs longer than this (hang_s): it must escalate


class Outcome:
    def __init__(self, kind: str, victim: int, since: float) -> None:
        self.kind, self.victim, self.since = kind, victim, since
        self.rejoined: Rejoined | None = None
        self.until = 0.0  # when the rejoin was recorded (a rebuild at once rejoins before the controller's events)
        self.identical: ReplicasIdentical | None = None
        self.error: str | None = None
        self.pids: list[int] = []  # the victim's processes before the fault and after its recovery
        self.pids_after: list[int] = []


@pytest.fixture(scope="module")
def ft(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft_runs")
    run = FTRun(RunConfig(replicas=3, runs_root=str(root), run_name="recovery", repair_timeout_s=REPAIR_TIMEOUT_S))
    outcomes: dict[str, Outcome] = {}
    baseline = None
    run.notices = []  # what a notebook would show, counted per fault (notice_checks)
    try:
        run.start()
        run.notices = watch_notices(run)
        run.wait_for_step(5, timeout=180)
        baseline = run.check_identical(timeout=120)
        for kind, victim, _ in FAULTS:
            out = outcomes[kind] = Outcome(kind, victim, time.time())
            out.pids = list(run.groups[victim].pids)
            try:
                if kind == "stuck":
                    run.inject("comms", replica=victim, stuck=True, hang_s=60.0)
                else:
                    run.inject(kind, replica=victim)
                out.rejoined = run.wait_for(
                    lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v, timeout=180, since=out.since)
                out.until = time.time()
                out.identical = run.wait_for(
                    lambda e, t=out.rejoined.t: isinstance(e, ReplicasIdentical) and e.t >= t, timeout=120)
                out.pids_after = list(run.groups[victim].pids)
            except TimeoutError as e:
                out.error = f"{kind}: {e}"
        # replica 0 flips a byte of the next heal it serves; replica 2 is killed and heals from 0 and 1
        t = time.time()
        run.inject("corrupt", replica=0)
        armed = run.wait_for(lambda e: isinstance(e, FaultInjected) and e.fault == "corrupt", timeout=30, since=t)
        run.wait_for_step(armed.step + 1, replicas=[0], timeout=120)  # it fired: the next heal it serves is bad
        run.inject("kill", replica=2)
        healed = run.wait_for(lambda e: isinstance(e, Healed) and e.replica == 2 and e.cause == "recovery",
                              timeout=180, since=t)
        rejoined = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 2, timeout=120, since=t)
        same = run.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.t >= rejoined.t, timeout=120)
        outcomes["corrupt"] = (healed, same, [e for e in run.events.events(HealCorrupt) if e.t >= t])
    finally:
        run.notices_before_stop = len(run.notices)
        run.stop()
    return run, baseline, outcomes


def test_a_heal_fetches_from_every_surviving_group(ft):
    run = ft[0]
    out = _outcome(ft, "kill")  # replica 1, while 0 and 2 train
    (healed,) = _between(run, Healed, out.since, out.until, replica=out.victim)
    assert healed.donors == [0, 2], healed
    assert healed.bytes > 0 and healed.gbps and healed.gbps > 0 and healed.corrupt == 0


def test_a_byte_flipped_in_transit_is_refetched_from_the_other_donor(ft):
    healed, same, bad = ft[2]["corrupt"]
    assert len(bad) >= 1 and healed.corrupt == len(bad)
    assert {(e.replica, e.donor, e.refetched_from) for e in bad} == {(2, 0, 1)}
    assert all(e.tensor.startswith("user/") for e in bad)
    assert same.identical  # no heal is accepted with a mismatch: the healed group equals its peers


def _outcome(ft, kind) -> Outcome:
    out = ft[2][kind]
    assert out.error is None, out.error
    return out


def _between(run, cls, t0, t1, **match):
    return [e for e in run.events.events(cls) if t0 <= e.t <= t1
            and all(getattr(e, k) == v for k, v in match.items())]


def test_replicas_start_identical(ft):
    _, baseline, _ = ft
    assert baseline is not None and baseline.identical and len(baseline.hashes) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_failure_is_detected_with_its_reason(ft, kind):
    run, _, _ = ft
    out = _outcome(ft, kind)
    expected = dict((k, r) for k, _, r in FAULTS)[kind]
    (failure, *_) = _between(run, FailureDetected, out.since, out.until, replica=out.victim)
    assert failure.source in DETECTORS[kind], (failure.source, failure.reason)
    # measured from the fault log's firing time: detected after the fault fired; the bound is
    # sanity only (typically < 1 s: every detector polls at 0.25 s)
    assert failure.detection_s is not None and 0 <= failure.detection_s < 15, \
        f"detection_s={failure.detection_s}: fault fired -> {failure.source} noticed it"
    rec = _recovery(run, out)
    assert any(word in rec.reason.lower() for word in expected), (rec.reason, rec.detected_by)


def _recovery(run, out):
    return next(r for r in run.history().recoveries() if r.replica == out.victim and r.start_t is not None
                and out.since <= r.start_t <= out.until)


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_enters_the_ladder_at_its_rung_and_escalates_only_when_its_rung_fails(ft, kind):
    run, _, _ = ft
    out = _outcome(ft, kind)
    started = [e.rung for e in _between(run, RungStarted, out.since, out.until, replica=out.victim)]
    assert started == RUNGS[kind], started
    escalated = _between(run, RungEscalated, out.since, out.until, replica=out.victim)
    assert [(e.rung, e.to) for e in escalated] == list(zip(RUNGS[kind], RUNGS[kind][1:]))
    if kind == "stuck":  # the repair hung: escalated once its bound passed, not before
        (e,) = escalated
        assert "did not answer within" in e.reason and REPAIR_TIMEOUT_S <= e.seconds < REPAIR_TIMEOUT_S + 5, e
    rec = _recovery(run, out)
    assert rec.rungs == RUNGS[kind] and rec.rung == RUNGS[kind][-1] and rec.status == "recovered", rec
    assert rec.total_s == pytest.approx(sum(d for d in rec.durations().values() if d is not None))
    assert ("repair" in rec.durations()) == (RUNGS[kind][0] != "process")
    assert ("build" in rec.durations()) == (kind in REPLACED)


@pytest.mark.parametrize("kind", sorted(set(KINDS) - REPLACED))
def test_a_live_process_is_repaired_in_place_keeping_its_processes_and_state(ft, kind):
    run, _, _ = ft
    out = _outcome(ft, kind)
    (repaired,) = _between(run, Repaired, out.since, out.until, replica=out.victim)
    assert repaired.cause == {"exception": "exception", "comms": "comms"}[kind]
    assert not _between(run, Respawned, out.since, out.until, replica=out.victim)
    assert not _between(run, TornDown, out.since, out.until, replica=out.victim)
    assert out.pids and out.pids_after == out.pids, (out.pids, out.pids_after)
    # back within seconds: no process was built (a respawn takes 5-15 s here)
    assert out.rejoined.seconds_since_failure < 5.0, out.rejoined


@pytest.mark.parametrize("kind", KINDS)
def test_survivors_commit_while_victim_is_down(ft, kind):
    run, _, _ = ft
    out = _outcome(ft, kind)
    (failure, *_) = _between(run, FailureDetected, out.since, out.until, replica=out.victim)
    back = _between(run, Respawned if kind in REPLACED else Repaired, out.since, out.until, replica=out.victim)
    until = back[-1].t
    for survivor in {0, 1, 2} - {out.victim}:
        # Between detection and the victim being back, it cannot take part: these commits are
        # the survivors training on their own (a quorum of two).
        commits = [e for e in _between(run, Step, failure.t, until, replica=survivor) if e.committed]
        if kind in REPLACED:
            assert commits, f"replica {survivor} committed nothing while replica {out.victim} was down"
        assert all(e.participants == 2 for e in commits)


@pytest.mark.parametrize("kind", sorted(REPLACED))
def test_victim_respawns_and_heals_from_a_peer_not_from_disk(ft, kind):
    run, _, _ = ft
    out = _outcome(ft, kind)
    (respawned,) = _between(run, Respawned, out.since, out.until, replica=out.victim)
    (healed,) = _between(run, Healed, out.since, out.until, replica=out.victim)
    assert healed.bytes > 1_000_000  # parameters + Adam state of the 6M-parameter model
    assert healed.source_replica in {0, 1, 2} - {out.victim}
    assert out.rejoined.step > healed.step - 1
    # No checkpoint anywhere: the run directory holds only the event logs and the workers' log files.
    assert {p.name for p in run.run_dir.iterdir()} <= {"events.jsonl", "faults.jsonl", "logs"}
    assert all(p.suffix == ".log" for p in (run.run_dir / "logs").iterdir())


@pytest.mark.parametrize("kind", KINDS)
def test_healed_replica_is_bit_identical(ft, kind):
    out = _outcome(ft, kind)
    assert out.identical.identical, out.identical.hashes
    assert len(out.identical.hashes) == 3 and out.identical.step >= out.rejoined.step


def test_survivors_never_restart(ft):
    run, _, outcomes = ft
    respawned = sorted(e.replica for e in run.events.events(Respawned))
    faults = [o for o in outcomes.values() if isinstance(o, Outcome)]
    assert respawned == sorted([o.victim for o in faults if o.kind in REPLACED] + [2])  # + the corrupt cell's kill


def test_the_run_finds_no_dns_wait_in_its_quorum_changes(ft):
    """The run checks at its start that a store connect is named without DNS (name_lookup.py)."""
    run, _, _ = ft
    (started,) = run.events.events("lighthouse_started")
    assert started.name_lookup is None, started.name_lookup


def test_loss_goes_down(ft):
    run, _, _ = ft
    summary = run.history().summary()
    assert summary["loss_end"] < summary["loss_start"] - 1.0, summary


def test_no_orphan_processes_after_stop(ft):
    run, _, _ = ft
    assert run.spawned_pids and run.lighthouse_pid
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=15)


def test_event_log_is_complete_and_reopenable(ft):
    run, _, outcomes = ft
    reopened = open_run(run.run_dir)
    live = [e.to_dict() for e in run.events]
    assert [e.to_dict() for e in reopened.events] == live
    kinds = {e["kind"] for e in live}
    assert kinds >= {"run_started", "step", "quorum", "fault_injected", "failure_detected", "respawned", "healed",
                     "rejoined", "replicas_identical", "replica_state", "run_stopped", "rung_started",
                     "rung_escalated", "repaired"}
    recs = reopened.recoveries()
    faults = [o for o in outcomes.values() if isinstance(o, Outcome)]
    assert sorted(r.fault for r in recs) == sorted([o.kind if o.kind != "stuck" else "comms" for o in faults] + ["kill"])
    assert all(r.rejoined_step and r.identical for r in recs)
    assert all(r.heal_bytes for r in recs if r.rung == "process")


@pytest.mark.parametrize("kind, victim, words", FAULTS, ids=KINDS)
def test_each_fault_is_one_notice_naming_the_fault_then_the_action(ft, kind, victim, words):
    run, _, _ = ft
    out = _outcome(ft, kind)
    assert_one_notice(run, run.notices, victim, out.since, out.until, words)


def test_a_stop_is_not_reported_as_a_failure(ft):
    run = ft[0]
    assert len(run.notices) == run.notices_before_stop, [n.reason for n in run.notices[run.notices_before_stop:]]


def test_a_comms_victim_stays_in_the_quorum_and_needs_no_heal(ft):
    """Rung communicator through torchft's own error path: the victim rebuilds its communicator
    at once (before the controller's poll), keeping its Manager (and replica id); the failed
    step's commit failure gives the next quorum a new id, and every quorum from the fault to its
    return has all three groups: nobody reconfigured without it, and it never fell behind, so
    nothing was healed. The controller still recorded the rung (test above) and collected it."""
    run = ft[0]
    out = _outcome(ft, "comms")
    (repaired,) = _between(run, Repaired, out.since, out.until, replica=out.victim)
    assert repaired.kept_member is True and repaired.at_once is True, repaired
    quorums = [e for e in run.events.events(Quorum) if out.since <= e.t <= out.rejoined.t]
    assert quorums and all(sorted(q.participants) == [0, 1, 2] for q in quorums), \
        [(q.replica, q.quorum_id, q.participants) for q in quorums]
    assert not _between(run, Healed, out.since, out.until, replica=out.victim)
