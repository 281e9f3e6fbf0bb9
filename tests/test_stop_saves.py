"""A stop during a durable save: the newest checkpoint on disk is complete, or the save is
recorded as ``checkpoint_abandoned`` and its directory removed - never a torn newest one.

The save is made slow on purpose (``MONARCH_NB_TEST_SLOW_SAVE_S``: DCP's writer sleeps before
writing, a slow disk); nothing here asserts how long anything took."""

from __future__ import annotations

import threading

import pytest
from torch.distributed.checkpoint import FileSystemWriter

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.ft.settings.checkpoint_format import ABANDONED, COMPLETE, latest_complete, list_checkpoints, step_dir
from monarch_nb.ft.worker.checkpointer import SLOW_SAVE_ENV, DurableCheckpointer
from monarch_nb.ft.control.checkpoint_folder import remove_torn
from monarch_nb.ft.control.run import SAVE_DEADLINE_MIN_S, StopReport, save_deadline
from monarch_nb.telemetry.events import CheckpointAbandoned, CheckpointSaved, Step
from helpers.proc_checks import assert_gone

EVERY = 10
SLOW_S = 6.0


def _stop_during_a_save(run: FTRun, **stop_kwargs) -> tuple[int, float, StopReport]:
    """Start the run, wait until a save is writing, stop. Returns (its step, when the stop began, report).

    A save's completion is reported at the next committed step, and a save starts at the first
    committed multiple of ``EVERY`` after that (none is pending then): that step's save is writing."""
    import time

    run.start()
    first = run.wait_for(lambda e: isinstance(e, CheckpointSaved), timeout=240)
    started = run.wait_for(lambda e: isinstance(e, Step) and e.replica == 0 and e.committed
                           and e.step % EVERY == 0 and e.t >= first.t, timeout=120)
    t_stop = time.time()
    return started.step, t_stop, run.stop(**stop_kwargs)


@pytest.mark.slow
def test_stop_waits_for_a_save_in_flight_and_leaves_it_complete(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOW_SAVE_ENV, str(SLOW_S))
    run = FTRun(RunConfig(replicas=2, checkpoint_every=EVERY, runs_root=str(tmp_path)))
    try:
        step, t_stop, report = _stop_during_a_save(run)
    finally:
        run.stop()
    saved = [e for e in run.events.events(CheckpointSaved) if e.step == step]
    assert saved, f"the save of step {step}, in flight at the stop, must complete"
    assert saved[0].t >= t_stop, "it completed after the stop began: the stop waited for it"
    assert latest_complete(run.checkpoint_dir).step == step
    assert all(c.complete for c in list_checkpoints(run.checkpoint_dir)), "no torn directory is left"
    assert report.newest_checkpoint == step and not report.abandoned, report
    assert not run.events.events(CheckpointAbandoned)
    assert f"newest checkpoint: step {step} (complete)" in str(report)
    # where the stop's time went: in order, adding up to it, the wait for the save among them
    phases = dict(report.phases)
    assert list(phases)[:3] == ["supervisor", "finish", "groups"] and "dashboard" in phases, report.phases
    assert abs(sum(phases.values()) - report.seconds) < 0.05 and phases["finish"] > 0.5, report.phases
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=20)


@pytest.mark.slow
def test_a_save_that_cannot_finish_in_time_is_abandoned_recorded_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOW_SAVE_ENV, str(SLOW_S))
    run = FTRun(RunConfig(replicas=2, checkpoint_every=EVERY, runs_root=str(tmp_path)))
    try:
        step, _, report = _stop_during_a_save(run, save_timeout=0.5)
    finally:
        run.stop()
    (abandoned,) = run.events.events(CheckpointAbandoned)
    assert abandoned.step == step and abandoned.replica == 0, abandoned  # reported by the saving group
    assert "did not finish within 0.5 s" in abandoned.reason
    assert report.abandoned == (abandoned,) and f"the save of step {step} was abandoned" in str(report)
    assert not step_dir(run.checkpoint_dir, step).exists(), "the torn directory is removed"
    newest = latest_complete(run.checkpoint_dir)
    assert newest is not None and newest.step < step and report.newest_checkpoint == newest.step
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=20)


# ---- the pieces, in this process ----------------------------------------------------------


def _checkpointer(root, events):
    import torch

    state = {"w": torch.arange(1000, dtype=torch.float32)}
    return DurableCheckpointer(str(root), every=5, keep=2, rank=0, group_size=1, state=lambda: state,
                               meta=lambda step: {"step": step}, emit=events.append)


def test_close_finishes_a_slow_save_or_abandons_it_when_given_a_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOW_SAVE_ENV, "1.5")
    events: list[dict] = []
    ck = _checkpointer(tmp_path / "a", events)
    ck.after_commit(5, saver=True)
    assert ck.close(timeout=None) is None
    assert (step_dir(tmp_path / "a", 5) / COMPLETE).exists()
    assert [e["kind"] for e in events] == ["checkpoint_saved"]

    events.clear()
    ck = _checkpointer(tmp_path / "b", events)
    ck.after_commit(5, saver=True)
    assert ck.close(timeout=0.1) == 5
    assert [e["kind"] for e in events] == ["checkpoint_abandoned"] and events[0]["step"] == 5
    assert (step_dir(tmp_path / "b", 5) / ABANDONED).exists()
    assert not (step_dir(tmp_path / "b", 5) / COMPLETE).exists()


def test_a_save_whose_directory_goes_away_mid_write_is_recorded_not_raised(tmp_path, monkeypatch):
    """DCP then fails in its finish (the metadata write) with ``CheckpointException``, a
    ``BaseException``: it once escaped ``except Exception`` and ended the group's training
    (test_durable's full-disk test, on a loaded box)."""
    monkeypatch.setenv(SLOW_SAVE_ENV, "2.0")
    planned = threading.Event()
    plan = FileSystemWriter.prepare_local_plan

    def plan_and_tell(self, *args, **kwargs):
        out = plan(self, *args, **kwargs)
        planned.set()
        return out

    monkeypatch.setattr(FileSystemWriter, "prepare_local_plan", plan_and_tell)
    events: list[dict] = []
    ck = _checkpointer(tmp_path / "c", events)
    ck.after_commit(5, saver=True)  # staged; the write sleeps first
    # DCP makes the step's directory again on its writing thread just before the (slowed) write:
    # the folder is moved after that, or DCP makes it anew and the file below finds a directory (CI)
    assert planned.wait(timeout=60), "DCP never planned the write"
    (tmp_path / "c").rename(tmp_path / "c-moved")
    (tmp_path / "c").write_text("in the way")
    assert ck.close(timeout=None) is None  # waits for the write, which fails: recorded, not raised
    assert [e["kind"] for e in events] == ["checkpoint_failed"], events
    assert "CheckpointException" in events[0]["error"]


def test_remove_torn_removes_only_what_is_newer_than_the_newest_complete(tmp_path):
    for step, complete in ((5, True), (7, False), (10, True), (15, False), (20, False)):
        d = step_dir(tmp_path, step)
        d.mkdir()
        if complete:
            (d / COMPLETE).write_text("{}")
    removed = remove_torn(tmp_path)
    assert [c.step for c in removed] == [15, 20]
    assert [c.step for c in list_checkpoints(tmp_path)] == [5, 7, 10]  # an old torn one is no danger


def test_the_save_deadline_follows_the_slowest_save_of_the_run():
    assert save_deadline([]) == SAVE_DEADLINE_MIN_S
    assert save_deadline([0.5, 1.0]) == SAVE_DEADLINE_MIN_S
    assert save_deadline([2.0, 7.0, 4.0]) == 21.0


def test_a_failed_saves_record_names_the_ranks_own_error_first():
    """DCP's CheckpointException text is a traceback; the 300 characters kept once cut off the
    PermissionError underneath (CI: test_durable's unwritable-folder test)."""
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from monarch_nb.ft.worker.checkpointer import save_error_text

    cause = PermissionError(13, "Permission denied", "/ckpt/step-0000006")
    exc = CheckpointException("all_reduce failed", {0: (cause, traceback.StackSummary())})
    text = save_error_text(exc)
    assert text.startswith("CheckpointException on rank 0: PermissionError: [Errno 13] Permission denied"), text
    assert save_error_text(OSError(28, "No space left on device")) == "OSError: [Errno 28] No space left on device"
