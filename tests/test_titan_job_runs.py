"""torchtitan 0.3 registry jobs run for real. ``monarch-nb train --module torchft.llama3 --config
llama3_torchft_debugmodel ...`` from a shell trains to its last step on torchtitan's own c4_test
reader (the tiny corpus in its layout), with the job's selective activation checkpointing, torch's
profiler and gradient accumulation, and leaves nothing behind. A ``Trainer.Config`` built in Python
runs under FTRun, a killed group heals from a peer and the replicas are identical after, for llama3
(with two param groups) and for qwen3 (built through its model spec)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_nb.telemetry.events import ReplicasIdentical, Rejoined, RunStarted, Step
from helpers.proc_checks import assert_gone

pytestmark = pytest.mark.slow

SMALL = ["--training.seq_len", "32", "--training.local_batch_size", "2"]


def test_a_registry_job_trains_from_a_shell_to_its_last_step(tmp_path):
    """torchft's own DiLoCo debug job as shipped (2 fragments, sync every 10, torch's profiler on
    every step, selective AC, its validator's freq 5) with only seq_len, local batch, gloo (and
    fewer steps, two groups, a global batch of two microbatches, the validator on) overridden."""
    cmd = [sys.executable, "-m", "monarch_nb.cli", "train", "--module", "torchft.llama3", "--config",
           "llama3_torchft_debugmodel", "--fault_tolerance.process_group", "gloo", "--training.steps", "12",
           "--training.global_batch_size", "4", "--validator.enable", "--validator.steps", "2", *SMALL,
           "--replicas", "2", "--name", "shell"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MONARCH_NB_RUNS": ""})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [int(ln.split()[1]) for ln in lines if ln.startswith("step ")][-1] == 12
    assert any(ln.startswith("finished at step 12") for ln in lines)
    # torchtitan's dump_folder default (./outputs) is where the run went, as torchtitan writes there
    run_dir = tmp_path / "outputs" / "shell"
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    (started,) = [e for e in events if e["kind"] == RunStarted.kind]
    titan = started["config"]["titan"]
    assert (titan["dataset"], titan["activation_checkpoint"], titan["grad_accumulation"]) == ("c4_test", "selective", 2)
    assert (titan["profile_freq"], titan["profile_active"], titan["profile_warmup"]) == (10, 10, 0)
    assert (started["config"]["sync"], started["config"]["sync_every"], started["config"]["fragments"]) == ("diloco", 10, 2)
    traces = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.glob("profiling/traces/*/*.json"))
    assert traces == [f"profiling/traces/iteration_10/replica{r}_rank0_trace.json" for r in (0, 1)]
    assert not [e for e in events if e["kind"] == "failure_detected"]
    validated = sorted((e["step"], e["replica"], e["batches"]) for e in events if e["kind"] == "validated")
    assert validated == [(5, 0, 2), (5, 1, 2), (10, 0, 2), (10, 1, 2)]  # validator.freq 5 of the shipped job
    assert all(0 < e["loss"] < 12 for e in events if e["kind"] == "validated")
    assert not _processes_in(tmp_path), "a process of the shell's run outlived it"


def _processes_in(folder: Path) -> list[int]:
    """Processes whose working directory is ``folder`` (the shell's run and all it started)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == folder.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_checkpoint_interval_and_a_model_only_last_save_from_the_shell(tmp_path):
    cmd = [sys.executable, "-m", "monarch_nb.cli", "train", "--module", "llama3", "--config", "llama3_debugmodel",
           "--training.steps", "6", *SMALL, "--checkpoint.enable", "--checkpoint.interval", "4",
           "--checkpoint.last_save_model_only", "--replicas", "2", "--name", "ckpt", "--dump_folder", str(tmp_path)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    saved = {p.name: sum(f.stat().st_size for f in p.glob("*.distcp"))
             for p in (tmp_path / "ckpt" / "checkpoints").glob("step-*")}
    assert set(saved) == {"step-0000004", "step-0000006-model"}, saved  # the whole state at 4, weights at 6
    assert saved["step-0000006-model"] < saved["step-0000004"] / 2  # AdamW keeps two moments per weight
    from monarch_nb.ft.settings.checkpoint_format import latest_complete

    assert latest_complete(tmp_path / "ckpt" / "checkpoints").step == 4, "a resume never picks the weights alone"


def test_bad_input_from_the_shell_is_one_line_and_exit_2(tmp_path):
    cmd = [sys.executable, "-m", "monarch_nb.cli", "train", "--module", "llama3", "--config", "llama3_nope"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Available config functions" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "outputs").exists(), "nothing may start (or be written) on a refusal"


@pytest.mark.parametrize("module", ["llama3", "qwen3"])
def test_a_trainer_config_built_in_python_faults_and_heals(tmp_path, module):
    """llama3 as monarch_nb's flavour of the same build, with two param groups; qwen3 through its
    model spec."""
    import importlib

    from monarch_nb.ft import FTRun

    trainer = getattr(importlib.import_module(f"torchtitan.models.{module}.config_registry"), f"{module}_debugmodel")()
    trainer.training.steps, trainer.training.seq_len, trainer.training.local_batch_size = 1000, 32, 2
    trainer.dump_folder = str(tmp_path)
    if module == "llama3":  # torchtitan's param groups: two AdamW optimizers, each healed and compared
        from torchtitan.components.optimizer.optimizer import ParamGroupConfig

        kwargs = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
        trainer.optimizer.param_groups = [
            ParamGroupConfig(pattern="norm", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3, **kwargs}),
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 8e-4, **kwargs,
                                                                                    "weight_decay": 0.1})]
    run = FTRun(trainer, replicas=2, run_name="python")
    assert run.config.titan.activation_checkpoint == "selective" and run.config.titan.dataset == "c4_test"
    assert run.config.model == ("debugmodel" if module == "llama3" else "qwen3/debugmodel")
    try:
        run.start()
        run.wait_for_step(3, timeout=120)
        run.inject("kill", replica=1)
        back = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=180)
        same = run.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.t >= back.t, timeout=120)
        assert same.identical, same
        survivor = [e.step for e in run.events.events(Step) if e.replica == 0 and e.committed and e.t < back.t]
        assert len(survivor) >= 2, "the survivor kept committing while its peer was away"
    finally:
        run.stop()
    assert_gone(run.spawned_pids)
