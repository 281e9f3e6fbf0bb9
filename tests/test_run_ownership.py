"""A run owns what it writes: its directory is a child of the runs root, its checkpoints live in a
folder only it prunes and resumes from, and when it has trained its steps it saves its final
state and lets every process go. Real runs (tiny model, two groups) for the end-to-end test;
the rules themselves are checked without starting anything."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.ft.control.checkpoint_folder import MANIFEST, Manifest, checkpoint_root, claim
from monarch_nb.ft.settings.checkpoint_format import list_checkpoints, step_dir
from monarch_nb.telemetry.events import CheckpointLoaded, Resumed, RunFinished, RunStarted, RunStopped, Step

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama3_debug_ft.toml"


# ---- names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ünï/../../escape", "../escape", "a/b", "..", ".", "", " x", "x\ny", "a\x00b",
                                  "-rf", ".hidden", "x" * 101, "sessions", "/abs"])
def test_a_run_name_that_is_not_one_safe_directory_name_is_refused_naming_the_rule(tmp_path, name):
    with pytest.raises(ValueError, match=r"^run_name: .* is not allowed: a run name is one directory name"):
        FTRun(RunConfig(run_name=name, runs_root=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["runs"])


def test_a_run_directory_is_a_child_of_the_runs_root_and_a_taken_name_says_how_to_resume(tmp_path):
    root = tmp_path / "runs"
    run = FTRun(RunConfig(run_name="exp-1.a_b", runs_root=str(root)))
    assert run.run_dir.resolve().parent == root.resolve()
    run.events.close()
    with pytest.raises(ValueError, match=r"already exists under .*; pick another name, or continue that run: "
                                         r"`%monarch train --resume .*exp-1\.a_b`"):
        FTRun(RunConfig(run_name="exp-1.a_b", runs_root=str(root)))


# ---- the checkpoint folder ----------------------------------------------------------------


def test_a_relative_checkpoint_folder_is_inside_the_run_directory_and_may_not_climb_out(tmp_path):
    run_dir = tmp_path / "runs" / "r"
    assert checkpoint_root(None, run_dir) == run_dir / "checkpoints"
    assert checkpoint_root("checkpoint", run_dir) == (run_dir / "checkpoint").resolve()
    assert checkpoint_root(str(tmp_path / "elsewhere"), run_dir) == (tmp_path / "elsewhere").resolve()
    with pytest.raises(ValueError, match=r"^checkpoint_dir: '\.\./other' leaves the run directory"):
        checkpoint_root("../other", run_dir)


def test_a_folder_another_run_owns_or_with_unclaimed_checkpoints_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    mine = claim(folder, "run-a", "tiny", 1)
    assert Manifest.read(folder) == mine and (folder / MANIFEST).is_file()
    assert claim(folder, "run-a", "tiny", 1) == mine  # the owner again: fine
    with pytest.raises(ValueError, match=r"holds the checkpoints of run 'run-a'; a run writes only into its own"):
        claim(folder, "run-b", "tiny", 1)
    bare = tmp_path / "bare"
    step_dir(bare, 10).mkdir(parents=True)
    with pytest.raises(ValueError, match=r"already holds checkpoints that no run claims"):
        claim(bare, "run-b", "tiny", 1)
    assert claim(bare, "run-b", "tiny", 1, adopt=True).run_id == "run-b"  # a resumed run's own, pre-manifest
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match=r"is not a readable checkpoint manifest"):
        claim(tmp_path / "broken", "run-b", "tiny", 1)


def test_a_run_pointed_at_another_runs_folder_is_refused_before_anything_starts(tmp_path):
    root = tmp_path / "runs"
    first = FTRun(RunConfig(run_name="first", runs_root=str(root), checkpoint_every=5))
    first.events.close()
    with pytest.raises(ValueError, match=r"holds the checkpoints of run 'first'"):
        FTRun(RunConfig(run_name="second", runs_root=str(root), checkpoint_dir=str(first.checkpoint_dir)))
    assert not (root / "second").exists()


# ---- two real runs from the shipped example ---------------------------------------------------


def finished(run: FTRun, after: float = 0.0, timeout: float = 180.0) -> RunFinished:
    run.wait_for(lambda e: isinstance(e, RunStopped) and e.t > after, timeout=timeout,
                 what=f"run {run.run_id} to finish and stop")
    done = [e for e in run.events.events(RunFinished) if e.t > after]
    assert done and done[-1].checkpoint, run.events.tail()
    return done[-1]


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow  # four real runs of the tiny model, two groups each: ~40 s
def test_two_runs_from_the_example_keep_their_own_checkpoints_finish_let_go_and_resume_their_own_weights(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a folder relative to the working directory would be shared by both runs
    job = tmp_path / "job.toml"
    job.write_text(EXAMPLE.read_text().replace("enable = false", "enable = true"))
    assert 'folder = "checkpoint"' in job.read_text()
    common = dict(replicas=2, model="tiny", runs_root=str(tmp_path / "runs"))

    a = FTRun(RunConfig.from_toml(job, steps=4, run_name="a", spares=1, **common)).start()
    end_a = finished(a)
    b = FTRun(RunConfig.from_toml(job, steps=6, run_name="b", **common)).start()
    end_b = finished(b)

    # each run's final state is in its own directory; nothing in the working directory
    assert Path(end_a.checkpoint) == step_dir(tmp_path / "runs" / "a" / "checkpoint", 4).resolve()
    assert Path(end_b.checkpoint) == step_dir(tmp_path / "runs" / "b" / "checkpoint", 6).resolve()
    assert [c.step for c in list_checkpoints(a.checkpoint_dir)] == [4]
    assert [c.step for c in list_checkpoints(b.checkpoint_dir)] == [6]
    assert sorted(os.listdir(tmp_path)) == ["job.toml", "runs"]
    assert end_a.digest and end_b.digest and end_a.digest != end_b.digest
    # a finished run holds no worker, spare or Lighthouse, and its stop names its own checkpoint
    for run in (a, b):
        assert alive(run.spawned_pids + [run.lighthouse.pid]) == []
        assert run.stopped and [e.reason for e in run.events.events(RunStopped)] == ["finished"]
    assert a._stop_report is not None and a._stop_report.newest_checkpoint == 4

    # resuming either continues its own weights from its own last step
    with pytest.raises(ValueError, match=r"holds the checkpoints of run 'a', not of run 'b'"):
        FTRun.resume(b.run_dir, steps=8, checkpoint_dir=str(a.checkpoint_dir))
    with pytest.raises(ValueError, match=r"^steps: the checkpoint is at step 4 and steps=4 would train none"):
        FTRun.resume(a.run_dir)
    for run, end, more in ((a, end_a, 6), (b, end_b, 8)):
        t0 = run.events.events(RunStopped)[-1].t
        again = FTRun.resume(run.run_dir, steps=more).start()
        final = finished(again, after=t0)
        loaded = [e for e in again.events.events(CheckpointLoaded) if e.t > t0]
        assert {e.replica for e in loaded} == {0, 1} and {e.digest for e in loaded} == {end.digest}
        assert {e.step for e in loaded} == {end.step}
        first = min(e.step for e in again.events.events(Step) if e.t > t0 and e.committed)
        assert first == end.step + 1 and final.step == more
        assert alive(again.spawned_pids + [again.lighthouse.pid]) == []

    # starting a new run from another run's weights is an act of its own, named and recorded
    with pytest.raises(ValueError, match=r"written with model='tiny', this run has model='debugmodel'"):
        FTRun(RunConfig.from_toml(job, steps=9, run_name="c", **{**common, "model": "debugmodel"},
                                  resume_from=str(a.checkpoint_dir)))
    c = FTRun(RunConfig.from_toml(job, steps=8, run_name="c", resume_from=str(a.checkpoint_dir), **common)).start()
    finished(c)
    resumed = c.events.events(Resumed)
    assert [(e.step, e.source_run) for e in resumed] == [(6, "a")]
    assert [c.step for c in list_checkpoints(a.checkpoint_dir)] == [4, 6]  # c never touched a's folder
    assert [x.step for x in list_checkpoints(c.checkpoint_dir)] == [8]


# ---- damaged run directories -------------------------------------------------------------


def fake_checkpoint(folder: Path, step: int, meta: bytes | None) -> Path:
    path = step_dir(folder, step)
    path.mkdir(parents=True)
    if meta is not None:
        (path / "meta.pt").write_bytes(meta)
    (path / "COMPLETE").write_text("{}")
    return path


def started_run(tmp_path: Path, name: str = "r") -> Path:
    run = FTRun(RunConfig(run_name=name, runs_root=str(tmp_path / "runs"), model="tiny"))
    run.events.append(RunStarted(run_id=name, config=run.config.to_dict()))
    run.events.close()
    return run.run_dir


@pytest.mark.parametrize("meta", [None, b"", b"\x80\x04garbage", b"not a pickle at all"])
def test_resuming_from_a_checkpoint_whose_meta_is_missing_or_garbage_is_refused_naming_it(tmp_path, meta):
    run_dir = started_run(tmp_path)
    fake_checkpoint(run_dir / "checkpoints", 10, meta)
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=r"^checkpoint: .*step-0000010/meta\.pt cannot be read .* this checkpoint "
                                         r"is damaged: move its directory away"):
        FTRun.resume(run_dir, steps=20)
    with pytest.raises(ValueError, match=r"meta\.pt cannot be read"):
        FTRun(RunConfig(run_name="other", runs_root=str(tmp_path / "runs"), model="tiny",
                        resume_from=str(run_dir / "checkpoints")))
    assert sorted(p for p in tmp_path.rglob("*")) == before  # refused before writing anything


def test_a_checkpoint_of_another_model_is_refused_by_resume_and_by_resume_from(tmp_path):
    import io

    import torch

    run_dir = started_run(tmp_path)
    buf = io.BytesIO()
    torch.save({"step": 10, "fingerprint": {"model": "debugmodel", "group_size": 1}, "run_id": "r"}, buf)
    fake_checkpoint(run_dir / "checkpoints", 10, buf.getvalue())
    with pytest.raises(ValueError, match=r"^resume: the checkpoint of step 10 was written with model='debugmodel', "
                                         r"this config has model='tiny'"):
        FTRun.resume(run_dir, steps=20)
    with pytest.raises(ValueError, match=r"^resume_from: .* written with model='debugmodel', this run has "
                                         r"model='tiny'; set model='debugmodel'"):
        FTRun(RunConfig(run_name="other", runs_root=str(tmp_path / "runs"), model="tiny",
                        resume_from=str(step_dir(run_dir / "checkpoints", 10))))
    with pytest.raises(ValueError, match=r"^resume_from: FTRun.resume continues a run from its own checkpoints"):
        FTRun.resume(run_dir, resume_from=str(run_dir / "checkpoints"))


def test_a_run_placed_on_the_cluster_must_run_on_slurm_and_in_a_host_of_its_own(tmp_path):
    with pytest.raises(ValueError, match=r"controller_on: 'cluster' .*job='local': train on one \(job='slurm' / 'kubernetes'.*controller_on='local'"):
        RunConfig(controller_on="cluster").validate()
    with pytest.raises(ValueError, match=r"FTRun.detached\(config\) or `%monarch train --name NAME`"):
        FTRun(RunConfig(job="slurm", controller_on="cluster", runs_root=str(tmp_path)))
    assert not list(tmp_path.iterdir()), "a refused run wrote nothing"
