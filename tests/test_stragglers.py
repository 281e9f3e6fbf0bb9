"""Stragglers on real processes (issue 54): the ``slow`` fault and the rule that names it.

Three groups of tiny on a real Lighthouse: fault-free, nobody is named; ``slow --factor 2.5`` on
group 1 (a delay in its own forward and backward, every rank of the group) has it named within
30 steps, by about that much, in events and ``status``; ``--factor 1`` clears it. Under
``straggler="drain"`` a named group is moved by the policy itself. Bad factors are refused.
"""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import Drained, Step, StragglerCleared, StragglerDetected

pytestmark = pytest.mark.slow


def _steps_of(run: FTRun, replica: int, since: float) -> list[int]:
    return [e.step for e in run.events.events(Step) if e.replica == replica and e.t >= since and e.committed]


def test_a_slow_group_is_named_within_30_steps_and_cleared_when_it_keeps_up(tmp_path):
    run = FTRun(RunConfig(replicas=3, model="tiny", runs_root=str(tmp_path), run_name="slow"))
    try:
        run.start()
        run.wait_for_step(40, timeout=180)  # two full windows fault-free
        assert not run.events.events(StragglerDetected), run.events.events(StragglerDetected)
        with pytest.raises(ValueError, match=r"factor: .*got 0.5.*below 1 would make it faster"):
            run.inject("slow", replica=1, factor=0.5)
        since = time.time()
        run.inject("slow", replica=1, factor=2.5)
        named = run.wait_for(lambda e: isinstance(e, StragglerDetected), timeout=120, since=since)
        assert named.replica == 1 and named.ratio >= 1.3, named  # named as its median crosses the rule
        assert len(_steps_of(run, 0, since)) <= 30, "named within 30 steps"
        run.wait_for_step(max(_steps_of(run, 0, since)) + 25, timeout=120)  # a window of slow steps: how slow
        assert 1.8 <= run.status()[1]["slow"] <= 4.0 and "slow" not in run.status()[0], run.status()
        back = time.time()
        run.inject("slow", replica=1, factor=1)
        cleared = run.wait_for(lambda e: isinstance(e, StragglerCleared), timeout=120, since=back)
        assert cleared.replica == 1 and "slow" not in run.status()[1]
        assert [e.replica for e in run.events.events(StragglerDetected)] == [1]  # nobody else, ever
    finally:
        run.stop()


def test_the_drain_policy_moves_a_named_straggler_on_its_own(tmp_path):
    run = FTRun(RunConfig(replicas=2, model="tiny", straggler="drain", straggler_window=10,
                          runs_root=str(tmp_path), run_name="drain-slow"))
    try:
        run.start()
        run.wait_for_step(12, timeout=180)
        since = time.time()
        run.inject("slow", replica=1, factor=3)
        moved = run.wait_for(lambda e: isinstance(e, Drained), timeout=240, since=since)
        assert moved.replica == 1, moved
        named = next(e for e in run.events.events(StragglerDetected) if e.t >= since)
        assert named.replica == 1 and named.policy == "drain", named
        training = sorted(k for k, v in run.status().items() if isinstance(k, int) and v["state"] == "training")
        assert training == [0, moved.replacement], run.status()
    finally:
        run.stop()
