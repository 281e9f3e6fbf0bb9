"""Durable checkpoints on real processes: every group lost at once continues from the newest
complete checkpoint, a kernel-less resume continues the same run, a checkpoint interrupted
mid-write is never loaded, the restart mode restarts every group from disk, and bad requests
are refused before anything starts."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.ft.settings.checkpoint_format import COMPLETE, latest_complete, list_checkpoints
from helpers.proc_checks import assert_gone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lost_and_resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("durable")
    run = FTRun(RunConfig(replicas=2, checkpoint_every=5, checkpoint_keep=2, runs_root=str(root)))
    facts: dict = {}
    try:
        run.start()
        run.wait_for(lambda e: e.kind == "checkpoint_saved" and e.step >= 10, timeout=240)
        facts["before"] = max(e.step for e in run.history().steps())
        since = time.time()
        for g in run.groups:  # every group at once: no live peer is left
            for pid in g.pids:
                os.kill(pid, signal.SIGKILL)
        facts["lost"] = run.wait_for(lambda e: e.kind == "all_groups_lost", timeout=120, since=since)
        facts["resumed"] = run.wait_for(lambda e: e.kind == "resumed", timeout=120, since=since)
        facts["back"] = [run.wait_for(lambda e, v=v: e.kind == "rejoined" and e.replica == v, timeout=180, since=since)
                         for v in (0, 1)]
        facts["identical"] = run.check_identical(timeout=120)
    finally:
        run.stop()
    # the kernel is gone too: continue the same run from its directory alone
    again = FTRun.resume(run.run_dir)
    try:
        resumed_at = time.time()
        again.start()
        facts["again_from"] = again.resume_from.step
        # the run's log holds the first run's steps too: a wait must not be answered by those
        facts["again_first_step"] = again.wait_for(lambda e: e.kind == "step", timeout=120)
        facts["resumed_at"] = resumed_at
        again.wait_for_step(again.resume_from.step + 3, timeout=240)
        facts["again_identical"] = again.check_identical(timeout=120)
    finally:
        again.stop()
    return run, again, facts


def test_checkpoints_are_saved_off_the_critical_path_and_pruned(lost_and_resumed):
    run, _, _ = lost_and_resumed
    saved = run.events.events("checkpoint_saved")
    assert saved and {e.replica for e in saved} == {0}, "one group saves, the lowest in the quorum"
    # The training thread only stages a copy (``stall``) and goes on; DCP's writer thread ends
    # the write later (``seconds``, both from the save's start). A write on the training thread
    # would be over before the thread went on: seconds <= stall.
    assert all(e.stall < e.seconds for e in saved), \
        ("every save's write must end after the training thread went on", [(e.stall, e.seconds) for e in saved])
    steps = [e.t for e in run.history().steps(1)]
    median_step = sorted(b - a for a, b in zip(steps, steps[1:]))[len(steps) // 2]
    # sanity only: staging a host copy typically costs a fraction of a step (5x margin)
    assert max(e.stall for e in saved) < 5 * median_step, \
        f"a save's stall {max(e.stall for e in saved):.2f} s is over 5 median steps ({median_step:.2f} s)"
    assert all(e.bytes > 1_000_000 for e in saved)
    complete = [c for c in list_checkpoints(run.checkpoint_dir) if c.complete]
    assert 1 <= len(complete) <= 2, complete  # checkpoint_keep=2


def test_a_wait_on_a_resumed_run_is_not_answered_by_the_run_it_continues(lost_and_resumed):
    _, again, facts = lost_and_resumed
    assert any(e.t < facts["resumed_at"] for e in again.events.events("step")), "the log holds the old steps"
    assert facts["again_first_step"].t >= facts["resumed_at"], facts["again_first_step"]
    assert facts["again_first_step"].step >= facts["again_from"], facts["again_first_step"]


def test_losing_every_group_resumes_from_the_newest_checkpoint_with_identical_replicas(lost_and_resumed):
    run, _, facts = lost_and_resumed
    assert facts["lost"].checkpoint == facts["resumed"].checkpoint
    assert facts["resumed"].step >= 10 and facts["resumed"].step % 5 == 0
    assert all(b.step == facts["resumed"].step + 1 for b in facts["back"]), facts["back"]
    assert facts["identical"].identical
    # the loss continues where the checkpoint left it, not from the initial weights
    losses = {e.step: e.loss for e in run.history().steps(0)}
    first_loss = losses[min(losses)]
    resumed_loss = [e.loss for e in run.history().steps(0) if e.t >= facts["resumed"].t][0]
    assert resumed_loss < first_loss - 1.0, (first_loss, resumed_loss)


def test_losing_every_group_climbs_the_ladder_from_process_to_checkpoint(lost_and_resumed):
    """Rung 3 -> 5: each group entered at ``process``; with no live peer left to heal from, the
    ladder escalates every group waiting for one to ``checkpoint``, naming why. A group still
    being built then (on a loaded box) comes back after the resume and heals from one that loaded it."""
    run, _, facts = lost_and_resumed
    since = facts["lost"].t - 30
    escalated = [e for e in run.events.events("rung_escalated") if e.t >= since]
    assert escalated and {(e.rung, e.to) for e in escalated} == {("process", "checkpoint")}, escalated
    assert all(e.reason for e in escalated), escalated
    loaded = {e.replica for e in escalated}
    started = {(e.replica, e.rung) for e in run.events.events("rung_started") if e.t >= since}
    assert {(r, "checkpoint") for r in loaded} <= started, started
    healed = {e.replica for e in run.events.events("healed") if e.t >= facts["resumed"].t and e.source_replica in loaded}
    assert loaded | healed == {0, 1}, (loaded, healed)


def test_resume_continues_the_same_run_and_its_event_log(lost_and_resumed):
    run, again, facts = lost_and_resumed
    assert again.run_id == run.run_id and again.run_dir == run.run_dir
    assert facts["again_identical"].identical
    kinds = [e.kind for e in again.events]
    assert kinds.count("run_started") == 2 and "resumed" in kinds[kinds.index("run_stopped"):]
    steps = [e.step for e in again.history().steps(0)]
    assert steps[-1] > facts["again_from"] and max(steps) > facts["before"]
    assert_gone(run.spawned_pids + again.spawned_pids + [run.lighthouse_pid, again.lighthouse_pid], timeout=20)


def test_a_checkpoint_interrupted_mid_write_is_skipped(lost_and_resumed, tmp_path):
    run, _, _ = lost_and_resumed
    newest = latest_complete(run.checkpoint_dir)
    torn = newest.path.with_name("step-9999999")
    shutil.copytree(newest.path, torn)
    (torn / COMPLETE).unlink()  # as a save killed before it finished
    try:
        assert latest_complete(run.checkpoint_dir).step == newest.step
        with pytest.raises(ValueError, match="incomplete"):
            from monarch_nb.ft.worker.checkpointer import load_into

            load_into(torn, {})
    finally:
        shutil.rmtree(torn)


@pytest.mark.parametrize("on_failure", ["restart", "plain_restart"])
def test_restart_mode_restarts_every_group_from_disk(tmp_path, on_failure):
    """on_failure="restart" (torchft's quorum per step) and "plain_restart" (no torchft: one
    process group over the job, as torchtitan under torchrun) restart every group the same way."""
    run = FTRun(RunConfig(replicas=2, checkpoint_every=5, on_failure=on_failure, runs_root=str(tmp_path)))
    try:
        run.start()
        saved = run.wait_for(lambda e: e.kind == "checkpoint_saved" and e.step >= 5, timeout=240)
        # kill inside step 5k+3, so that there are steps to redo that the event log holds: step
        # 5k+2 was committed but its event may go with the teardown of every group (the restart
        # counts what the log shows: Supervisor.last_recorded_step), step 5k+1's is in the log;
        # a kill inside 5k+1 would leave nothing to redo (seen in the fresh-clone CI, twice).
        # The log lags the workers by a poll or two and the arming call takes a moment: a target
        # 2 steps ahead was passed before it was armed (then the kill fires steps later).
        target = max(e.step for e in run.history().steps()) + 6
        while target % 5 != 3:
            target += 1
        before = {g.index: list(g.pids) for g in run.groups}
        since = time.time()
        run.inject("kill", replica=1, at_step=target)
        restarted = run.wait_for(lambda e: e.kind == "restarted_from_checkpoint", timeout=240, since=since)
        rejoined = [run.wait_for(lambda e, v=v: e.kind == "rejoined" and e.replica == v, timeout=180, since=since)
                    for v in (0, 1)]
        events = run.events.events()
        cut = events.index(restarted)  # no group trains between the teardown and this event
        last_before = max(e.step for e in events[:cut] if e.kind == "step" and e.committed)
        for v in (0, 1):  # every group redoes the lost steps (and one more)
            run.wait_for(lambda e, v=v: e.kind == "step" and e.committed and e.replica == v
                         and e.step > last_before, timeout=180, since=restarted.t)
        after = {g.index: list(g.pids) for g in run.groups}
        identical = run.check_identical(timeout=120)
    finally:
        run.stop()
    assert all(set(after[g]).isdisjoint(before[g]) for g in before), "every group must be restarted"
    assert restarted.checkpoint and restarted.step >= saved.step and restarted.step < target, restarted
    # the steps lost are those committed since the checkpoint, and every group redoes exactly
    # those: it resumes at the checkpoint's step + 1
    assert restarted.lost_steps == last_before - restarted.step >= 1, (restarted, last_before)
    assert [e.step for e in rejoined] == [restarted.step + 1] * 2, rejoined
    events = run.events.events()
    redone = events[events.index(restarted):]
    for v in (0, 1):
        steps = [e.step for e in redone if e.kind == "step" and e.committed and e.replica == v]
        assert steps[:restarted.lost_steps + 1] == list(range(restarted.step + 1, last_before + 2)), (v, steps)
    assert identical.identical
    assert not run.events.events("healed"), "the old way reads state from disk, not from a peer"
    # each group read the checkpoint itself (all at once: responses.RestartResponse), its load time recorded
    loads = [e for e in events if e.kind == "checkpoint_loaded" and e.t >= since]
    assert sorted(e.replica for e in loads) == [0, 1] and all(e.step == restarted.step and e.seconds > 0
                                                                for e in loads), loads
    # the survivor is not blamed: one failure, the victim's
    assert [e.replica for e in events if e.kind == "failure_detected"] == [1]
    assert [e.mesh for e in events if e.kind == "worker_failed"] == ["replica1"]
    steps = [e for e in events if e.kind == "step"]
    if on_failure == "plain_restart":  # no Lighthouse, no quorum: the job's own process group
        assert run.lighthouse is None and not run.events.events("lighthouse_started")
        assert not run.events.events("quorum") and all(e.quorum_id is None for e in steps)
    else:
        assert run.events.events("quorum") and all(e.quorum_id is not None for e in steps)


def test_bad_checkpoint_requests_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="^checkpoint_every: must be an integer >= 1"):
        RunConfig(checkpoint_every=0).validate()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="^checkpoint_dir: .* is not writable"):
        FTRun(RunConfig(checkpoint_every=5, checkpoint_dir=str(blocker / "ckpt"), runs_root=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists(), "a refused run leaves nothing behind"
    with pytest.raises(ValueError, match="is not a run directory"):
        FTRun.resume(tmp_path)
    run_dir = tmp_path / "r2"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text(
        '{"t": 1.0, "kind": "run_started", "run_id": "r2", "config": {"replicas": 2}}\n')
    with pytest.raises(ValueError, match="no complete checkpoint under"):
        FTRun.resume(run_dir)


def test_a_checkpoint_from_another_model_is_refused_naming_the_mismatch(lost_and_resumed):
    run, _, _ = lost_and_resumed
    with pytest.raises(ValueError, match="written with model='debugmodel', this config has model='debug4x'"):
        FTRun.resume(run.run_dir, model="debug4x")


def test_a_save_that_cannot_be_written_is_recorded_and_training_goes_on(tmp_path):
    """Not a real full disk (ENOSPC needs a filesystem this sandbox cannot mount): the checkpoint
    directory is replaced by a file mid-run, so every save fails to create its directory."""
    ckpt = tmp_path / "ckpt"
    run = FTRun(RunConfig(replicas=2, checkpoint_every=3, checkpoint_dir=str(ckpt), runs_root=str(tmp_path / "r")))
    try:
        run.start()
        run.wait_for(lambda e: e.kind == "checkpoint_saved", timeout=240)
        # moved away in one step: a save in flight may still be writing into it (rmtree raced
        # with it: "Directory not empty")
        ckpt.rename(tmp_path / "ckpt-moved-away")
        ckpt.write_text("in the way")
        since = time.time()
        failed = run.wait_for(lambda e: e.kind == "checkpoint_failed", timeout=120, since=since)
        step = failed.step
        run.wait_for_step(step + 3, timeout=120)
    finally:
        run.stop()
    assert "Error" in failed.error
    assert not run.events.events("failure_detected"), "a failed save is no failure of a group"
