"""``monarch-nb convert-job OLD.toml``: a legacy TOML job (torchtitan up to 0.2) in torchtitan 0.3's form.

It prints a config-registry function (Python: torchtitan's debug config with the job's changes)
and the same job as ``monarch-nb train`` flags. Both are checked before they are printed: the
converted job, read back through torchtitan's ConfigManager and ``titan_job``, must give the
RunConfig the TOML gives, field by field, except for how the data is read (the TOML form reads
the tiny corpus with monarch_nb's reader; the 0.3 form reads the same documents through
torchtitan's c4_test reader) and the activation checkpointing the registry's config adds (turned
off here, as the TOML ran). What cannot be said in the 0.3 form is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# RunConfig field -> torchtitan's flag (as ConfigManager takes it) and how its value is written
TITAN_FLAGS: dict[str, tuple[str, Any]] = {
    "steps": ("--training.steps", int),
    "seq_len": ("--training.seq_len", int),
    "batch_size": ("--training.local_batch_size", int),
    "lr": ("--optimizer.param_groups.0.optimizer_kwargs.lr", float),
    "max_norm": ("--training.max_norm", float),
    "warmup_steps": ("--lr_scheduler.warmup_steps", int),
    "lr_decay_ratio": ("--lr_scheduler.decay_ratio", float),
    "lr_decay_type": ("--lr_scheduler.decay_type", str),
    "lr_min_factor": ("--lr_scheduler.min_lr_factor", float),
    "runs_root": ("--dump_folder", str),
    "group_size": ("--parallelism.data_parallel_shard_degree", int),
    "min_replicas": ("--fault_tolerance.min_replica_size", int),
    "backend": ("--fault_tolerance.process_group", str),
    "pg_timeout_s": ("--fault_tolerance.process_group_timeout_ms", lambda s: int(round(s * 1000))),
    "sync": ("--fault_tolerance.semi_sync_method", str),
    "sync_every": ("--fault_tolerance.sync_steps", int),
    "fragments": ("--fault_tolerance.num_fragments", int),
    "checkpoint_keep": ("--checkpoint.keep_latest_k", int),
    "seed": ("--debug.seed", int),
}
# RunConfig field -> the `monarch-nb train` / `%monarch train` flag of monarch_nb's own settings
OWN_FLAGS = {"replicas": "--replicas", "spares": "--spares", "job": "--job", "partition": "--partition",
             "time_limit": "--time", "platform": "--platform", "run_name": "--name",
             "checkpoint_dir": "--checkpoint-dir", "on_failure": "--on-failure", "lowest_rung": "--lowest-rung",
             "quorum": "--quorum", "resume_from": "--resume-from"}
DEFAULT_RUNS = "./runs"  # where a TOML job without dump_folder writes (when $MONARCH_NB_RUNS is unset)
# what the two forms read differently by design (see the module's docstring)
DATA_FIELDS = ("titan", "data_dir")


def convert(path: str) -> tuple[int, str]:
    """(exit code, text): 0 and both forms; 1 when the job has a setting the 0.3 form cannot say;
    2 when the TOML itself is refused."""
    from .config import RunConfig

    try:
        old = RunConfig.from_toml(path)
    except ValueError as exc:
        return 2, f"monarch-nb convert-job: {exc}"
    if old.model != "debugmodel":
        return 1, (f"monarch-nb convert-job: model {old.model!r}: torchtitan 0.3's registry has no config for it "
                   "that runs here (its llama3 configs beyond debugmodel read hub weights and assets); keep the "
                   "TOML form, or train debugmodel")
    module, function = ("torchft.llama3", "llama3_torchft_debugmodel") if old.sync != "step" else \
        ("llama3", "llama3_debugmodel")
    job = ["--module", module, "--config", function]
    titan, own, extra = _overrides(old, job)
    try:
        mismatch = _check(old, job + titan, own, extra)
    except ValueError as exc:
        return 1, f"monarch-nb convert-job: the converted job was refused: {exc}"
    if mismatch:
        return 1, f"monarch-nb convert-job: the converted job would differ in {', '.join(mismatch)}"
    python = _python(module, function, titan, own, extra)
    head = [f"# {path} in torchtitan 0.3's job form (checked: it gives the same run settings)", ""]
    if extra:  # monarch_nb settings with no flag: only the Python form says them
        return 0, "\n".join(head + [f"# no command-line flag for {', '.join(extra)}: FTRun takes it in Python",
                                    python])
    shell = " ".join(["monarch-nb train", *job, *titan, *[f"{flag} {value}" for flag, value in own.items()]])
    return 0, "\n".join(head + ["# from a shell (or `%monarch train ...` in a notebook, without `monarch-nb`):",
                                shell, "", "# or as a config-registry function in your own module:", python])


def _overrides(old: Any, job: list[str]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """(torchtitan flags, our flags, fields neither form has a flag for) that turn the registry's
    config into ``old``."""
    from . import titan_job
    from .config import RunConfig

    base_fields, _ = titan_job.read(titan_job.load(job))
    base = {**dataclasses.asdict(RunConfig()), **base_fields}
    titan: list[str] = []
    if job[1] == "torchft.llama3":
        titan += ["--profiler.no-enable-profiling"]
    own: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for f in dataclasses.fields(old):
        value = getattr(old, f.name)
        if f.name == "runs_root" and value is None:  # the TOML's default; torchtitan's dump_folder is ./outputs
            value = DEFAULT_RUNS
        if f.name == "backend" and value is None and job[1] == "torchft.llama3":  # auto, where the config names one
            value = _auto_backend()  # (torchft's says nccl): what this machine picks
        if f.name in DATA_FIELDS or value == base.get(f.name):
            continue
        if f.name in TITAN_FLAGS:
            flag, write = TITAN_FLAGS[f.name]
            titan += [flag, str(write(value))]
            if f.name == "group_size" and value > 1:
                titan += ["--parallelism.spmd_backend", "partial_dtensor"]
        elif f.name == "checkpoint_every":
            titan += ["--checkpoint.enable", "--checkpoint.interval", str(value)] if value else \
                ["--checkpoint.no-enable"]
        elif f.name in OWN_FLAGS:
            own[OWN_FLAGS[f.name]] = value
        elif f.name == "respawn" and dataclasses.replace(value, max_respawns=RunConfig().respawn.max_respawns) \
                == RunConfig().respawn:
            own["--max-respawns"] = value.max_respawns
        else:
            extra[f.name] = value
    # the registry's config checkpoints activations (the TOML ran without); a tyro subcommand comes last
    return titan + ["activation-checkpoint:none"], own, extra


def _check(old: Any, argv: list[str], own: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    """The fields where the converted job's RunConfig differs from the TOML's."""
    from . import titan_job

    names = {flag: field for field, flag in OWN_FLAGS.items()}
    overrides = {names[flag]: value for flag, value in own.items() if flag in names}
    new = titan_job.run_config(argv, **overrides, **extra)
    if "--max-respawns" in own:
        new = new.replace(respawn=dataclasses.replace(new.respawn, max_respawns=own["--max-respawns"]))
    old = old.replace(runs_root=old.runs_root or DEFAULT_RUNS, backend=old.backend or new.backend)
    return [f.name for f in dataclasses.fields(old)
            if f.name not in DATA_FIELDS and getattr(old, f.name) != getattr(new, f.name)]


def _python(module: str, function: str, titan: list[str], own: dict[str, Any], extra: dict[str, Any]) -> str:
    """The registry function: torchtitan's debug config, then each override as an assignment."""
    registry = f"torchtitan.{'experiments.torchft.llama3' if module == 'torchft.llama3' else 'models.llama3'}"
    lines = [f"from {registry}.config_registry import {function}", "", "from monarch_nb.ft import FTRun", "", "",
             "def my_job():", f"    config = {function}()"]
    i = 0
    while i < len(titan):
        flag = titan[i]
        if flag == "activation-checkpoint:none":
            lines.append("    config.activation_checkpoint = None")
        elif flag.startswith("--") and ".no-" in flag:
            lines.append(f"    config.{flag[2:].replace('.no-', '.').replace('-', '_')} = False")
        elif flag in ("--checkpoint.enable",):
            lines.append("    config.checkpoint.enable = True")
        else:
            value = titan[i + 1]
            i += 1
            target = flag[2:].replace("param_groups.0.optimizer_kwargs.lr", "param_groups[0].optimizer_kwargs['lr']")
            literal = value if _is_number(value) else repr(value)
            lines.append(f"    config.{target} = {literal}")
        i += 1
    names = {flag: field for field, flag in OWN_FLAGS.items()}
    keywords = [f"{names[k]}={v!r}" for k, v in own.items() if k in names]
    if "--max-respawns" in own:
        lines[2] = "from monarch_nb.ft import FTRun, RespawnBackoff"
        keywords.append(f"respawn=RespawnBackoff(max_respawns={own['--max-respawns']!r})")
    keywords += [f"{k}={v!r}" for k, v in extra.items()]
    lines += ["    return config", "", "", f"run = FTRun(my_job(){''.join(', ' + k for k in keywords)}).start()"]
    return "\n".join(lines)


def _auto_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
