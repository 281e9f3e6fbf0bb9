"""Llama 3 model flavours: torchtitan's own, plus sizes between its debug model and 1B.

torchtitan 0.3.0 ships ``debugmodel`` (6.2M parameters) and then jumps to ``1B`` (1.2B, with
a 128K vocabulary): nothing for a laptop or a small GPU. :data:`FLAVORS` adds ``tiny`` (~0.4M,
for runs of 16-32 groups on one machine), ``small``
(~104M) and ``medium`` (~409M), described by a few numbers (:class:`Flavor`) and assembled
here from torchtitan's public model pieces exactly as torchtitan assembles its own flavours
(same blocks, same initialisation; the test suite checks that our assembly of the
debugmodel numbers is bit-identical to torchtitan's). Their vocabulary is 2048, the size of
the tokenizer :mod:`~monarch_nb.ft.settings.tinydata` builds, so every parameter is trained and a
heal moves only useful bytes.

Nothing here imports torch or torchtitan at import time: the controller reads
:data:`FLAVOR_NAMES` to validate a config; :func:`model_config` runs in the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# torchtitan.models.llama3.llama3_configs, in its order.
TORCHTITAN_FLAVORS = ("debugmodel", "1B", "3B", "8B", "70B", "405B")


@dataclass(frozen=True)
class Flavor:
    """The numbers that make a Llama 3 flavour (the fields torchtitan's flavours vary).

    Args:
        dim: model width (embedding and residual stream size).
        n_layers: transformer blocks.
        n_heads: attention heads; the head size is ``dim // n_heads``.
        n_kv_heads: key/value heads (grouped-query attention); None: as many as ``n_heads``.
        vocab_size: embedding rows and output logits; token ids must be below it.
        multiple_of: the feed-forward hidden size is rounded up to a multiple of this.
        ffn_dim_multiplier: scales the feed-forward hidden size (None: Llama's 8/3 x dim).
        rope_theta: RoPE base frequency.
        rope_max_seq_len: RoPE table length (the longest sequence the model can take).
        note: one line for listings.
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    vocab_size: int = 2048
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_theta: float = 500000.0
    rope_max_seq_len: int = 131072
    note: str = ""


# Flavours defined by monarch_nb (torchtitan's own are built by torchtitan). Parameter counts
# are exact (tests/test_config_toml.py builds each on the meta device).
FLAVORS: dict[str, Flavor] = {
    "tiny": Flavor(dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                   note="~0.4M parameters: 32 groups of one process on a 2-core laptop (scale runs)"),
    "debug4x": Flavor(dim=512, n_layers=8, n_heads=16,
                      note="~4x debugmodel's parameters: state-size scaling in bench_scale_model.py"),
    "small": Flavor(dim=768, n_layers=16, n_heads=12, n_kv_heads=4,
                    note="~104M parameters: a laptop CPU (a few s/step) or any GPU"),
    "medium": Flavor(dim=1536, n_layers=16, n_heads=24, n_kv_heads=8,
                     note="~409M parameters: a GPU with 8 GB or more per process"),
}

# Every flavour a RunConfig may name, smallest first.
FLAVOR_NAMES = ("tiny", "debugmodel", *(n for n in FLAVORS if n != "tiny"), *TORCHTITAN_FLAVORS[1:])

# torchtitan's debugmodel in the same terms (its _debugmodel): used to check our assembly.
DEBUGMODEL = Flavor(dim=256, n_layers=6, n_heads=16, vocab_size=2048, multiple_of=256)


# Models of torchtitan's registry trained through their model spec ("MODULE/FLAVOR", e.g.
# "qwen3/debugmodel"): the spec's model config and its parallelize function. The others, and why
# not here, are in docs/torchtitan_jobs.md.
SPEC_MODULES = ("qwen3",)


def is_spec_name(name: str) -> bool:
    return isinstance(name, str) and name.count("/") == 1


def model_spec(name: str) -> Any:
    """torchtitan's ModelSpec for ``MODULE/FLAVOR`` (its ``model_registry(flavor)``); a ``ValueError``
    names the modules and flavours there are."""
    import importlib

    from ... import seam

    module, flavor = name.split("/")
    if module not in SPEC_MODULES:
        raise ValueError(f"model: {module!r} is not a torchtitan model monarch_nb trains through its spec; "
                         f"allowed: {', '.join(SPEC_MODULES)} (MODULE/FLAVOR), or a Llama 3 flavour: "
                         f"{', '.join(FLAVOR_NAMES)}")
    seam.stub_triton_kernels()
    registry = importlib.import_module(f"torchtitan.models.{module}").model_registry
    try:
        return registry(flavor)
    except (KeyError, ValueError) as exc:
        configs = importlib.import_module(f"torchtitan.models.{module}")
        known = sorted(getattr(configs, f"{module}_configs", {}) or [])
        raise ValueError(f"model: {flavor!r} is not a {module} flavour ({exc}); "
                         f"allowed: {', '.join(f'{module}/{k}' for k in known) or 'see torchtitan'}") from None


def parallelize_fn(name: str) -> Any:
    """The function that shards flavour ``name`` with FSDP: its spec's, or torchtitan's parallelize_llama."""
    if is_spec_name(name):
        return model_spec(name).parallelize_fn
    from torchtitan.models.llama3 import parallelize_llama

    return parallelize_llama


def has_experts(model: Any) -> bool:
    """Whether a model config has mixture-of-experts layers (built on the meta device: no memory)."""
    import torch

    with torch.device("meta"):
        built = model.build()
    return any(getattr(block, "moe_enabled", False) for block in built.get_submodule("layers").children())


def post_optimizer_hook(name: str) -> Any:
    """A registry model's ``post_optimizer_build_fn`` (None for the Llama 3 flavours)."""
    return model_spec(name).post_optimizer_build_fn if is_spec_name(name) else None


def model_config(name: str, attn_backend: str = "flex") -> Any:
    """torchtitan's model config for ``name``: a Llama 3 flavour (ours or torchtitan's), or a
    registry model's ``MODULE/FLAVOR`` built from its model spec."""
    from ... import seam

    if is_spec_name(name):
        return model_spec(name).model
    seam.stub_triton_kernels()
    from torchtitan.models.llama3 import llama3_configs

    if name in llama3_configs:
        return llama3_configs[name](attn_backend=attn_backend)
    if name not in FLAVORS:
        raise ValueError(f"model: unknown flavour {name!r}; allowed values: {', '.join(FLAVOR_NAMES)}")
    return assemble(FLAVORS[name], attn_backend)


def assemble(f: Flavor, attn_backend: str = "flex") -> Any:
    """A ``Llama3Model.Config`` from a :class:`Flavor`, built the way torchtitan 0.3.0 builds
    its own Llama 3 flavours (``torchtitan/models/llama3/__init__.py``): fused QKV, complex
    RoPE with Llama scaling, truncated-normal linear init with depth-scaled output
    projections, normal embeddings, untied output head."""
    from functools import partial

    import torch.nn as nn
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import depth_scaled_std
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    if f.dim % f.n_heads:
        raise ValueError(f"dim: {f.dim} is not a multiple of n_heads ({f.n_heads})")
    if f.n_kv_heads is not None and f.n_heads % f.n_kv_heads:
        raise ValueError(f"n_kv_heads: {f.n_kv_heads} does not divide n_heads ({f.n_heads})")
    linear_init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm_init = {"weight": nn.init.ones_}
    s = f.dim ** -0.5
    output_init = {"weight": partial(nn.init.trunc_normal_, std=s, a=-3 * s, b=3 * s), "bias": nn.init.zeros_}

    def depth_init(layer_id: int) -> dict[str, Any]:
        return {"weight": partial(nn.init.trunc_normal_, std=depth_scaled_std(0.02, layer_id)), "bias": nn.init.zeros_}

    hidden = compute_ffn_hidden_dim(f.dim, multiple_of=f.multiple_of, ffn_dim_multiplier=f.ffn_dim_multiplier)
    rope = ComplexRoPE.Config(dim=f.dim // f.n_heads, max_seq_len=f.rope_max_seq_len, theta=f.rope_theta,
                              scaling="llama")
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=f.dim, param_init=norm_init),
            ffn_norm=RMSNorm.Config(normalized_shape=f.dim, param_init=norm_init),
            attention=make_gqa_config(dim=f.dim, n_heads=f.n_heads, n_kv_heads=f.n_kv_heads,
                                      wqkv_param_init=linear_init, wo_param_init=depth_init(i),
                                      inner_attention=get_attention_config(attn_backend), fuse_qkv=True, rope=rope),
            feed_forward=make_ffn_config(dim=f.dim, hidden_dim=hidden, w1_param_init=linear_init,
                                         w2w3_param_init=depth_init(i)),
        )
        for i in range(f.n_layers)
    ]
    return Llama3Model.Config(
        dim=f.dim,
        vocab_size=f.vocab_size,
        tok_embeddings=Embedding.Config(num_embeddings=f.vocab_size, embedding_dim=f.dim,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=f.dim, param_init=norm_init),
        lm_head=Linear.Config(in_features=f.dim, out_features=f.vocab_size, param_init=output_init),
        layers=layers,
    )


def parameter_count(name: str) -> int:
    """Parameters of flavour ``name``, counted on the meta device (no memory, ~0.1 s)."""
    import torch

    cfg = model_config(name)
    with torch.device("meta"):
        model = cfg.build()
    return sum(p.numel() for p in model.parameters())
