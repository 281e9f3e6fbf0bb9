"""A planned move (issue 54): ``run.drain(R)`` moves group R onto a warm spare while R trains.

Real processes and a real Lighthouse (2 groups of tiny, 1 warm spare): the replacement heals from
live peers and commits a step with them before R leaves, so no quorum goes without R's data
before the replacement is in, no group fails, the survivor commits every step, and the groups are
identical after. Bad requests are refused naming the problem, and nothing moves.
"""

from __future__ import annotations

import threading
import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import Drained, Draining, FailureDetected, Quorum, ReplicaState, Step

pytestmark = pytest.mark.slow


def test_a_drained_group_is_replaced_from_a_spare_before_it_leaves_and_nothing_is_lost(tmp_path):
    run = FTRun(RunConfig(replicas=2, model="tiny", spares=1, runs_root=str(tmp_path), run_name="drain"))
    try:
        run.start()
        run.wait_for_step(5, timeout=120)
        from monarch_nb.ft.control.waiting import wait_for_spares

        wait_for_spares(run, timeout=120)
        with pytest.raises(ValueError, match=r"cannot drain group 7 \(no such group\); training groups: 0, 1"):
            run.drain(7)
        since = time.time()
        moved = run.drain(1, timeout=120)
        assert isinstance(moved, Drained) and moved.replica == 1 and moved.from_spare, moved
        new = moved.replacement
        assert new not in (0, 1), moved

        began = next(e for e in run.events.events(Draining) if e.t >= since)
        first = min(e.t for e in run.events.events(Step) if e.replica == new and e.committed)
        quorums = [e for e in run.events.events(Quorum) if began.t <= e.t < first]
        assert all(1 in e.participants for e in quorums), quorums  # group 1's data in every step until then
        assert not [e for e in run.events.events(FailureDetected) if e.t >= since]  # a move, not a failure
        left = next(e for e in run.events.events(ReplicaState) if e.replica == 1 and e.state == "retired")
        assert left.t >= first, (left, first)  # it left after its replacement committed
        final = max((e for e in run.events.events(Step) if e.replica == 1 and e.t >= since), key=lambda e: e.step)
        # its last step: averaged, silent to the Lighthouse since its quorum, gone without a commit
        assert final.left and not final.committed, final
        theirs = next(e for e in run.events.events(Step) if e.replica == 0 and e.step == final.step)
        assert theirs.committed and theirs.participants == 3, theirs  # its gradients are in the survivor's step
        ours = sorted(e.step for e in run.events.events(Step) if e.replica == 0 and e.t >= since)
        assert ours == list(range(ours[0], ours[-1] + 1)), ours  # the survivor committed every step
        assert all(e.committed for e in run.events.events(Step) if e.replica == 0 and e.t >= since)
        same = run.check_identical(timeout=120)
        assert same.identical and sorted(same.hashes) == [f"replica0/rank0", f"replica{new}/rank0"], same
        assert sorted(k for k, v in run.status().items() if isinstance(k, int) and v["state"] == "training") == \
            [0, new]

        refused: list[Exception] = []

        def drain(replica: int) -> None:
            try:
                run.drain(replica, timeout=120)
            except RuntimeError as exc:
                refused.append(exc)

        both = [threading.Thread(target=drain, args=(r,)) for r in (0, new)]
        for t in both:
            t.start()
        for t in both:
            t.join(300)
        assert len(refused) == 1 and "a drain or resize is in progress" in str(refused[0]), refused
        assert len(run.events.events(Drained)) == 2  # the other one moved
    finally:
        run.stop()
