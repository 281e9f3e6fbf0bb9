"""The torchtitan components a 0.3 registry job names beyond monarch_nb's defaults: its dataset,
tokenizer and activation checkpointing. Plain data; the workers build each with torchtitan's own code."""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    dataset: str | None = None
    dataset_path: str | None = None
    tokenizer_path: str | None = None
    activation_checkpoint: str = "none"
    collective_timeout_s: float | None = None

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
        if self.dataset_path is not None and self.dataset is None:
            raise ValueError("titan.dataset_path: names the folder of a dataset; give titan.dataset too")
        return self
