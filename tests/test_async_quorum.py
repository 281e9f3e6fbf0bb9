"""torchft's async quorum (``RunConfig(quorum="async")``): the quorum forms while the step computes.

What must still hold: a group that comes back heals from a peer and does not step on its stale
weights (its gradients are left out of that step, and it takes the healed weights before its
optimizer steps) - so every group is bit-identical after the heal; the recovery ladder repairs a
``comms`` fault in place as under the synchronous quorum; a Lighthouse that stops answering costs no group its
process (the quorum's own timeout is answered as under the synchronous quorum). One run (R=3,
tiny) on real processes and a real Lighthouse.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import (
    FailureDetected,
    Healed,
    QuorumTimedOut,
    Rejoined,
    ReplicasIdentical,
    Respawned,
    RungStarted,
    Step,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    run = FTRun(RunConfig(replicas=3, quorum="async", quorum_timeout_s=5.0,
                          runs_root=str(tmp_path_factory.mktemp("async")), run_name="async-quorum"))
    seen: dict[str, object] = {}
    try:
        run.start()
        run.wait_for_step(5, timeout=180)
        for kind, victim in (("kill", 1), ("comms", 2)):
            since = time.time()
            run.inject(kind, replica=victim)
            rejoined = run.wait_for(lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v,
                                    timeout=180, since=since)
            same = run.wait_for(lambda e, t=rejoined.t: isinstance(e, ReplicasIdentical) and e.t >= t, timeout=120)
            seen[kind] = (since, rejoined, same)
        # The Lighthouse stops answering (stopped, not killed: a killed one is restarted within
        # 0.1 s and a request that reaches the new one never times out): every group's async
        # quorum times out; it answers again once they did.
        since = time.time()
        os.kill(run.lighthouse_pid, signal.SIGSTOP)
        try:
            run.wait_for(lambda e: isinstance(e, QuorumTimedOut), timeout=60, since=since)
        finally:
            os.kill(run.lighthouse_pid, signal.SIGCONT)
        last = max(e.step for e in run.events.events(Step) if e.committed)
        run.wait_for(lambda e: isinstance(e, Step) and e.committed and e.step > last + 2, timeout=120, since=since)
        seen["lighthouse"] = since
    finally:
        run.stop()
    return run, seen


def test_async_quorum_a_group_that_heals_does_not_step_on_stale_weights(async_run):
    """After a kill the new process heals from a peer inside the async quorum; had it stepped
    with its own (initial) weights or gradients, the identity check after its rejoin would differ."""
    run, seen = async_run
    since, rejoined, same = seen["kill"]
    heals = [e for e in run.events.events(Healed) if e.replica == 1 and e.t >= since]
    assert heals and heals[0].cause == "recovery", heals
    assert same.identical, same
    first = next(e for e in run.events.events(Step) if e.replica == 1 and e.committed and e.t >= since)
    others = {e.step for e in run.events.events(Step) if e.replica == 0 and e.committed and e.t >= since}
    assert first.step in others, (first, sorted(others)[:5])  # it committed the survivors' step, not its own count


def test_async_quorum_keeps_the_ladder_repairing_comms_in_place(async_run):
    run, seen = async_run
    since, _, same = seen["comms"]
    rungs = [e.rung for e in run.events.events(RungStarted) if e.replica == 2 and e.t >= since]
    assert rungs == ["communicator"], rungs
    assert same.identical, same


def test_async_quorum_step_records_say_where_the_step_went(async_run):
    run, _ = async_run
    steps = [e for e in run.events.events(Step) if e.committed]
    assert steps and all(e.quorum_s is not None and e.average_s is not None and e.commit_s is not None
                         for e in steps)
    assert run.config.quorum == "async" and run.history().summary()["loss_end"] < run.history().summary()["loss_start"]


def test_async_quorum_a_silent_lighthouse_replaces_no_process(async_run):
    """The async quorum's own timeout (torchft raises it from the step's wait for the quorum) is
    not a failure of the group: a new Manager asks again, as under the sync quorum."""
    run, seen = async_run
    since = seen["lighthouse"]
    assert [e for e in run.events.events(QuorumTimedOut) if e.t >= since], "the groups' quorums timed out"
    for kind in (FailureDetected, RungStarted, Respawned):
        assert not [e for e in run.events.events(kind) if e.t >= since], kind.__name__
