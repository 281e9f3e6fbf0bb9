"""Durable checkpoints of semi-synchronous runs (issue 53): DiLoCo's whole state round-trips.

A DiLoCo run (tiny, a meeting every 5 steps) saves at its meetings and finishes at step 23,
between two meetings. A second run started from the first's step-10 checkpoint trains the same
steps 11..23 and ends with bit-identical parameters: the model, the inner optimizer, the
parameters the groups last agreed on and the outer optimizer's momentum all came back (without
the momentum the losses part at step 16, the first outer step after the load). That proof needs
one group: a checkpoint holds the saving group's inner optimizer, and every group resumes with
it (each group's own inner moments are not kept). With two groups, resuming from step 23 goes on
with the meetings where they were (the next at 25, not 28) and the groups are identical at a
meeting; a resume or a new run whose semi-synchronous settings differ from the checkpoint's is
refused naming the setting before anything starts.
"""

from __future__ import annotations

import pytest

from helpers.agree import all_agree
from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import CheckpointLoaded, CheckpointSaved, RunFinished, Step

pytestmark = pytest.mark.slow


def _finish(run: FTRun, timeout: float = 240) -> RunFinished:
    try:
        run.start()
        done = run.wait_for(lambda e: isinstance(e, RunFinished), timeout=timeout)
    finally:
        run.stop()
    return done  # type: ignore[return-value]


def _step(run: FTRun, step: int):
    return next(p for p in (run.run_dir / "checkpoints").iterdir() if p.name.startswith("step-")
                and int(p.name[5:]) == step)


def test_a_diloco_checkpoint_round_trips_every_part_of_its_state(tmp_path):
    base = dict(replicas=1, model="tiny", sync="diloco", sync_every=5, checkpoint_every=10, steps=23,
                runs_root=str(tmp_path))
    first = FTRun(RunConfig(run_name="whole", **base))
    done = _finish(first)
    assert done.step == 23 and done.checkpoint, done
    saved = sorted({e.step for e in first.events.events(CheckpointSaved)})
    assert saved[:2] == [10, 20], saved  # at meetings
    again = FTRun(RunConfig(run_name="from-10", resume_from=str(_step(first, 10)), **base))
    redone = _finish(again)
    loaded = again.events.events(CheckpointLoaded)
    assert loaded and all(e.step == 10 for e in loaded), loaded
    assert redone.step == 23 and redone.digest == done.digest, (redone, done)


def test_a_semi_sync_run_resumes_between_meetings_and_refuses_other_settings(tmp_path):
    base = dict(replicas=2, model="tiny", sync="diloco", sync_every=5, checkpoint_every=10, runs_root=str(tmp_path))
    first = FTRun(RunConfig(steps=23, run_name="two", **base))
    done = _finish(first)
    assert done.step == 23 and done.checkpoint, done

    with pytest.raises(ValueError, match=r"resume: the checkpoint of step 23 was written with sync_every=5 and "
                                         r"this run has sync_every=10.*set sync_every=5"):
        FTRun.resume(first.run_dir, steps=30, sync_every=10, checkpoint_every=10)
    with pytest.raises(ValueError, match=r"sync_steps: unknown config field \(torchtitan's name; here it is sync_every\)"):
        FTRun.resume(first.run_dir, steps=30, sync_steps=8)
    with pytest.raises(ValueError, match=r"resume_from: .*written with sync='diloco' and this run has "
                                         r"sync='local_sgd'"):
        FTRun(RunConfig(**{**base, "sync": "local_sgd"}, steps=30, run_name="other",
                        resume_from=str(_step(first, 10))))

    resumed = FTRun.resume(first.run_dir, steps=200)
    # the newest step of the first run by its time: between meetings the groups step on their own, so
    # the last one polled can be a group that ran ahead of the other
    t0 = max(e.t for e in first.events.events(Step))
    try:
        resumed.start()
        same = all_agree(resumed, 2)
        ended = resumed.wait_for(lambda e: isinstance(e, RunFinished), timeout=240)
    finally:
        resumed.stop()
    assert same.identical and len(same.hashes) == 2 and same.step % 5 == 0, same
    assert ended.step == 200, ended
    after = [e for e in resumed.events.events(Step) if e.t > t0 and e.committed]
    assert min(e.step for e in after) == 24, sorted({e.step for e in after})[:5]
    met = sorted({e.step for e in after if e.synced})
    assert met[:2] == [25, 30], met  # its meetings where they were: 3 steps into the inner loop at 23
    losses = [e.loss for e in after if e.replica == 0]
    assert losses[-1] < losses[0], losses  # the loss curve goes on down
