"""torchtitan 0.3's own job form (``--module M --config F --section.key V``), parsed by torchtitan's
ConfigManager and read leaf by leaf: every leaf of the shipped llama3, qwen3 and torchft.llama3
debug configs gets a verdict, a changed leaf is never dropped silently, overrides land in the
RunConfig, and bad input is one clear line. Pure parsing: nothing is started."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from monarch_nb.cli import main as cli
from monarch_nb.ft.settings import titan_job

SHIPPED = {"llama3": "llama3_debugmodel", "qwen3": "qwen3_debugmodel", "torchft.llama3": "llama3_torchft_debugmodel"}


@pytest.fixture(scope="module", params=list(SHIPPED), ids=list(SHIPPED))
def shipped(request):
    return titan_job.load(["--module", request.param, "--config", SHIPPED[request.param]])


def test_every_leaf_of_a_shipped_debug_config_has_a_rule_and_one_verdict(shipped):
    _, verdicts = titan_job.read(shipped)
    paths = [v.path for v in verdicts]
    assert len(paths) == len(set(paths))
    assert set(p for p, _ in titan_job.leaves(shipped)) <= set(paths), "a leaf without a verdict"
    assert not [v for v in verdicts if "no rule" in v.becomes], "the rule table must cover the shipped configs"
    assert all(v.becomes for v in verdicts)


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value / 2 + 0.05
    if isinstance(value, str):
        return value + "_x"
    return None  # None, lists, dicts, functions: no generic "other value"


def _set(config, path, value):
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = getattr(node, part)
    object.__setattr__(node, last, value)


def test_a_changed_leaf_is_applied_or_refused_by_name_never_dropped(shipped):
    """Each scalar leaf set to another value: either the RunConfig fields change, or its verdict
    is a refusal naming what is supported, or it says why the value changes nothing (its feature
    is off: "unused: ..."; or it is what monarch_nb does: "as monarch_nb does it"). None is
    honoured and silently left out."""
    base_fields, _ = titan_job.read(shipped)
    tried = 0
    for path, value in titan_job.leaves(shipped):
        new = _changed(value)
        if new is None:
            continue
        tried += 1
        config = copy.deepcopy(shipped)
        _set(config, path, new)
        fields, verdicts = titan_job.read(config)
        (verdict,) = [v for v in verdicts if v.path == path]
        assert (not verdict.honoured or fields != base_fields
                or verdict.becomes.startswith(("unused", "as monarch_nb does it"))), (path, new, verdict)
        if not verdict.honoured:
            assert verdict.becomes and path in verdict.line()
    assert tried > 40


def test_overrides_go_through_torchtitans_parser_into_the_run_config():
    config = titan_job.load(["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "40",
                             "--training.seq_len", "64", "--optimizer.param_groups.0.optimizer_kwargs.lr", "1e-3",
                             "--training.max_norm", "0.5", "--lr_scheduler.decay_type", "cosine"])
    fields, verdicts = titan_job.read(config)
    assert fields["steps"] == 40 and fields["seq_len"] == 64 and fields["lr"] == 1e-3
    assert fields["max_norm"] == 0.5 and fields["lr_decay_type"] == "cosine" and fields["model"] == "debugmodel"
    (steps,) = [v for v in verdicts if v.path == "training.steps"]
    assert steps.honoured and steps.becomes == "steps = 40"


def test_the_torchft_config_maps_its_fault_tolerance_section():
    config = titan_job.load(["--module", "torchft.llama3", "--config", "llama3_torchft_debugmodel",
                             "--fault_tolerance.process_group", "gloo", "--fault_tolerance.group_size", "3"])
    fields, verdicts = titan_job.read(config)
    assert fields["replicas"] == 3 and fields["sync"] == "diloco" and fields["sync_every"] == 10
    assert fields["fragments"] == 2 and fields["backend"] == "gloo"
    with pytest.raises(titan_job.JobRefused, match="replicas: --replicas 2 and --fault_tolerance.group_size 3 disagree"):
        titan_job.run_config(["--module", "torchft.llama3", "--config", "llama3_torchft_debugmodel",
                              "--fault_tolerance.process_group", "gloo", "--fault_tolerance.group_size", "3"],
                             replicas=2)


def test_nccl_without_a_gpu_is_refused_by_name():
    config = titan_job.load(["--module", "torchft.llama3", "--config", "llama3_torchft_debugmodel"])
    _, verdicts = titan_job.read(config)
    (pg,) = [v for v in verdicts if v.path == "fault_tolerance.process_group"]
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: nccl is allowed")  # the tests' machines have none
    assert not pg.honoured and "--fault_tolerance.process_group gloo" in pg.becomes


def test_a_changed_model_leaf_is_refused_by_its_path():
    config = titan_job.load(["--module", "llama3", "--config", "llama3_debugmodel"])
    changed = copy.deepcopy(config)
    object.__setattr__(changed.model_spec.model, "dim", 512)
    _, verdicts = titan_job.read(changed)
    (dim,) = [v for v in verdicts if v.path == "model_spec.model.dim"]
    assert not dim.honoured and "differs from torchtitan's llama3 'debugmodel'" in dim.becomes
    qwen = titan_job.load(["--module", "qwen3", "--config", "qwen3_debugmodel"])
    (model,) = [v for v in titan_job.read(qwen)[1] if v.path == "model_spec"]
    assert model.honoured and model.becomes.startswith("model = 'qwen3/debugmodel'")
    changed = copy.deepcopy(qwen)
    object.__setattr__(changed.model_spec, "name", "gpt_oss")
    (model,) = [v for v in titan_job.read(changed)[1] if v.path == "model_spec"]
    assert not model.honoured and "'gpt_oss' does not run here" in model.becomes
    from torchtitan.models.qwen3 import model_registry

    moe = copy.deepcopy(qwen)
    object.__setattr__(moe, "model_spec", model_registry("debugmodel_moe"))
    (flavor,) = [v for v in titan_job.read(moe)[1] if v.path.startswith("model_spec")]
    assert not flavor.honoured and "mixture-of-experts" in flavor.becomes
    from monarch_nb.ft import RunConfig

    with pytest.raises(ValueError, match="model: qwen3/debugmodel_moe has mixture-of-experts layers"):
        RunConfig(model="qwen3/debugmodel_moe").validate()
    with pytest.raises(ValueError, match="model: 'gpt_oss' is not a torchtitan model monarch_nb trains"):
        RunConfig(model="gpt_oss/debugmodel").validate()


@pytest.mark.parametrize("args, expected", [
    (["--module", "llama9", "--config", "x"], "module: Cannot import module 'llama9'"),
    (["--module", "llama3", "--config", "llama3_nope"], "Available config functions: ["),
    (["--module", "llama3", "--config", "llama3_debugmodel", "--training.stepz", "4"],
     "Unrecognized options: --training.stepz"),
    (["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "forty"],
     "Error parsing --training.steps"),
    (["--config", "llama3_debugmodel"], "--module is required"),
], ids=["unknown-module", "unknown-function", "unknown-field", "wrong-type", "no-module"])
def test_bad_input_is_one_clear_line_and_exit_2(capsys, args, expected):
    assert cli(["check-job", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err[:500]


def test_check_job_prints_every_field_and_exits_1_on_a_refusal(capsys):
    assert cli(["check-job", "--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "40"]) == 0
    out = capsys.readouterr().out
    assert "  training.steps = 40  ->  steps = 40" in out and "0 refused" in out
    assert "  dataloader.dataset = 'c4_test'  ->  titan.dataset = 'c4_test' (torchtitan's HuggingFaceTextDataset)" in out
    assert "titan.activation_checkpoint = 'selective'" in out
    assert cli(["check-job", "--module", "llama3", "--config", "llama3_debugmodel", "--compile.enable"]) == 1
    out = capsys.readouterr().out
    assert "! compile.enable = True  ->  monarch_nb does not torch.compile" in out


def test_the_shipped_debug_configs_are_accepted_with_torchtitans_dataset_tokenizer_and_ac():
    """c4_test and ./tests/assets/tokenizer live in torchtitan's source tree, not its wheel: where
    they are missing, the tiny corpus (written in c4_test's layout) and tokenizer stand in."""
    config = titan_job.run_config(["--module", "llama3", "--config", "llama3_debugmodel"])
    assert config.titan.dataset == "c4_test" and config.titan.dataset_path is None
    assert config.titan.tokenizer_path is None and config.titan.activation_checkpoint == "selective"
    assert config.steps == 10 and config.seq_len == 2048 and config.batch_size == 8


def test_local_dataset_and_tokenizer_paths_are_used_and_a_missing_one_is_refused(tmp_path):
    from monarch_nb.ft.settings.tinydata import ensure_tinydata

    data = ensure_tinydata(tmp_path / "cache")
    config = titan_job.run_config(["--module", "llama3", "--config", "llama3_debugmodel",
                                   "--hf_assets_path", str(data), "--dataloader.dataset_path", str(data / "c4_test"),
                                   "activation-checkpoint:full"])
    assert config.titan.tokenizer_path == str(data) and config.titan.dataset_path == str(data / "c4_test")
    assert config.titan.activation_checkpoint == "full"
    with pytest.raises(titan_job.JobRefused, match=r"hf_assets_path = '/nowhere'.*no such file or folder here"):
        titan_job.run_config(["--module", "llama3", "--config", "llama3_debugmodel", "--hf_assets_path", "/nowhere"])
    with pytest.raises(titan_job.JobRefused, match=r"loads 'allenai/c4' from the hub.*--dataloader.dataset_path"):
        titan_job.run_config(["--module", "llama3", "--config", "llama3_debugmodel", "--dataloader.dataset", "c4"])


def _magic_args(line):
    from monarch_nb.notebook.args import MagicArgumentParser
    from monarch_nb.notebook.train_magics import add_training_commands

    parser = MagicArgumentParser(prog="%monarch")
    add_training_commands(parser.add_subparsers(dest="command"))
    return parser.parse_line(line)


def test_the_magic_takes_torchtitans_job_form_beside_its_own_flags():
    from monarch_nb.notebook.train_magics import config_from_args

    args = _magic_args("train --module llama3 --config llama3_debugmodel --training.steps 40 "
                       "--optimizer.param-groups.0.optimizer-kwargs.lr 1e-3 --replicas 2 --spares 1 --name keep")
    config = config_from_args(args)
    assert (config.steps, config.lr, config.replicas, config.spares, config.run_name) == (40, 1e-3, 2, 1, "keep")
    assert config.titan.dataset == "c4_test"
    with pytest.raises(ValueError, match=r"--steps \(give --training.steps\)"):
        config_from_args(_magic_args("train --module llama3 --config llama3_debugmodel --steps 5"))
    with pytest.raises(ValueError, match="--module llama3 needs --config FUNCTION"):
        config_from_args(_magic_args("train --module llama3"))
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="unrecognized arguments: --training.steps 3"):
        _magic_args("train --replicas 2 --training.steps 3")
    slow = config_from_args(_magic_args("train --replicas 3 --straggler drop --straggler-window 10"))
    assert (slow.straggler, slow.straggler_window, slow.straggler_factor) == ("drop", 10, 1.3)
    with pytest.raises(ValueError, match="straggler_factor: 0.9; allowed: above 1"):
        config_from_args(_magic_args("train --straggler-factor 0.9"))


def test_ftrun_takes_a_trainer_config_built_in_python(tmp_path):
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from monarch_nb.ft import FTRun

    trainer = llama3_debugmodel()
    trainer.training.steps = 7
    run = FTRun(trainer, replicas=2, runs_root=str(tmp_path))
    assert run.config.steps == 7 and run.config.replicas == 2 and run.config.titan.activation_checkpoint == "selective"
    trainer.compile.enable = True
    with pytest.raises(titan_job.JobRefused, match="compile.enable = True"):
        FTRun(trainer, runs_root=str(tmp_path))


def test_registry_shapes_used_here_hold(shipped):
    """The rule table leans on these shapes of torchtitan 0.3's configs (an upgrade fails here)."""
    assert dataclasses.is_dataclass(shipped) and hasattr(shipped, "model_spec")
    assert shipped.model_spec.flavor == "debugmodel" and shipped.model_spec.name.endswith(("llama3", "qwen3"))


def test_convert_job_prints_both_forms_and_each_gives_the_tomls_run(capsys, tmp_path, monkeypatch):
    """The legacy TOML example in torchtitan 0.3's form: the shell line through %monarch train's own
    parser, and the Python registry function executed (FTRun recording what it was given), each give
    the TOML's RunConfig (the data reader and activation checkpointing aside, by design)."""
    import monarch_nb.ft
    from monarch_nb.ft import RunConfig
    from monarch_nb.ft.settings.job_convert import DATA_FIELDS, DEFAULT_RUNS
    from monarch_nb.notebook.train_magics import config_from_args

    toml = "examples/llama3_debug_ft.toml"
    assert cli(["convert-job", toml]) == 0
    out = capsys.readouterr().out
    old = RunConfig.from_toml(toml)
    old = old.replace(runs_root=old.runs_root or DEFAULT_RUNS)
    (shell,) = [ln for ln in out.splitlines() if ln.startswith("monarch-nb train ")]
    from_shell = config_from_args(_magic_args("train " + shell.removeprefix("monarch-nb train ")))
    started = []

    class Recorder:
        def __init__(self, config, **overrides):
            started.append(titan_job.run_config_of(config, **overrides))

        def start(self):
            return self

    monkeypatch.setattr(monarch_nb.ft, "FTRun", Recorder)
    exec(out[out.index("from torchtitan"):], {})
    for new in (from_shell, *started):
        differ = [f.name for f in dataclasses.fields(old)
                  if f.name not in DATA_FIELDS and getattr(old, f.name) != getattr(new, f.name)]
        assert not differ, differ
    assert len(started) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nname = "llama3"\nflavor = "tiny"\n')
    assert cli(["convert-job", str(bad)]) == 1
    assert "model 'tiny'" in capsys.readouterr().err


def test_the_field_tables_in_the_readme_and_docs_are_generated_from_the_rules():
    """README.md's per-section table and docs/torchtitan_jobs.md's table of every leaf are what
    scripts/titan_fields.py writes from the rules today (a rule changed without them fails here)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "titan_fields.py"
    spec = importlib.util.spec_from_file_location("titan_fields", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.verdicts()
    assert "training.steps" in rows and rows["training.steps"][1]
    readme = (path.parent.parent / "README.md").read_text()
    docs = (path.parent.parent / "docs" / "torchtitan_jobs.md").read_text()
    assert module.readme_table(rows) in readme and module.doc_table(rows) in docs, \
        "stale: run .venv/bin/python scripts/titan_fields.py"


def test_a_users_own_registry_module_next_to_the_notebook_resolves(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_jobs_51.py").write_text(
        "from torchtitan.models.llama3.config_registry import llama3_debugmodel\n\n\n"
        "def tiny_job():\n    config = llama3_debugmodel()\n    config.training.steps = 7\n    return config\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert cli(["check-job", "--module", "my_jobs_51", "--config", "tiny_job"]) == 0
    assert "  training.steps = 7  ->  steps = 7" in capsys.readouterr().out
    assert cli(["check-job", "--module", "my_jobs_51", "--config", "nope"]) == 2
    assert "Available config functions: ['llama3_debugmodel', 'tiny_job']" in capsys.readouterr().err


def test_help_lists_torchtitans_fields_from_check_job_and_from_train(capsys):
    assert cli(["check-job", "--module", "llama3", "--config", "llama3_debugmodel", "--help"]) == 0
    assert "--training.steps" in capsys.readouterr().out
    assert cli(["train", "--module", "llama3", "--config", "llama3_debugmodel", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--replicas" in out and "--training.steps" in out  # ours, then torchtitan's
