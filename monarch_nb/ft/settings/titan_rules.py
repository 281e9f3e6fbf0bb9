"""The rule for each leaf of a torchtitan 0.3 config: what it sets in a RunConfig, or why it is refused.

A rule takes (the leaf's value, the whole config) and returns (the RunConfig fields it sets - keys
``titan.X`` go to :class:`~.titan_parts.TitanParts` - and what it became, one phrase), or raises
:class:`Refuse` saying what monarch_nb supports. :data:`RULES` names leaves; :func:`section_rule`
covers whole sections (activation checkpointing, features that are off). ``titan_job`` walks the
tree with them.
"""

from __future__ import annotations

from typing import Any, Callable

TITAN_DUMP_FOLDER = "./outputs"  # torchtitan's default dump_folder
Rule = Callable[[Any, Any], "tuple[dict[str, Any], str]"]


class Refuse(Exception):
    """The leaf's value is one monarch_nb cannot apply; the message says what it supports."""


def field(name: str, convert: Callable[[Any], Any] = lambda v: v, doc: str = "") -> Rule:
    """The leaf sets RunConfig field ``name``."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        converted = convert(value)
        return {name: converted}, f"{name} = {converted!r}" + (f" ({doc})" if doc else "")
    return rule


def fixed(expected: Any, what: str) -> Rule:
    """monarch_nb does ``what``, which is this leaf at ``expected``; any other value is refused."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        if value == expected:
            return {}, f"as monarch_nb does it ({what})"
        raise Refuse(f"monarch_nb {what}; supported: {expected!r}")
    return rule


def part_of(switch: str, where: str = "") -> Rule:
    """A setting the leaf ``switch`` reads as a whole when it is on (its rule applies them together)."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        return ({}, f"with {switch}{where}") if get_path(config, switch) else ({}, f"unused: {switch} is off")
    return rule


def when_off(flag: str, what: str) -> Rule:
    """A setting of a feature monarch_nb does not have: any value while ``flag`` is off."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        if not get_path(config, flag):
            return {}, f"unused: {flag} is off"
        raise Refuse(f"{flag} is on and monarch_nb {what}")
    return rule


def _lr(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    groups = list(value or [])
    if len(groups) != 1 or groups[0].pattern != ".*" or groups[0].optimizer_name != "AdamW":
        raise Refuse("monarch_nb trains every parameter with one AdamW group (default_adamw(lr=...)); "
                      f"got {len(groups)} group(s)")
    kwargs = dict(groups[0].optimizer_kwargs)
    lr = kwargs.pop("lr", None)
    defaults = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    odd = {k: v for k, v in kwargs.items() if k not in defaults or _norm(v) != _norm(defaults[k])}
    if lr is None or odd:
        raise Refuse(f"monarch_nb's AdamW takes lr only (betas {defaults['betas']}, eps {defaults['eps']}, "
                      f"weight_decay {defaults['weight_decay']}); got {dict(groups[0].optimizer_kwargs)}")
    return {"lr": float(lr)}, f"lr = {float(lr)!r} (one AdamW group)"


def _accumulation(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    """torchtitan's global batch: local batch x the group's data-parallel ranks x accumulation steps."""
    if value == -1:
        return {}, "no gradient accumulation (global = local x data-parallel)"
    shard = get_path(config, "parallelism.data_parallel_shard_degree")
    per_step = config.training.local_batch_size * (shard if shard > 0 else 1)
    if not isinstance(value, int) or value < per_step or value % per_step:
        raise Refuse(f"global_batch_size must be a multiple of local_batch_size x data-parallel ranks ({per_step}), "
                      "or -1")
    return ({"titan.grad_accumulation": value // per_step},
            f"titan.grad_accumulation = {value // per_step} (microbatches of {config.training.local_batch_size})")


def _param_groups(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    """torchtitan's param groups, built by its OptimizersContainer in the workers (Adam or AdamW)."""
    groups = list(value or [])
    if [(g.pattern, g.optimizer_name) for g in groups] == [(".*", "AdamW")] and "lr" in groups[0].optimizer_kwargs:
        try:
            return _lr(value, config)  # the common case: one AdamW group, as a RunConfig's lr
        except Refuse:
            pass
    odd = sorted({g.optimizer_name for g in groups} - {"Adam", "AdamW"})
    if not groups or odd:
        raise Refuse(f"monarch_nb builds torchtitan's Adam and AdamW param groups; got {odd or 'none'}")
    if any("lr" not in g.optimizer_kwargs for g in groups):
        raise Refuse("every param group needs its lr (optimizer_kwargs.lr)")
    _patterns_match(groups, config)
    plain = tuple({"pattern": g.pattern, "optimizer_name": g.optimizer_name,
                   "optimizer_kwargs": {k: list(v) if isinstance(v, tuple) else v
                                        for k, v in g.optimizer_kwargs.items()}} for g in groups)
    return ({"titan.param_groups": plain, "lr": float(groups[0].optimizer_kwargs["lr"])},
            f"titan.param_groups = {len(groups)} group(s) ({', '.join(g.pattern for g in groups)}), built by "
            "torchtitan's OptimizersContainer")


def _patterns_match(groups: list[Any], config: Any) -> None:
    """Each group's pattern must claim a parameter (first match wins), as torchtitan checks in the workers."""
    import re

    import torch

    with torch.device("meta"):
        names = [n for n, _ in config.model_spec.model.build().named_parameters()]
    claimed: set[str] = set()
    for g in groups:
        mine = {n for n in names if n not in claimed and re.search(g.pattern, n)}
        if not mine:
            raise Refuse(f"param group pattern {g.pattern!r} matches no parameter the earlier groups left "
                          f"(e.g. {names[0]})")
        claimed |= mine
    if len(claimed) < len(names):
        raise Refuse(f"{len(names) - len(claimed)} parameter(s) match no param group "
                      f"(e.g. {sorted(set(names) - claimed)[0]}): end with a catch-all '.*' group")


def _profiler(config: Any) -> tuple[dict[str, Any], str]:
    p = config.profiler
    if p.profile_freq < p.profiler_active + p.profiler_warmup:
        raise Refuse("profile_freq must be at least profiler_warmup + profiler_active (torchtitan's schedule)")
    sets = {"titan.profile_freq": p.profile_freq, "titan.profile_active": p.profiler_active,
            "titan.profile_warmup": p.profiler_warmup, "titan.profile_folder": p.save_traces_folder}
    return sets, (f"torch's profiler every {p.profile_freq} steps ({p.profiler_warmup} warmup, {p.profiler_active} "
                  f"active), chrome traces in <run>/{p.save_traces_folder}/iteration_N/")


def _validator(config: Any) -> tuple[dict[str, Any], str]:
    """torchtitan's validator: each group's held-out loss every ``freq`` steps, over ``steps`` batches."""
    from pathlib import Path

    from torchtitan.hf_datasets.text_datasets import DATASETS

    v = config.validator
    if v.freq < 1 or (v.steps < 1 and v.steps != -1):
        raise Refuse("validator.freq must be >= 1 and validator.steps >= 1 or -1 (one pass)")
    name, path = v.dataloader.dataset, v.dataloader.dataset_path
    sets: dict[str, Any] = {"titan.validate_every": v.freq, "titan.validate_steps": v.steps}
    what = f"held-out loss every {v.freq} steps over {'one pass' if v.steps == -1 else f'{v.steps} batches'}"
    if name not in DATASETS:
        raise Refuse(f"monarch_nb validates on torchtitan's text datasets; {name!r} is not one: {', '.join(DATASETS)}")
    if path is not None:
        local, _ = _local_dir(path, "titan.validation_path", "--validator.dataloader.dataset_path")
        return {**sets, **local, "titan.validation_dataset": name}, f"{what} of {name} at {path}"
    if name == "c4_test" and Path(DATASETS[name].path).is_dir():
        return ({**sets, "titan.validation_dataset": name,
                 "titan.validation_path": str(Path(DATASETS[name].path).resolve())}, f"{what} of c4_test")
    if name in ("c4_validation", "c4_test"):
        where = "allenai/c4 on the hub" if name != "c4_test" else "in torchtitan's source tree"
        return sets, f"{what} of the tiny held-out corpus, in c4_test's layout ({name} is {where}; no hub here)"
    raise Refuse(f"validation dataset {name!r} loads {DATASETS[name].path!r} from the hub; monarch_nb reads local "
                 "files only: give --validator.dataloader.dataset_path with a local copy")


def _dump_folder(value: Any) -> tuple[dict[str, Any], str]:
    """Where run directories go; torchtitan's default gives way to $MONARCH_NB_RUNS where that is set."""
    import os

    if value == TITAN_DUMP_FOLDER and os.environ.get("MONARCH_NB_RUNS"):
        return {}, f"torchtitan's default; $MONARCH_NB_RUNS ({os.environ['MONARCH_NB_RUNS']}) is set and wins"
    return {"runs_root": value}, f"runs_root = {value!r} (where run directories go)"


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _process_group(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    if value == "nccl":
        try:
            import torch

            if not torch.cuda.is_available():
                raise Refuse("'nccl' needs GPUs and this machine has none; pass --fault_tolerance.process_group gloo")
        except ImportError:
            pass
    return field("backend")(value, config)


RULES: dict[str, Rule] = {
    "training.steps": field("steps"),
    "training.seq_len": field("seq_len"),
    "training.local_batch_size": field("batch_size"),
    "training.global_batch_size": lambda v, c: _accumulation(v, c),
    "training.max_norm": field("max_norm"),
    "training.dtype": fixed("float32", "trains in float32"),
    "training.mixed_precision_param": fixed("bfloat16", "keeps torchtitan's FSDP default"),
    "training.mixed_precision_reduce": fixed("float32", "keeps torchtitan's FSDP default"),
    "training.enable_cpu_offload": fixed(False, "does not offload to CPU"),
    "training.disable_cuda_graphs": fixed(False, "keeps torchtitan's default"),
    "training.gc_freq": fixed(50, "keeps torchtitan's default"),
    "training.gc_debug": fixed(False, "keeps torchtitan's default"),
    "optimizer.param_groups": lambda v, c: _param_groups(v, c),
    "optimizer.implementation": fixed("fused", "lets torch pick the AdamW kernel"),
    "optimizer.optimizer_factory_kwargs_by_name": fixed({}, "builds torch's AdamW"),
    "lr_scheduler.warmup_steps": field("warmup_steps"),
    "lr_scheduler.total_steps": fixed(None, "decays over training.steps"),
    "lr_scheduler.decay_ratio": lambda v, c: field("lr_decay_ratio")(v, c) if v is not None
    else _refuse("decays over a fraction of the steps: give a decay_ratio from 0 to 1"),
    "lr_scheduler.decay_type": field("lr_decay_type"),
    "lr_scheduler.min_lr_factor": field("lr_min_factor"),
    "dump_folder": lambda v, c: _dump_folder(v),
    "hf_assets_path": lambda v, c: _tokenizer(v),
    "parallelism.data_parallel_shard_degree": lambda v, c: ({}, "group_size's default") if v == -1
    else field("group_size")(v, c),
    "parallelism.data_parallel_replicate_degree": fixed(1, "replicates across groups with torchft"),
    "parallelism.tensor_parallel_degree": fixed(1, "has no tensor parallelism"),
    "parallelism.pipeline_parallel_degree": fixed(1, "has no pipeline parallelism"),
    "parallelism.context_parallel_degree": fixed(1, "has no context parallelism"),
    "parallelism.expert_parallel_degree": fixed(1, "has no expert parallelism"),
    "fault_tolerance.enable": fixed(True, "always trains under torchft"),
    "fault_tolerance.group_size": lambda v, c: ({}, "replicas' default") if v == 0
    else field("replicas", doc="torchft's group_size is the number of replica groups")(v, c),
    "fault_tolerance.replica_id": lambda v, c: ({}, "unused: one monarch_nb job starts every group and "
                                                "numbers them 0..R-1 itself"),
    "fault_tolerance.min_replica_size": field("min_replicas"),
    "fault_tolerance.process_group": _process_group,
    "fault_tolerance.process_group_timeout_ms": field("pg_timeout_s", lambda v: v / 1000.0, "ms -> s"),
    "fault_tolerance.semi_sync_method": field("sync", lambda v: v or "step"),
    "fault_tolerance.sync_steps": field("sync_every"),
    "fault_tolerance.num_fragments": field("fragments"),
    "fault_tolerance.should_quantize": fixed(False, "does not quantize pseudo-gradients (Triton, GPU only)"),
    "fault_tolerance.fragment_sync_delay": fixed(0, "completes each fragment's sync in the step it starts (its "
                                                    "meeting bookkeeping and heals count on it)"),
    "fault_tolerance.fragment_update_alpha": lambda v, c: ({"titan.fragment_update_alpha": float(v)},
                                                           f"titan.fragment_update_alpha = {float(v)!r} (torchft's "
                                                           "DiLoCo mix of local and synced fragments)")
    if isinstance(v, (int, float)) and 0 <= v <= 1 else _refuse("takes a fragment_update_alpha from 0 to 1"),
    "fault_tolerance.module_fqns_per_model_fragment": fixed([], "splits fragments itself"),
    "checkpoint.enable": lambda v, c: ({}, "with checkpoint.interval: checkpoint_every") if v
    else ({"checkpoint_every": None}, "checkpoint_every = None (only the final checkpoint)"),
    "checkpoint.interval": lambda v, c: ({"checkpoint_every": v}, f"checkpoint_every = {v!r}")
    if c.checkpoint.enable else ({}, "unused: checkpoint.enable is off"),
    "checkpoint.folder": fixed("checkpoint", "keeps checkpoints in the run's directory (RunConfig.checkpoint_dir)"),
    "checkpoint.keep_latest_k": field("checkpoint_keep"),
    "checkpoint.initial_load_path": lambda v, c: ({}, "unused: no checkpoint to start from") if v is None
    else ({"resume_from": str(v)}, f"resume_from = {str(v)!r} (a monarch_nb checkpoint: weights, optimizer, step)"),
    "checkpoint.initial_load_model_only": lambda v, c: ({}, "unused: no initial_load_path")
    if c.checkpoint.initial_load_path is None else fixed(False, "starts from a checkpoint's whole state (weights, "
                                                        "optimizer, step); pass --checkpoint.no-initial-load-model-only")(v, c),
    "checkpoint.initial_load_in_hf": fixed(False, "loads its own (torch DCP) checkpoints, not HF weights"),
    "checkpoint.initial_load_in_hf_quantized": fixed(False, "loads its own (torch DCP) checkpoints, not HF weights"),
    "checkpoint.last_save_model_only": lambda v, c: (
        ({"titan.last_save_model_only": True}, "titan.last_save_model_only = True (the final save: weights only, "
                                               "in step-N-model)") if v and c.checkpoint.enable
        else ({}, "unused: checkpoint.enable is off" if v else "the final save holds the whole state")),
    "checkpoint.last_save_in_hf": fixed(False, "saves torch DCP checkpoints, not HF weights"),
    "checkpoint.export_dtype": fixed("float32", "saves in the training dtype"),
    "checkpoint.load_step": fixed(-1, "resumes from the newest complete checkpoint"),
    "checkpoint.exclude_from_loading": fixed([], "loads a checkpoint's whole state"),
    "checkpoint.enable_first_step_checkpoint": fixed(False, "saves every checkpoint.interval steps"),
    "checkpoint.create_seed_checkpoint": fixed(False, "seeds every replica's initial weights alike instead"),
    "checkpoint.load_only": fixed(False, "saves as it trains"),
    "checkpoint.async_mode": lambda v, c: ({}, f"as monarch_nb does it: every mode ({v!r} here) saves off the "
                                              "critical path, a copy then a background write")
    if v in ("disabled", "async", "async_with_pinned_mem") else _refuse("knows async modes disabled, async, "
                                                                        "async_with_pinned_mem"),
    "checkpoint.enable_ft_dataloader_checkpoints": lambda v, c: ({}, "unused: a batch is a pure function of "
                                                                     "(step, replica, rank), no loader state"),
    "metrics.log_freq": lambda v, c: ({}, f"as monarch_nb does it (every step's loss is in events.jsonl, every "
                                          f"{v}th among them)") if isinstance(v, int) and v >= 1
    else _refuse("logs every N >= 1 steps"),
    "metrics.enable_tensorboard": fixed(False, "writes its own event log, not TensorBoard"),
    "metrics.enable_wandb": fixed(False, "writes its own event log, not Weights & Biases"),
    "metrics.save_tb_folder": when_off("metrics.enable_tensorboard", "has no TensorBoard"),
    "metrics.save_for_all_ranks": when_off("metrics.enable_tensorboard", "has no TensorBoard"),
    "metrics.disable_color_printing": lambda v, c: ({}, "unused: monarch_nb does not print torchtitan's log"),
    "profiler.enable_profiling": lambda v, c: _profiler(c) if v else ({}, "no torch profiler (py-spy stacks: "
                                                                       "run.stacks())"),
    "profiler.profile_freq": part_of("profiler.enable_profiling"),
    "profiler.profiler_active": part_of("profiler.enable_profiling"),
    "profiler.profiler_warmup": part_of("profiler.enable_profiling"),
    "profiler.save_traces_folder": part_of("profiler.enable_profiling", ", under the run's directory"),
    "profiler.profiler_repeat": fixed(None, "profiles every profile_freq steps until the run ends"),
    "profiler.profiler_skip_first": fixed(None, "profiles from the first step"),
    "profiler.profiler_skip_first_wait": fixed(None, "profiles from the first step"),
    "profiler.trace_post_processor": fixed(None, "writes torch's chrome traces as they are"),
    "profiler.memory_snapshot_freq": when_off("profiler.enable_memory_snapshot", "takes no CUDA memory snapshots"),
    "profiler.save_memory_snapshot_folder": when_off("profiler.enable_memory_snapshot", "takes no CUDA memory "
                                                                                        "snapshots"),
    "profiler.memory_snapshot_max_entries": when_off("profiler.enable_memory_snapshot", "takes no CUDA memory "
                                                                                        "snapshots"),
    "profiler.enable_memory_snapshot": fixed(False, "takes no CUDA memory snapshots"),
    "compile.enable": fixed(False, "does not torch.compile"),
    "validator.enable": lambda v, c: _validator(c) if v else ({}, "no validator"),
    "validator.freq": part_of("validator.enable"),
    "validator.steps": part_of("validator.enable"),
    "validator.dataloader.dataset": part_of("validator.enable"),
    "validator.dataloader.dataset_path": part_of("validator.enable"),
    "validator.dataloader.num_workers": fixed(0, "loads validation batches in the training thread"),
    "validator.dataloader.persistent_workers": fixed(False, "loads validation batches in the training thread"),
    "validator.dataloader.pin_memory": fixed(False, "loads validation batches in the training thread"),
    "validator.dataloader.prefetch_factor": fixed(None, "loads validation batches in the training thread"),
    "validator.dataloader.infinite": fixed(False, "validates over the same batches each time"),
    "debug.seed": lambda v, c: field("seed")(v, c) if v is not None else ({}, "seed's default (0)"),
    "debug.deterministic": fixed(False, "keeps torch's default"),
    "debug.print_config": fixed(False, "prints the job with `monarch-nb check-job`"),
    "dataloader.dataset": lambda v, c: _dataset(v, get_path(c, "dataloader.dataset_path")),
    "dataloader.dataset_path": lambda v, c: ({}, "unused: torchtitan's own path for the dataset") if v is None
    else _local_dir(v, "titan.dataset_path", "--dataloader.dataset_path"),
    "dataloader.num_workers": fixed(0, "loads batches in the training thread"),
    "dataloader.persistent_workers": fixed(False, "loads batches in the training thread"),
    "dataloader.pin_memory": fixed(False, "loads batches in the training thread"),
    "dataloader.prefetch_factor": fixed(None, "loads batches in the training thread"),
    "dataloader.infinite": fixed(True, "samples its corpus without end"),
    "parallelism.fsdp_reshard_after_forward": fixed("default", "keeps torchtitan's FSDP default"),
    "parallelism.enable_fsdp_symm_mem": fixed(False, "keeps torchtitan's FSDP default"),
    "parallelism.spmd_backend": lambda v, c: ({}, "unused: one process per group, no FSDP")
    if get_path(c, "parallelism.data_parallel_shard_degree") in (-1, 1)
    else fixed("partial_dtensor", "shards groups with FSDP on partial_dtensor (pass --parallelism.spmd_backend "
               "partial_dtensor)")(v, c),
    "comm.init_timeout_seconds": fixed(300, "keeps torch's process-group init timeout"),
    "comm.train_timeout_seconds": lambda v, c: ({}, "unused: one process per group, no in-group collectives")
    if get_path(c, "parallelism.data_parallel_shard_degree") in (-1, 1)
    else ({"titan.collective_timeout_s": float(v)}, f"titan.collective_timeout_s = {float(v)!r} (the group's FSDP "
                                                      "process group)"),
    "comm.mode": fixed("default", "runs real collectives"),
    "debug.spmd_typechecking": fixed(False, "keeps torchtitan's default"),
    "debug.deterministic_warn_only": fixed(False, "keeps torch's default"),
    "debug.detect_anomaly": fixed(False, "keeps torch's default"),
    "debug.batch_invariant": fixed(False, "keeps torch's default"),
    "debug.save_config_file": fixed(None, "records the run's config in its events.jsonl"),
    "debug.moe_force_load_balance": lambda v, c: ({}, "unused: the models trained here have no experts"),
    "debug.enable_structured_logging": lambda v, c: ({}, "unused: monarch_nb records events.jsonl, not "
                                                     "torchtitan's log"),
    "override.imports": fixed([], "imports nothing more into the workers"),
    "activation_checkpoint": lambda v, c: ({}, "no activation checkpointing") if v is None
    else _refuse("applies activation checkpointing it can read: selective or full"),
    "loss.num_chunks": lambda v, c: ({}, "as monarch_nb does it (the same loss, computed in one piece)"),
    "loss.loss_fn.global_vocab_size": lambda v, c: _vocab(v, c),
    "loss.global_vocab_size": lambda v, c: _vocab(v, c),
}

# Whole sections of features monarch_nb does not have, whatever their values.
UNUSED_SECTIONS: dict[str, str] = {
    "parallelism.pipeline_parallel_": "unused: no pipeline parallelism (pipeline_parallel_degree 1)",
    "parallelism.module_fqns_per_model_part": "unused: no pipeline parallelism (pipeline_parallel_degree 1)",
    "parallelism.context_parallel_": "unused: no context parallelism (context_parallel_degree 1)",
    "parallelism.enable_sequence_parallel": "unused: no tensor parallelism (tensor_parallel_degree 1)",
    "comm.trace_buf_size": "unused: NCCL's flight recorder (gloo here; nccl runs keep torch's default)",
    "comm.save_traces_": "unused: NCCL's flight recorder (gloo here; nccl runs keep torch's default)",
}

# Whole sections used only when a switch above is on: any value while it is off.
SECTION_SWITCHES: dict[str, tuple[str, str]] = {
    "profiler.": ("profiler.enable_profiling", "profiles with torchtitan's schedule fields only"),
    "compile.": ("compile.enable", "does not compile"),
    "validator.": ("validator.enable", "validates with torchtitan's freq, steps and dataset fields only"),
    "checkpoint.": ("checkpoint.enable", "saves with its own checkpointer"),
}


def _refuse(why: str) -> tuple[dict[str, Any], str]:
    raise Refuse(f"monarch_nb {why}")


def _vocab(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    if value == getattr(config.model_spec.model, "vocab_size", value):
        return {}, "the model's vocabulary"
    raise Refuse("computes the loss over the model's vocabulary: global_vocab_size must be its size")


def _tokenizer(value: Any) -> tuple[dict[str, Any], str]:
    from pathlib import Path

    from .titan_parts import TITAN_TEST_TOKENIZER

    if value is None:
        return {}, "the tiny tokenizer (data_dir)"
    if value == TITAN_TEST_TOKENIZER and not Path(value).is_dir():
        return {}, ("torchtitan's test tokenizer (in its source tree, not its wheel; no folder here) -> the tiny "
                    "tokenizer written for the same role (data_dir)")
    sets, became = _local_dir(value, "titan.tokenizer_path", "--hf_assets_path")
    if not (Path(sets["titan.tokenizer_path"]) / "tokenizer.json").is_file():
        raise Refuse(f"--hf_assets_path {value}: has no tokenizer.json (torchtitan's HuggingFaceTokenizer reads it)")
    return sets, became


def _local_dir(value: Any, name: str, flag: str) -> tuple[dict[str, Any], str]:
    import os
    from pathlib import Path

    path = Path(os.path.expanduser(str(value)))
    if not path.exists():
        raise Refuse(f"{flag} {value}: no such file or folder here (cwd {os.getcwd()}); monarch_nb reads local "
                      "files only (no hub downloads): give a local path")
    return {name: str(path.resolve())}, f"{name} = {str(path.resolve())!r}"


def _dataset(value: Any, path: Any) -> tuple[dict[str, Any], str]:
    from pathlib import Path

    from torchtitan.hf_datasets.text_datasets import DATASETS

    from .titan_parts import TITAN_TEST_DATASET

    if value not in DATASETS:
        raise Refuse(f"monarch_nb reads torchtitan's text datasets; {value!r} is not one: {', '.join(DATASETS)}")
    became = f"titan.dataset = {value!r} (torchtitan's HuggingFaceTextDataset)"
    if path is not None:
        return {"titan.dataset": value}, became
    if value == TITAN_TEST_DATASET:
        if Path(DATASETS[value].path).is_dir():
            return {"titan.dataset": value, "titan.dataset_path": str(Path(DATASETS[value].path).resolve())}, became
        return {"titan.dataset": value}, (became + f", from the tiny corpus written in its layout ({DATASETS[value].path} "
                                          "is in torchtitan's source tree, not its wheel)")
    raise Refuse(f"dataset {value!r} loads {DATASETS[value].path!r} from the hub; monarch_nb reads local files only: "
                  "give --dataloader.dataset_path with a local copy")


# AC options at torchtitan's defaults (SelectiveAC.Config / FullAC.Config); another value is refused
_AC_DEFAULTS = {"preserve_rng_state": True, "determinism_check": "default", "debug": False,
                "force_recompute_mm_shapes_by_fqns": ["moe.router.gate"]}


def _activation_checkpoint(option: str) -> Rule:
    """A leaf of the job's AC policy: the policy is applied when each option is torchtitan's default."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        kind = type(config.activation_checkpoint).__qualname__.split(".")[0]
        mode = {"SelectiveAC": "selective", "FullAC": "full"}.get(kind)
        if mode is None:
            raise Refuse(f"the job checkpoints activations with {kind}; monarch_nb applies SelectiveAC and FullAC "
                          "(MemoryBudgetAC needs torch.compile, which monarch_nb does not run)")
        if option not in _AC_DEFAULTS or value != _AC_DEFAULTS[option]:
            raise Refuse(f"monarch_nb applies {mode} activation checkpointing with torchtitan's default options; "
                          f"supported: {_AC_DEFAULTS.get(option)!r}")
        return {"titan.activation_checkpoint": mode}, f"titan.activation_checkpoint = {mode!r} (torchtitan's {kind})"
    return rule


def section_rule(path: str) -> Rule | None:
    if path.startswith("activation_checkpoint."):
        return _activation_checkpoint(path.split(".", 1)[1])
    for prefix, what in UNUSED_SECTIONS.items():
        if path.startswith(prefix):
            return lambda v, c, what=what: ({}, what)
    for prefix, (switch, what) in SECTION_SWITCHES.items():
        if path.startswith(prefix):
            return when_off(switch, what)
    return None



def get_path(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config
