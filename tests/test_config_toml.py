"""RunConfig from a torchtitan-style TOML job file, its documentation, and the model flavours
between torchtitan's debug model and 1B."""

from __future__ import annotations

import dataclasses
import pydoc
import textwrap
from pathlib import Path

import pytest

from monarch_nb.ft import RespawnBackoff, RunConfig
from monarch_nb.ft.settings.config import MODELS
from monarch_nb.ft.settings.jobfile import SECTIONS, describe_sections

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama3_debug_ft.toml"


def job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text))
    return path


# ---- the shipped example --------------------------------------------------------------------


def test_the_shipped_example_loads_into_a_valid_config():
    cfg = RunConfig.from_toml(EXAMPLE)
    assert (cfg.model, cfg.replicas, cfg.group_size, cfg.min_replicas) == ("debugmodel", 3, 1, 1)
    assert (cfg.steps, cfg.seq_len, cfg.batch_size, cfg.lr, cfg.warmup_steps) == (200, 64, 2, 8e-4, 2)
    assert cfg.pg_timeout_s == 10.0 and cfg.hang_timeout_s == 5.0
    assert cfg.checkpoint_every is None and cfg.checkpoint_dir == "checkpoint" and cfg.checkpoint_keep == 3
    assert cfg.respawn.max_respawns == 10


def test_keyword_overrides_replace_what_the_file_says():
    cfg = RunConfig.from_toml(EXAMPLE, steps=50, model="small", replicas=2)
    assert (cfg.steps, cfg.model, cfg.replicas, cfg.seq_len) == (50, "small", 2, 64)
    with pytest.raises(ValueError, match="^bogus: unknown config field"):
        RunConfig.from_toml(EXAMPLE, bogus=1)


# ---- the mapping ----------------------------------------------------------------------------


def test_every_supported_torchtitan_key_lands_on_its_runconfig_field(tmp_path):
    path = job_file(tmp_path, """
        [job]
        description = "x"
        dump_folder = "/tmp/outs"
        [model]
        name = "llama3"
        flavor = "small"
        [optimizer]
        name = "AdamW"
        lr = 3e-4
        [lr_scheduler]
        warmup_steps = 7
        [training]
        local_batch_size = 4
        seq_len = 128
        steps = 30
        [parallelism]
        data_parallel_shard_degree = 2
        [fault_tolerance]
        enable = true
        group_size = 4
        replica_id = 0
        min_replica_size = 2
        process_group = "gloo"
        process_group_timeout_ms = 2500
        [checkpoint]
        enable = true
        interval = 10
        folder = "ckpt"
        keep_latest_k = 2
        [monarch_nb]
        spares = 1
        partition = "debug"
        job = "slurm"
        hang_timeout_s = 8
        env = { FOO = "bar" }
        [monarch_nb.respawn]
        max_respawns = 4
        backoff_s = 0.5
    """)
    cfg = RunConfig.from_toml(path)
    assert cfg.runs_root == "/tmp/outs" and cfg.model == "small" and cfg.lr == 3e-4 and cfg.warmup_steps == 7
    assert (cfg.batch_size, cfg.seq_len, cfg.steps, cfg.group_size) == (4, 128, 30, 2)
    assert (cfg.replicas, cfg.min_replicas, cfg.backend, cfg.pg_timeout_s) == (4, 2, "gloo", 2.5)
    assert (cfg.checkpoint_every, cfg.checkpoint_dir, cfg.checkpoint_keep) == (10, "ckpt", 2)
    assert (cfg.spares, cfg.partition, cfg.job) == (1, "debug", "slurm")
    assert cfg.hang_timeout_s == 8.0 and cfg.env == {"FOO": "bar"}
    assert cfg.respawn == dataclasses.replace(RespawnBackoff(), max_respawns=4, backoff_s=0.5)


def test_older_torchtitan_names_and_defaults(tmp_path):
    cfg = RunConfig.from_toml(job_file(tmp_path, """
        [training]
        batch_size = 3
        [parallelism]
        data_parallel_shard_degree = -1
        [checkpoint]
        enable_checkpoint = true
    """))
    assert cfg.batch_size == 3 and cfg.group_size == 1  # -1: "all the group's processes" = the default
    assert cfg.checkpoint_every == 500  # torchtitan's default interval
    off = RunConfig.from_toml(job_file(tmp_path, "[checkpoint]\nenable = false\ninterval = 10\n"))
    assert off.checkpoint_every is None


def test_a_file_that_says_recovery_means_on_failure(tmp_path):
    """``recovery`` was on_failure's name: an old job file still loads; one that gives both names,
    differently, is refused naming both keys, which to keep and the file."""
    path = job_file(tmp_path, "[monarch_nb]\nrecovery = \"restart\"\n")
    assert RunConfig.from_toml(path).on_failure == "restart"
    assert RunConfig.from_toml(path, on_failure="peer").on_failure == "peer"  # an override replaces it
    both = job_file(tmp_path, "[monarch_nb]\non_failure = \"peer\"\nrecovery = \"restart\"\n")
    with pytest.raises(ValueError) as err:
        RunConfig.from_toml(both)
    assert str(err.value) == (f"on_failure: [monarch_nb] on_failure = 'peer' and [monarch_nb] recovery = 'restart' "
                              f"(its older name) differ; keep only [monarch_nb] on_failure ({both})")
    bad = job_file(tmp_path, "[monarch_nb]\nrecovery = \"torchrun\"\n")
    with pytest.raises(ValueError, match=r"^\[monarch_nb\] recovery: unknown value 'torchrun'.*RunConfig\.on_failure"):
        RunConfig.from_toml(bad)


def test_an_empty_file_is_the_default_config(tmp_path):
    assert RunConfig.from_toml(job_file(tmp_path, "")) == RunConfig()


@pytest.mark.parametrize("text, expected", [
    ("[profiling]\nenable_profiling = false\n", "[profiling]: unknown section; supported sections: [job], [model]"),
    ("[training]\nfoo = 1\n", "[training] foo: unknown key; supported keys in [training]: local_batch_size, "
                              "batch_size, seq_len, steps"),
    ("[optimizer]\neps = 1e-8\n", "[optimizer] eps: unknown key; supported keys in [optimizer]: name, lr"),
    ("[monarch_nb]\nreplica = 2\n", "[monarch_nb] replica: unknown key; [monarch_nb] takes RunConfig fields: replicas"),
    ("replicas = 2\n", "replicas: a key outside any section; put it in one, e.g. [monarch_nb] replicas"),
    ("[training]\nsteps = \"ten\"\n", "[training] steps: expected an integer, got 'ten' (a string)"),
    ("[training]\nsteps = 10.0\n", "[training] steps: expected an integer, got 10.0 (a number)"),
    ("[optimizer]\nlr = true\n", "[optimizer] lr: expected a number, got True (true/false)"),
    ("[monarch_nb]\ncheck_identical = 1\n", "[monarch_nb] check_identical: expected true or false, got 1"),
    ("[monarch_nb]\nenv = { A = 1 }\n", "[monarch_nb] env.A: expected a string, got 1 (an integer)"),
    ("[monarch_nb.respawn]\nretries = 1\n", "[monarch_nb] respawn.retries: unknown key; allowed keys: max_respawns"),
    ("[model]\nname = \"deepseek_v3\"\n", "[model] name: 'deepseek_v3' is not supported; monarch_nb trains"),
    ("[optimizer]\nname = \"Muon\"\n", "[optimizer] name: 'Muon' is not supported; monarch_nb trains with AdamW"),
    ("[fault_tolerance]\nenable = false\n", "[fault_tolerance] enable: False is not supported; monarch_nb always"),
    ("[checkpoint]\nkeep_latest_k = 0\n", "[checkpoint] keep_latest_k: 0 is not supported (torchtitan's 0 means"),
    ("[checkpoint]\nenable = true\ninterval = 0\n", "[checkpoint] interval: must be >= 1 step, got 0"),
    ("[training]\nsteps = 5\n[monarch_nb]\nsteps = 6\n",
     "[monarch_nb] steps: sets steps, which [training] steps already set; keep one"),
    ("[training]\nbatch_size = 2\nlocal_batch_size = 2\n",
     "[training] local_batch_size: sets batch_size, which [training] batch_size already set"),
    ("[training]\nseq_len = 4\n", "[training] seq_len: must be an integer >= 8, got 4 (RunConfig.seq_len;"),
    ("[model]\nflavor = \"2B\"\n", "[model] flavor: unknown value '2B'; allowed values: tiny, debugmodel, debug4x, small, medium, 1B"),
    ("[fault_tolerance]\ngroup_size = 2\nmin_replica_size = 3\n",
     "[fault_tolerance] min_replica_size: 3 exceeds replicas (2)"),
    ("[monarch_nb.respawn]\nmax_respawns = -1\n", "[monarch_nb] respawn.max_respawns: must be an integer >= 0"),
    ("[training\nsteps = 1\n", "not valid TOML"),
])
def test_errors_name_the_section_and_key_and_what_is_allowed(tmp_path, text, expected):
    path = job_file(tmp_path, text)
    with pytest.raises(ValueError) as err:
        RunConfig.from_toml(path)
    assert expected in str(err.value), err.value
    assert str(path) in str(err.value)  # which file


def test_a_missing_file_names_every_place_looked_and_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    with pytest.raises(ValueError) as err:
        RunConfig.from_toml("examples/nosuch.toml")
    message = str(err.value)
    assert message.startswith("config: examples/nosuch.toml not found; looked in ")
    assert str(tmp_path / "notebooks" / "examples" / "nosuch.toml") in message
    assert str(tmp_path / "examples" / "nosuch.toml") in message
    assert f"the working directory is {tmp_path / 'notebooks'}" in message


def test_a_relative_job_file_is_found_from_the_notebooks_folder_as_the_readme_writes_it(monkeypatch):
    monkeypatch.chdir(REPO / "notebooks")  # JupyterLab's root and the executor's working directory
    config = RunConfig.from_toml("examples/llama3_debug_ft.toml")
    assert config.replicas == 3 and config.model == "debugmodel"


def test_an_override_fixes_what_the_file_got_wrong_and_is_named_as_a_field(tmp_path):
    path = job_file(tmp_path, "[training]\nseq_len = 4\n")
    assert RunConfig.from_toml(path, seq_len=16).seq_len == 16
    with pytest.raises(ValueError, match=r"^seq_len: must be an integer >= 8, got 2$"):
        RunConfig.from_toml(path, seq_len=2)


def test_the_mapping_table_covers_every_section_and_names_real_fields():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(SECTIONS) == {"job", "model", "optimizer", "lr_scheduler", "training", "parallelism",
                             "fault_tolerance", "checkpoint"}
    for key, field, _ in describe_sections():
        assert field == "-" or field in fields, key


# ---- checkpoint fields: validated, no behaviour yet --------------------------------------------


@pytest.mark.parametrize("changes, message", [
    ({"checkpoint_every": 0}, "checkpoint_every: must be an integer >= 1, got 0"),
    ({"checkpoint_every": 2.5}, "checkpoint_every: must be an integer >= 1"),
    ({"checkpoint_keep": 0}, "checkpoint_keep: must be an integer >= 1, got 0"),
    ({"checkpoint_dir": ""}, "checkpoint_dir: must be a directory path"),
])
def test_checkpoint_fields_are_validated(changes, message):
    with pytest.raises(ValueError) as err:
        RunConfig(**changes).validate()
    assert str(err.value).startswith(message)
    assert RunConfig(checkpoint_every=100, checkpoint_dir="/tmp/c", checkpoint_keep=1).validate()


# ---- help(RunConfig) ------------------------------------------------------------------------


def test_help_documents_every_field_in_groups():
    text = pydoc.render_doc(RunConfig, renderer=pydoc.plaintext)
    for f in dataclasses.fields(RunConfig):
        assert f"{f.name}:" in RunConfig.__doc__, f"RunConfig's docstring does not document {f.name}"
    for group in ("Topology:", "SLURM:", "Warm spares:", "Model and train step", "Platform:", "torchft timing",
                  "Durable checkpoints", "Controller"):
        assert group in text


# ---- model flavours -------------------------------------------------------------------------


def test_flavours_between_tiny_and_1B_have_the_advertised_sizes():
    from monarch_nb.ft.settings.flavors import parameter_count

    assert MODELS[:6] == ("tiny", "debugmodel", "debug4x", "small", "medium", "1B")
    counts = {name: parameter_count(name) for name in ("tiny", "debugmodel", "debug4x", "small", "medium")}  # meta device
    assert counts["tiny"] == 385_344 and counts["tiny"] < counts["debugmodel"]
    assert counts["debugmodel"] == 6_163_712
    assert counts["small"] == 103_834_368 and counts["medium"] == 408_995_328
    assert counts["debugmodel"] < counts["debug4x"] < counts["small"]


def test_our_assembly_of_the_debugmodel_numbers_is_torchtitans_debugmodel_bit_for_bit():
    """The small/medium flavours are built by the same code path; this pins it to torchtitan's."""
    import torch

    from monarch_nb.ft.settings.flavors import DEBUGMODEL, assemble, model_config

    def weights(cfg):
        torch.manual_seed(0)
        with torch.device("meta"):
            model = cfg.build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_states(buffer_device=None)
        return model.state_dict()

    theirs, ours = weights(model_config("debugmodel")), weights(assemble(DEBUGMODEL))
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_the_small_flavour_builds_in_a_trainer_and_takes_two_steps_on_cpu():
    """~8 s and ~2.7 GB here: ReplicaTrainer's RankParts builds "small" (104M), then two
    plain optimizer steps on the tiny corpus lower the loss."""
    import torch

    from monarch_nb.ft.worker.replica_trainer import ReplicaTrainer
    from monarch_nb.ft.settings.tinydata import ensure_tinydata

    trainer = ReplicaTrainer({"model": "small", "platform": "cpu", "threads_per_proc": 2, "steps": 10},
                             replica=None, rank=0, group_size=1, lighthouse=None, store_port=None,
                             data_dir=str(ensure_tinydata()), emit=lambda e: None)
    parts = trainer.parts
    assert sum(p.numel() for p in parts.model.parameters()) == 103_834_368
    losses = []
    for step in (1, 1):  # the same batch twice: the second loss must be lower
        inputs, labels = parts.batch(step, replica=0)
        parts.optimizers.zero_grad()
        loss, _ = parts.loss_fn(parts.model(inputs), labels, torch.tensor(labels.numel()))
        loss.backward()
        parts.optimizers.step()
        parts.lr_schedulers.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[1] < losses[0]
