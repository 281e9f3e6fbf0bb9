"""torchtitan 0.3's own job form, read into a :class:`RunConfig`: every leaf honoured or refused by name.

A torchtitan 0.3 job is a config-registry function (``--module llama3 --config llama3_debugmodel``,
or the user's own module) plus ``--section.key value`` overrides, parsed by torchtitan's own
``ConfigManager`` (tyro). :func:`load` does exactly that, turning its failures into one clear line:
an unknown module lists the shorthands, an unknown function the module's functions, an unknown
field or a value of the wrong type names the flag. :func:`read` then walks every leaf of the
config tree and gives each a :class:`Leaf` verdict from :data:`RULES`: *honoured* (it sets a
RunConfig field, or its value is what monarch_nb does anyway) or *refused* (monarch_nb cannot apply
that value; the verdict says what it supports). No leaf is passed over: a leaf with no rule is
refused too, so a torchtitan upgrade that adds a field shows up here instead of being ignored.

The model is read as a whole: ``model_spec`` is honoured when it is torchtitan's own Llama 3 flavour
of that name, unchanged; each leaf that differs from it is refused by its path.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

SHORTHAND_MODULES = ("llama3", "qwen3", "torchft.llama3")  # what this project has read through; any module works


class JobRefused(ValueError):
    """The job names values monarch_nb cannot apply; the message lists each refused leaf."""


@dataclass(frozen=True)
class Leaf:
    """One leaf of the config tree and what monarch_nb makes of it."""

    path: str  # "training.steps"
    value: Any
    honoured: bool
    becomes: str  # honoured: what it became ("steps = 40"); refused: why, and what is supported

    def line(self) -> str:
        mark = "  " if self.honoured else "! "
        return f"{mark}{self.path} = {_short(self.value)}  ->  {self.becomes}"


# ---- rules: leaf path -> (value, whole config) -> (RunConfig fields it sets, what it became) ---------

Rule = Callable[[Any, Any], "tuple[dict[str, Any], str]"]


class _Refuse(Exception):
    pass


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
        raise _Refuse(f"monarch_nb {what}; supported: {expected!r}")
    return rule


def when_off(flag: str, what: str) -> Rule:
    """A setting of a feature monarch_nb does not have: any value while ``flag`` is off."""
    def rule(value: Any, config: Any) -> tuple[dict[str, Any], str]:
        if not _get(config, flag):
            return {}, f"unused: {flag} is off"
        raise _Refuse(f"{flag} is on and monarch_nb {what}")
    return rule


def _lr(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    groups = list(value or [])
    if len(groups) != 1 or groups[0].pattern != ".*" or groups[0].optimizer_name != "AdamW":
        raise _Refuse("monarch_nb trains every parameter with one AdamW group (default_adamw(lr=...)); "
                      f"got {len(groups)} group(s)")
    kwargs = dict(groups[0].optimizer_kwargs)
    lr = kwargs.pop("lr", None)
    defaults = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    odd = {k: v for k, v in kwargs.items() if k not in defaults or _norm(v) != _norm(defaults[k])}
    if lr is None or odd:
        raise _Refuse(f"monarch_nb's AdamW takes lr only (betas {defaults['betas']}, eps {defaults['eps']}, "
                      f"weight_decay {defaults['weight_decay']}); got {dict(groups[0].optimizer_kwargs)}")
    return {"lr": float(lr)}, f"lr = {float(lr)!r} (one AdamW group)"


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _process_group(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    if value == "nccl":
        try:
            import torch

            if not torch.cuda.is_available():
                raise _Refuse("'nccl' needs GPUs and this machine has none; pass --fault_tolerance.process_group gloo")
        except ImportError:
            pass
    return field("backend")(value, config)


_NOT_YET = "does not run it yet (issue 51: trainer parity)"

RULES: dict[str, Rule] = {
    "training.steps": field("steps"),
    "training.seq_len": field("seq_len"),
    "training.local_batch_size": field("batch_size"),
    "training.global_batch_size": fixed(-1, "takes no gradient accumulation (global = local x data-parallel)"),
    "training.max_norm": field("max_norm"),
    "training.dtype": fixed("float32", "trains in float32"),
    "training.mixed_precision_param": fixed("bfloat16", "keeps torchtitan's FSDP default"),
    "training.mixed_precision_reduce": fixed("float32", "keeps torchtitan's FSDP default"),
    "training.enable_cpu_offload": fixed(False, "does not offload to CPU"),
    "training.disable_cuda_graphs": fixed(False, "keeps torchtitan's default"),
    "training.gc_freq": fixed(50, "keeps torchtitan's default"),
    "training.gc_debug": fixed(False, "keeps torchtitan's default"),
    "optimizer.param_groups": _lr,
    "optimizer.implementation": fixed("fused", "lets torch pick the AdamW kernel"),
    "optimizer.optimizer_factory_kwargs_by_name": fixed({}, "builds torch's AdamW"),
    "lr_scheduler.warmup_steps": field("warmup_steps"),
    "lr_scheduler.total_steps": fixed(None, "decays over training.steps"),
    "lr_scheduler.decay_ratio": lambda v, c: field("lr_decay_ratio")(v, c) if v is not None
    else _refuse("decays over a fraction of the steps: give a decay_ratio from 0 to 1"),
    "lr_scheduler.decay_type": field("lr_decay_type"),
    "lr_scheduler.min_lr_factor": field("lr_min_factor"),
    "dump_folder": field("runs_root", doc="where run directories go"),
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
    "fault_tolerance.fragment_sync_delay": fixed(0, "syncs fragments without delay"),
    "fault_tolerance.fragment_update_alpha": fixed(0.0, "keeps torchft's default"),
    "fault_tolerance.module_fqns_per_model_fragment": fixed([], "splits fragments itself"),
    "checkpoint.enable": lambda v, c: ({}, "with checkpoint.interval: checkpoint_every") if v
    else ({"checkpoint_every": None}, "checkpoint_every = None (only the final checkpoint)"),
    "checkpoint.interval": lambda v, c: ({"checkpoint_every": v}, f"checkpoint_every = {v!r}")
    if c.checkpoint.enable else ({}, "unused: checkpoint.enable is off"),
    "checkpoint.folder": fixed("checkpoint", "keeps checkpoints in the run's directory (RunConfig.checkpoint_dir)"),
    "checkpoint.keep_latest_k": field("checkpoint_keep"),
    "metrics.log_freq": fixed(1, "records every step's loss"),
    "metrics.enable_tensorboard": fixed(False, "writes its own event log, not TensorBoard"),
    "metrics.enable_wandb": fixed(False, "writes its own event log, not Weights & Biases"),
    "metrics.save_tb_folder": when_off("metrics.enable_tensorboard", "has no TensorBoard"),
    "metrics.save_for_all_ranks": when_off("metrics.enable_tensorboard", "has no TensorBoard"),
    "metrics.disable_color_printing": lambda v, c: ({}, "unused: monarch_nb does not print torchtitan's log"),
    "profiler.enable_profiling": fixed(False, "does not run torch's profiler (py-spy stacks: run.stacks())"),
    "profiler.enable_memory_snapshot": fixed(False, "takes no CUDA memory snapshots"),
    "compile.enable": fixed(False, "does not torch.compile"),
    "validator.enable": fixed(False, _NOT_YET),
    "debug.seed": lambda v, c: field("seed")(v, c) if v is not None else ({}, "seed's default (0)"),
    "debug.deterministic": fixed(False, "keeps torch's default"),
    "debug.print_config": fixed(False, "prints the job with `monarch-nb check-job`"),
    "dataloader.dataset": lambda v, c: _dataset(v, _get(c, "dataloader.dataset_path")),
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
    if _get(c, "parallelism.data_parallel_shard_degree") in (-1, 1)
    else fixed("partial_dtensor", "shards groups with FSDP on partial_dtensor (pass --parallelism.spmd_backend "
               "partial_dtensor)")(v, c),
    "comm.init_timeout_seconds": fixed(300, "keeps torch's process-group init timeout"),
    "comm.train_timeout_seconds": lambda v, c: ({}, "unused: one process per group, no in-group collectives")
    if _get(c, "parallelism.data_parallel_shard_degree") in (-1, 1)
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
    "profiler.": ("profiler.enable_profiling", "has no profiler"),
    "compile.": ("compile.enable", "does not compile"),
    "validator.": ("validator.enable", _NOT_YET),
    "checkpoint.": ("checkpoint.enable", "saves with its own checkpointer"),
}


def _refuse(why: str) -> tuple[dict[str, Any], str]:
    raise _Refuse(f"monarch_nb {why}")


def _vocab(value: Any, config: Any) -> tuple[dict[str, Any], str]:
    if value == getattr(config.model_spec.model, "vocab_size", value):
        return {}, "the model's vocabulary"
    raise _Refuse("computes the loss over the model's vocabulary: global_vocab_size must be its size")


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
        raise _Refuse(f"--hf_assets_path {value}: has no tokenizer.json (torchtitan's HuggingFaceTokenizer reads it)")
    return sets, became


def _local_dir(value: Any, name: str, flag: str) -> tuple[dict[str, Any], str]:
    import os
    from pathlib import Path

    path = Path(os.path.expanduser(str(value)))
    if not path.exists():
        raise _Refuse(f"{flag} {value}: no such file or folder here (cwd {os.getcwd()}); monarch_nb reads local "
                      "files only (no hub downloads): give a local path")
    return {name: str(path.resolve())}, f"{name} = {str(path.resolve())!r}"


def _dataset(value: Any, path: Any) -> tuple[dict[str, Any], str]:
    from pathlib import Path

    from torchtitan.hf_datasets.text_datasets import DATASETS

    from .titan_parts import TITAN_TEST_DATASET

    if value not in DATASETS:
        raise _Refuse(f"monarch_nb reads torchtitan's text datasets; {value!r} is not one: {', '.join(DATASETS)}")
    became = f"titan.dataset = {value!r} (torchtitan's HuggingFaceTextDataset)"
    if path is not None:
        return {"titan.dataset": value}, became
    if value == TITAN_TEST_DATASET:
        if Path(DATASETS[value].path).is_dir():
            return {"titan.dataset": value, "titan.dataset_path": str(Path(DATASETS[value].path).resolve())}, became
        return {"titan.dataset": value}, (became + f", from the tiny corpus written in its layout ({DATASETS[value].path} "
                                          "is in torchtitan's source tree, not its wheel)")
    raise _Refuse(f"dataset {value!r} loads {DATASETS[value].path!r} from the hub; monarch_nb reads local files only: "
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
            raise _Refuse(f"the job checkpoints activations with {kind}; monarch_nb applies SelectiveAC and FullAC "
                          "(MemoryBudgetAC needs torch.compile, which monarch_nb does not run)")
        if option not in _AC_DEFAULTS or value != _AC_DEFAULTS[option]:
            raise _Refuse(f"monarch_nb applies {mode} activation checkpointing with torchtitan's default options; "
                          f"supported: {_AC_DEFAULTS.get(option)!r}")
        return {"titan.activation_checkpoint": mode}, f"titan.activation_checkpoint = {mode!r} (torchtitan's {kind})"
    return rule


def _section_rule(path: str) -> Rule | None:
    if path.startswith("activation_checkpoint."):
        return _activation_checkpoint(path.split(".", 1)[1])
    for prefix, what in UNUSED_SECTIONS.items():
        if path.startswith(prefix):
            return lambda v, c, what=what: ({}, what)
    for prefix, (switch, what) in SECTION_SWITCHES.items():
        if path.startswith(prefix):
            return when_off(switch, what)
    return None


# ---- loading --------------------------------------------------------------------------------------


def load(argv: Sequence[str]) -> Any:
    """torchtitan's config for ``--module M --config F [--section.key value ...]``, through its own
    ConfigManager; a ``ValueError`` with one line naming what is wrong and the fix."""
    from torchtitan.config import ConfigManager

    import contextlib
    import io
    import re

    argv = list(argv)
    told = io.StringIO()
    with warnings.catch_warnings(), _quiet(), contextlib.redirect_stderr(told), contextlib.redirect_stdout(told):
        warnings.simplefilter("ignore")
        try:
            return ConfigManager().parse_args(argv)
        except SystemExit as exc:  # tyro drew its message in a box: keep its words, one line
            if exc.code == 0:  # --help: let the caller show it
                raise _HelpShown(told.getvalue()) from None
            lines = (re.sub(r"[│╭╰─╮╯]|-{3,}", " ", line).strip() for line in told.getvalue().splitlines())
            words = " ".join(w for w in lines if w and not w.startswith(("For full helptext", "Available subcommands",
                                                                           "activation-checkpoint:")))
            raise ValueError(f"torchtitan's parser refused the job: {words[:600]} "
                             "(`monarch-nb check-job --module M --config F --help` lists the fields)") from None
        except ImportError as exc:
            text = str(exc)
            if "supported modules" not in text:
                text += f"; shorthands: {', '.join(_shorthands())}"
            raise ValueError(f"module: {text}") from None
        except ValueError as exc:
            raise ValueError(f"config: {exc}") from None


def _shorthands() -> list[str]:
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    return sorted(_supported_models | _supported_experiments)


class _HelpShown(Exception):
    """``--help`` was asked for; the text is torchtitan's own field list."""


class _quiet:
    """torchtitan logs config warnings at WARNING while it parses; a check prints its own."""

    def __enter__(self) -> None:
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: Any) -> None:
        logging.disable(logging.NOTSET)


# ---- reading ---------------------------------------------------------------------------------------


def leaves(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf of a config tree, as (dotted path, value); ``model_spec`` is read apart."""
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{prefix}{f.name}"
        if path == "model_spec":
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def read(config: Any) -> tuple[dict[str, Any], list[Leaf]]:
    """(RunConfig fields, a verdict per leaf) for a torchtitan config."""
    fields: dict[str, Any] = {}
    verdicts = _model_verdicts(config, fields)
    for path, value in leaves(config):
        rule = RULES.get(path) or _section_rule(path)
        if rule is None:
            verdicts.append(Leaf(path, value, False, "monarch_nb has no rule for this field yet; it cannot "
                                 "apply it (leave it at torchtitan's default or drop it)"))
            continue
        try:
            sets, became = rule(value, config)
        except _Refuse as why:
            verdicts.append(Leaf(path, value, False, str(why)))
            continue
        fields.update(sets)
        verdicts.append(Leaf(path, value, True, became))
    titan = {k.split(".", 1)[1]: fields.pop(k) for k in list(fields) if k.startswith("titan.")}
    if titan:
        from .titan_parts import TitanParts

        fields["titan"] = TitanParts(**titan)
    return fields, verdicts


def _model_verdicts(config: Any, fields: dict[str, Any]) -> list[Leaf]:
    """The model is honoured as a whole: torchtitan's registry flavour of its name, unchanged. Llama 3
    trains as monarch_nb's flavour of that name (the same build); another registry model (qwen3)
    through its model spec, ``model = "MODULE/FLAVOR"``."""
    from .flavors import FLAVOR_NAMES, SPEC_MODULES, model_spec

    spec = getattr(config, "model_spec", None)
    name, flavor = getattr(spec, "name", None), getattr(spec, "flavor", None)
    module = "llama3" if name in ("llama3", "torchft/llama3") else name  # torchft's registry serves llama3
    if module != "llama3" and module not in SPEC_MODULES:
        return [Leaf("model_spec", f"{name}/{flavor}", False,
                     f"monarch_nb trains torchtitan's llama3 ({', '.join(FLAVOR_NAMES)}) and, through their model "
                     f"spec, {', '.join(SPEC_MODULES)}; {name!r} does not run here (docs/torchtitan_jobs.md says why)")]
    if module == "llama3" and flavor not in FLAVOR_NAMES:
        return [Leaf("model_spec.flavor", flavor, False, f"not a llama3 flavour; supported: {', '.join(FLAVOR_NAMES)}")]
    model = flavor if module == "llama3" else f"{module}/{flavor}"
    try:
        registry = model_spec(f"{module}/{flavor}") if module != "llama3" else _llama3_spec(flavor)
    except ValueError as exc:
        return [Leaf("model_spec.flavor", flavor, False, str(exc))]
    want = dict(leaves_of(registry.model, "model_spec.model."))
    have = dict(leaves_of(spec.model, "model_spec.model."))
    changed = [Leaf(path, value, False, f"differs from torchtitan's {module} {flavor!r} ({_short(want.get(path))}); "
                    "monarch_nb builds a flavour by its name: pick another flavour instead")
               for path, value in have.items() if _same_text(value) != _same_text(want.get(path))]
    if changed:
        return changed
    fields["model"] = model
    how = "torchtitan's flavour, unchanged" + ("" if module == "llama3" else ", built through its model spec")
    return [Leaf("model_spec", f"{module}/{flavor}", True, f"model = {model!r} ({how})")]


def _llama3_spec(flavor: str) -> Any:
    from torchtitan.models.llama3 import model_registry

    return model_registry(flavor)


def leaves_of(obj: Any, prefix: str) -> list[tuple[str, Any]]:
    """Leaves of any dataclass tree (lists of dataclasses by index), for comparing two models."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in leaves_of(getattr(obj, f.name), f"{prefix}{f.name}.")]
    if isinstance(obj, list) and obj and dataclasses.is_dataclass(obj[0]):
        return [leaf for i, item in enumerate(obj) for leaf in leaves_of(item, f"{prefix}{i}.")]
    return [(prefix[:-1], obj)]


def run_config(argv: Sequence[str], **overrides: Any) -> Any:
    """A validated RunConfig for a torchtitan 0.3 job; ``overrides`` are monarch_nb's own fields
    (``replicas``, ``spares``, ``job``, ...). ``JobRefused`` lists every leaf it cannot apply."""
    return run_config_of(load(argv), **overrides)


def is_titan_config(obj: Any) -> bool:
    """A torchtitan 0.3 ``Trainer.Config`` (or torchft's), as a registry function returns it."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type) and hasattr(obj, "model_spec") \
        and hasattr(obj, "training")


def run_config_of(config: Any, **overrides: Any) -> Any:
    """:func:`run_config` for a ``Trainer.Config`` already built (in Python, or by :func:`load`)."""
    from .config import RunConfig

    fields, verdicts = read(config)
    if "replicas" in overrides and "replicas" in fields and overrides["replicas"] != fields["replicas"]:
        raise JobRefused(f"replicas: --replicas {overrides['replicas']} and --fault_tolerance.group_size "
                         f"{fields['replicas']} disagree (torchft's group_size is the number of replica groups)")
    refused = [v for v in verdicts if not v.honoured]
    if refused:
        raise JobRefused(f"{len(refused)} field(s) of this job cannot be applied by monarch_nb:\n"
                         + "\n".join(v.line() for v in refused))
    return RunConfig(**{**fields, **overrides}).validate()


def _same_text(value: Any) -> str:
    """A leaf's repr without object addresses: a flavour's init functions are made anew per call."""
    import re

    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def check(argv: Sequence[str]) -> tuple[int, str]:
    """What ``monarch-nb check-job ARGS`` prints, and its exit code: every leaf and what it became
    (0), with refusals (1), or the job's parse error (2). Nothing is started."""
    try:
        fields, verdicts = read(load(argv))
    except _HelpShown as shown:
        return 0, str(shown)
    except ValueError as exc:
        return 2, f"monarch-nb check-job: {exc}"
    refused = [v for v in verdicts if not v.honoured]
    lines = [v.line() for v in verdicts]
    lines.append(f"{len(verdicts)} fields: {len(verdicts) - len(refused)} honoured, {len(refused)} refused (marked !)")
    if not refused:
        from .config import RunConfig

        try:
            RunConfig(**fields).validate()
        except ValueError as exc:
            return 1, "\n".join(lines + [f"refused as a whole: {exc}"])
    return (1 if refused else 0), "\n".join(lines)


def _get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
