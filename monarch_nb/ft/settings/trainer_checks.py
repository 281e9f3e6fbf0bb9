"""Checks of the model and the training schedule a RunConfig names (``RunConfig.validate`` calls them;
the config is passed in, never imported: config.py imports this module)."""

from __future__ import annotations

import math
from typing import Any

from .flavors import FLAVOR_NAMES, has_experts, is_spec_name, model_spec

MODELS = FLAVOR_NAMES


def finite(value: int | float) -> bool:
    """A number a float can hold and that is not NaN or infinite (a 400-digit int is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_model(name: Any) -> None:
    """A Llama 3 flavour, or a torchtitan registry model ("MODULE/FLAVOR") whose module and flavour exist."""
    if is_spec_name(name):
        if has_experts(model_spec(name).model):
            raise ValueError(f"model: {name} has mixture-of-experts layers; monarch_nb trains dense models")
    elif name not in MODELS:
        raise ValueError(f"model: unknown value {name!r}; allowed values: {', '.join(MODELS)}, or MODULE/FLAVOR "
                         "of a torchtitan registry model (qwen3/debugmodel)")


def check_schedule(config: Any) -> None:
    """The lr decay and gradient clipping torchtitan's job form may set."""
    if config.lr_decay_type not in ("linear", "sqrt", "cosine"):
        raise ValueError(f"lr_decay_type: unknown value {config.lr_decay_type!r}; allowed values: linear, sqrt, cosine")
    for name in ("lr_decay_ratio", "lr_min_factor"):
        v = getattr(config, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:  # NaN fails too
            raise ValueError(f"{name}: must be a number from 0 to 1, got {v!r}")
    v = config.max_norm
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite(v) or v <= 0:
        raise ValueError(f"max_norm: must be a positive finite number, got {v!r}")
