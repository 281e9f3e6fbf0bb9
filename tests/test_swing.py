"""The seed's experiment's measurement (lab.swing), on synthetic event logs: no process.

The notebook (06) and bench/bench_swing.py judge real runs with the same ``measure``; here each
promise is shown to hold on a good log and to be reported broken on a log that breaks it."""

from __future__ import annotations

import math

from monarch_nb.ft.record.history import RunHistory
from lab.swing import SwingPlan, SwingResult, figure, measure
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.events import (
    FailureDetected,
    FaultInjected,
    Healed,
    Rejoined,
    ReplicasIdentical,
    ReplicaState,
    Respawned,
    RunStarted,
    RunStopped,
    Step,
)

R = 4
PLAN = SwingPlan(replicas=R, every_s=10.0, at_once=2, steps=30)


def loss(step: int, replica: int) -> float:
    return 0.5 * math.exp(-step / 20) + 1.0 + 0.01 * replica


def history(*, faults: bool, survivor_fails: bool = False, diverge: float = 0.0, differ: bool = False,
            victim_back: bool = True) -> RunHistory:
    """Four groups, 40 steps a second apart; with ``faults`` groups 1 and 2 are hit together at
    step 10 and trained again (healed) from step 20."""
    store = EventStore(None)
    t0 = 1000.0
    store.append(RunStarted(t=t0, run_id="s", config={"replicas": R, "model": "tiny", "job": "local",
                                                      "group_size": 1}))
    for r in range(R):
        store.append(ReplicaState(t=t0 + 1 + r * 0.01, replica=r, state="training"))
    victims = (1, 2) if faults else ()
    for step in range(1, 41):
        t = t0 + 2 + step
        if faults and step == 10:
            for v in victims:
                store.append(FaultInjected(t=t - 0.5, fault="comms", replica=v, rank=0, step=10))
                store.append(FailureDetected(t=t - 0.4, replica=v, rank=0, reason="broken collective",
                                             source="trainer"))
                store.append(ReplicaState(t=t - 0.4, replica=v, state="failed"))
        if faults and step == 20:
            for v in victims:
                if not victim_back and v == 2:
                    continue
                store.append(Respawned(t=t - 0.3, replica=v, attempt=1, seconds=5.0))
                store.append(Healed(t=t - 0.2, replica=v, step=19, bytes=1000, seconds=0.1, source_replica=0))
                store.append(ReplicaState(t=t - 0.2, replica=v, state="training"))
        if survivor_fails and step == 15:
            store.append(FailureDetected(t=t - 0.1, replica=3, rank=0, reason="hung", source="hang"))
        for r in range(R):
            out = r in victims and 10 <= step < 20 or (not victim_back and r == 2 and step >= 10)
            if not out:
                extra = diverge if (faults and 25 <= step <= 27) else 0.0
                store.append(Step(t=t + r * 0.01, replica=r, step=step, loss=loss(step, r) * (1 + extra),
                                  tokens_per_s=1.0, committed=True))
        if faults and step == 20:
            for v in victims if victim_back else (1,):
                store.append(Rejoined(t=t + 0.1, replica=v, step=20))
    hashes = {f"replica{r}/rank0": "same" if not differ or r else "other" for r in range(R)}
    store.append(ReplicasIdentical(t=t0 + 44, step=40, identical=not differ, hashes=hashes))
    for r in range(R):
        store.append(ReplicaState(t=t0 + 45, replica=r, state="stopped"))
    store.append(RunStopped(t=t0 + 46, run_id="s"))
    return RunHistory(store)


def test_a_good_swing_keeps_every_promise_and_survives_json(tmp_path):
    result = measure(history(faults=True), history(faults=False), PLAN)
    assert result.problems() == [], result.problems()
    assert (result.faults_sent, result.faults_recovered, result.survivor_restarts) == (2, 2, [])
    assert (result.min_live, result.max_live, result.keep) == (2, 4, 2)
    assert [len(w.replicas) for w in result.waves] == [2] and result.waves[0].live_before == 4
    assert result.time_at_group_counts[2] > 9 and result.time_at_group_counts[4] > 20
    assert result.identical_at_end and result.identity_groups == R
    assert result.band.checked == 40 and result.band.outside == [] and result.steps == 40
    assert all(r.status == "recovered" and r.wave == 0 for r in result.recoveries)
    result.save(tmp_path / "swing.json")
    assert SwingResult.load(tmp_path / "swing.json") == result
    figure(result).savefig(tmp_path / "swing.png")


def test_each_broken_promise_is_reported():
    ref = history(faults=False)
    restarted = measure(history(faults=True, survivor_fails=True), ref, PLAN)
    assert [s.replica for s in restarted.survivor_restarts] == [3]
    assert any("survivors restarted" in p for p in restarted.problems())
    spike = measure(history(faults=True, diverge=0.5), ref, PLAN)
    assert spike.band.outside == [25, 26, 27] and any("outside the reference's band" in p for p in spike.problems())
    differ = measure(history(faults=True, differ=True), ref, PLAN)
    assert not differ.identical_at_end and any("bit-identical" in p for p in differ.problems())
    lost = measure(history(faults=True, victim_back=False), ref, PLAN)
    assert lost.faults_recovered == 1 and any("1 of 2 faults recovered" in p for p in lost.problems())
    quiet = measure(history(faults=False), ref, PLAN)
    assert "no fault was sent" in quiet.problems()
    low = measure(history(faults=True), ref, SwingPlan(replicas=R, every_s=10.0, at_once=2, keep=3))
    assert any("below the floor of 3" in p for p in low.problems())
