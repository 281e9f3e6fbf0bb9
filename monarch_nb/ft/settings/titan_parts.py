"""The torchtitan components a 0.3 registry job names beyond monarch_nb's defaults: its dataset,
tokenizer and activation checkpointing. Plain data; the workers build each with torchtitan's own code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AC_MODES = ("none", "selective", "full")
# torchtitan's c4_test lives in its source tree (tests/assets/), not in its wheel; where that path is
# missing, a job naming it trains on the tiny corpus written in the same layout (tinydata.TITAN_LAYOUT).
TITAN_TEST_DATASET = "c4_test"
TITAN_TEST_TOKENIZER = "./tests/assets/tokenizer"


@dataclass(frozen=True)
class TitanParts:
    """What a torchtitan 0.3 job trains with (``RunConfig.titan``).

    Args:
        dataset: a name in torchtitan's ``hf_datasets.text_datasets.DATASETS`` (e.g. ``c4_test``),
            read by torchtitan's ``HuggingFaceTextDataset``; None: monarch_nb's tiny corpus.
        dataset_path: the local folder that dataset loads from; None: the tiny corpus in
            ``c4_test``'s layout (``<data_dir>/c4_test``). No hub downloads.
        tokenizer_path: torchtitan's ``hf_assets_path``, a folder with ``tokenizer.json``; None:
            the tiny tokenizer in ``data_dir``.
        activation_checkpoint: ``none``, ``selective`` or ``full``: torchtitan's SelectiveAC / FullAC
            with their default options, applied to every transformer block.
        collective_timeout_s: torchtitan's ``comm.train_timeout_seconds``: the timeout of a group's own
            (FSDP) process group; None: 6x ``pg_timeout_s``.
        grad_accumulation: microbatches of ``batch_size`` per step, their gradients summed before the
            groups average (torchtitan's global_batch_size / local_batch_size / data-parallel ranks).
        param_groups: torchtitan's optimizer param groups (dicts of pattern, optimizer_name,
            optimizer_kwargs), built by its OptimizersContainer; None: one AdamW group at ``lr``.
        profile_freq: torch's profiler every this many steps (None: off), with ``profile_warmup``
            and ``profile_active`` steps as torchtitan schedules them; chrome traces go to
            ``<run dir>/<profile_folder>/iteration_<step>/replica<R>_rank<r>_trace.json``.
        validate_every: torchtitan's validator: every this many committed steps each group reports
            its held-out loss (``Validated`` events, the dashboard's held-out line); None: off.
        validate_steps: batches per validation (-1: one pass over the validation set).
        validation_dataset: the validation set's torchtitan dataset (read like ``dataset``);
            None: ``c4_test``'s reader.
        validation_path: its local folder; None: the tiny held-out corpus (``<data_dir>/validation``).
        fragment_update_alpha: torchft's streaming DiLoCo mix of a fragment's local and synced
            parameters (0: take the synced ones).
        last_save_model_only: the run's final save holds the weights alone (``step-N-model``, which
            no resume picks); False: the whole state, as every periodic save.
    """

    dataset: str | None = None
    dataset_path: str | None = None
    tokenizer_path: str | None = None
    activation_checkpoint: str = "none"
    collective_timeout_s: float | None = None
    grad_accumulation: int = 1
    param_groups: tuple[dict[str, Any], ...] | None = None
    profile_freq: int | None = None
    profile_active: int = 1
    profile_warmup: int = 3
    profile_folder: str = "profiling/traces"
    validate_every: int | None = None
    validate_steps: int = -1
    validation_dataset: str | None = None
    validation_path: str | None = None
    fragment_update_alpha: float = 0.0
    last_save_model_only: bool = False

    def validate(self) -> "TitanParts":
        if self.activation_checkpoint not in AC_MODES:
            raise ValueError(f"titan.activation_checkpoint: unknown value {self.activation_checkpoint!r}; "
                             f"allowed values: {', '.join(AC_MODES)}")
        for name in ("dataset", "dataset_path", "tokenizer_path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"titan.{name}: must be a non-empty string or None, got {value!r}")
        t = self.collective_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e6):
            raise ValueError(f"titan.collective_timeout_s: must be a number of seconds > 0, got {t!r}")
        for name, low in (("grad_accumulation", 1), ("profile_active", 1), ("profile_warmup", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"titan.{name}: must be an integer >= {low}, got {v!r}")
        v = self.validate_every
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"titan.validate_every: must be an integer >= 1 or None, got {v!r}")
        v = self.validate_steps
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
            raise ValueError(f"titan.validate_steps: must be an integer >= 1, or -1 (one pass), got {v!r}")
        for name in ("validation_dataset", "validation_path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"titan.{name}: must be a non-empty string or None, got {value!r}")
        if not isinstance(self.last_save_model_only, bool):
            raise ValueError(f"titan.last_save_model_only: must be True or False, got {self.last_save_model_only!r}")
        a = self.fragment_update_alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:  # NaN fails too
            raise ValueError(f"titan.fragment_update_alpha: must be a number from 0 to 1, got {a!r}")
        f = self.profile_freq
        if f is not None and (isinstance(f, bool) or not isinstance(f, int) or f < self.profile_active + self.profile_warmup):
            raise ValueError(f"titan.profile_freq: must be an integer >= profile_warmup + profile_active, got {f!r}")
        if not isinstance(self.profile_folder, str) or not self.profile_folder or self.profile_folder.startswith("/") \
                or ".." in self.profile_folder.split("/"):
            raise ValueError(f"titan.profile_folder: a relative folder inside the run's directory, got "
                             f"{self.profile_folder!r}")
        if self.param_groups is not None and (not isinstance(self.param_groups, (tuple, list)) or not all(
                isinstance(g, dict) and set(g) == {"pattern", "optimizer_name", "optimizer_kwargs"}
                for g in self.param_groups)):
            raise ValueError("titan.param_groups: a list of {pattern, optimizer_name, optimizer_kwargs} dicts")
        if self.dataset_path is not None and self.dataset is None:
            raise ValueError("titan.dataset_path: names the folder of a dataset; give titan.dataset too")
        return self
