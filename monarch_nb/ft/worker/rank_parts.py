"""What one rank of a replica group is made of: device, group store, model, optimizer, schedule, data.

Built once per worker process, before the rank knows whether it is a replica or a warm spare:
this is the expensive part (imports, model construction), and nothing in it depends on torchft.
It assembles torchtitan components rather than driving torchtitan's ``Trainer``: the Llama 3
model (or a registry model's, through its model spec) and its FSDP parallelize function (when
the group has more than one process),
``OptimizersContainer``, ``LRSchedulersContainer``, ``CrossEntropyLoss`` and
``HuggingFaceTokenizer``. Every replica seeds its initial weights alike, and data is a pure
function of (step, replica, rank), so a healed group needs no data-loader state to read exactly
the batch its peers read.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import seam
from ..settings.platform import DEVICE_SLOT_ENV, Platform, select_platform

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup, TCPStore
    from torchtitan.components.loss import BaseLoss
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.distributed import ParallelDims


class RankParts:
    """Everything one rank trains with, built in ``__init__`` (in this order: platform and
    device, the group's store, model, optimizer and schedule, data).

    Args:
        cfg: the run's config dict (``RunConfig`` as the worker receives it).
        replica: the group this rank belongs to; ``None`` for a warm spare (it takes the GPUs
            after the groups' on a shared host).
        rank: this process's rank within its group.
        group_size: processes per group (FSDP shards the model across them when more than 1).
        store_port: the group's TCP store port (rank 0 opens it: ``None`` picks a free one).
        data_dir: the tokenizer and ``corpus.jsonl``.
    """

    def __init__(self, cfg: dict[str, Any], *, replica: int | None, rank: int, group_size: int,
                 store_port: int | None, data_dir: str) -> None:
        self.cfg, self.rank, self.group_size = cfg, rank, group_size
        seam.stub_triton_kernels()
        seam.import_torchtitan()
        import torch

        torch.set_num_threads(int(cfg.get("threads_per_proc", 1)))
        self.platform: Platform = select_platform(cfg.get("platform", "auto"), backend=cfg.get("backend"))
        # Groups on one host take GPUs one after another: slot = the group's index (a spare's
        # comes after the groups'), set by the supervisor for the mesh it brings up.
        slot = int(os.environ.get(DEVICE_SLOT_ENV, replica or 0))
        self.device: torch.device = self.platform.device(slot * group_size + rank)
        if self.platform.device_type == "cuda":
            torch.cuda.set_device(self.device)
        seam.set_torchtitan_device(self.platform.device_type)
        self._open_store(store_port)
        # Durable checkpoints' own gloo group (FSDP groups only; see _shard).
        self.ckpt_pg: ProcessGroup | None = None
        self.model, self.parallel_dims = self._build_model()
        self._build_optim()
        self._build_data(data_dir)

    def _open_store(self, store_port: int | None) -> None:
        """The group's TCP store (rank 0 hosts it): the in-group process group and the torchft
        Manager connect through it. ``host`` is this node's address as peers reach it."""
        from torch.distributed import TCPStore

        host = self.cfg.get("advertise_host") or "127.0.0.1"
        if host == "auto":  # this node's own address, as the other nodes resolve its name
            host = socket.gethostbyname(socket.gethostname())
        store_host = "127.0.0.1" if self.cfg.get("job", "local") == "local" else host
        if self.rank == 0:
            self.store: TCPStore = TCPStore(store_host, store_port or 0, world_size=None, is_master=True,
                                            wait_for_workers=False, timeout=timedelta(seconds=60))
        else:
            self.store = TCPStore(store_host, store_port, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=60))
        self.store_port: int = self.store.port
        self.store_host: str = store_host
        self.host: str = host

    def _build_model(self) -> tuple[torch.nn.Module, ParallelDims | None]:
        import torch
        from torchtitan.models.common import ScaledDotProductAttention

        from ..settings.flavors import model_config

        # torchtitan's flavours, or monarch_nb's "small"/"medium" (monarch_nb/ft/settings/flavors.py).
        model_cfg = model_config(self.cfg.get("model", "debugmodel"), attn_backend="flex")
        # FlexAttention has no CPU backward and varlen no CPU kernel: the SDPA inner attention
        # (causal, no document masks) works everywhere. Our sequences are packed windows.
        for layer in model_cfg.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
        self.vocab_size: int = model_cfg.vocab_size
        torch.manual_seed(int(self.cfg.get("seed", 0)))  # identical init on every replica
        with torch.device("meta"):
            model = model_cfg.build()
        ac = self._ac_config()
        dims = None
        if self.group_size > 1:
            dims = self._shard(model, ac)
        elif ac is not None:
            ac.build(dump_folder="").apply(model)
        model.to_empty(device=self.device)
        with torch.no_grad():
            model.init_states(buffer_device=None)
        model.train()
        return model, dims

    def _collective_timeout_s(self) -> float:
        """The group's own process group: a torchtitan job's comm.train_timeout_seconds, else 6x pg_timeout_s."""
        titan = self.cfg.get("titan") or {}
        return float(titan.get("collective_timeout_s") or float(self.cfg.get("pg_timeout_s", 10)) * 6)

    def _ac_config(self) -> Any:
        """torchtitan's activation checkpointing policy a torchtitan 0.3 job asked for (None: none)."""
        mode = (self.cfg.get("titan") or {}).get("activation_checkpoint", "none")
        if mode == "none":
            return None
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

        return (SelectiveAC if mode == "selective" else FullAC).Config()

    def _shard(self, model: torch.nn.Module, ac: Any = None) -> ParallelDims:
        """FSDP inside the group, through the model's own torchtitan parallelize function."""
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
        from torchtitan.distributed import ParallelDims

        from ..settings.flavors import parallelize_fn

        if not dist.is_initialized():
            dist.init_process_group(backend=self.platform.backend, store=PrefixStore("monarch_nb/group", self.store),
                                    rank=self.rank, world_size=self.group_size,
                                    timeout=timedelta(seconds=self._collective_timeout_s()))
        os.environ.setdefault("WORLD_SIZE", str(self.group_size))
        # Durable checkpoints write from a background thread: their collectives get their own
        # gloo group, never the one training is using at the same time.
        self.ckpt_pg = dist.new_group(backend="gloo")
        parallelism = ParallelismConfig(data_parallel_shard_degree=self.group_size, spmd_backend="partial_dtensor")
        dims = ParallelDims.from_config(parallelism, self.group_size)
        dims.build_mesh()
        training = TrainingConfig(local_batch_size=int(self.cfg.get("batch_size", 2)),
                                  seq_len=int(self.cfg.get("seq_len", 64)), mixed_precision_param="float32")
        shard = parallelize_fn(self.cfg.get("model", "debugmodel"))
        shard(model, parallel_dims=dims, training=training, parallelism=parallelism,
              compile_config=CompileConfig(), ac_config=ac, dump_folder="")
        if self.platform.backend == "gloo":
            # gloo rejects ReduceOp.PREMUL_SUM, FSDP's default gradient reduce-scatter op.
            from torch.distributed.fsdp import FSDPModule

            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
        return dims

    def _build_optim(self) -> None:
        from torchtitan.components.loss import CrossEntropyLoss
        from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, default_adamw
        from torchtitan.components.optimizer.utils import init_optim_state

        lr = float(self.cfg.get("lr", 8e-4))
        groups = default_adamw(lr=lr).param_groups
        titan_groups = (self.cfg.get("titan") or {}).get("param_groups")
        if titan_groups:  # a torchtitan job's own param groups
            from torchtitan.components.optimizer.optimizer import ParamGroupConfig

            groups = [ParamGroupConfig(pattern=g["pattern"], optimizer_name=g["optimizer_name"],
                                       optimizer_kwargs={k: tuple(v) if isinstance(v, list) else v
                                                         for k, v in g["optimizer_kwargs"].items()})
                      for g in titan_groups]
        self.optimizers: OptimizersContainer = OptimizersContainer.Config(
            param_groups=groups, implementation="for-loop").build(model_parts=[self.model])
        for opt in self.optimizers.optimizers:
            init_optim_state(opt)  # state tensors exist before any heal loads into them
        from ..settings.flavors import post_optimizer_hook

        hook = post_optimizer_hook(self.cfg.get("model", "debugmodel"))
        if hook is not None:  # a registry model's own (torchtitan's trainer calls it here too)
            hook(self.optimizers, [self.model], self.parallel_dims)
        steps = self.cfg.get("steps") or 10_000
        self.lr_schedulers: LRSchedulersContainer = LRSchedulersContainer.Config(
            warmup_steps=int(self.cfg.get("warmup_steps", 2)), decay_ratio=float(self.cfg.get("lr_decay_ratio", 0.8)),
            decay_type=self.cfg.get("lr_decay_type", "linear"), min_lr_factor=float(self.cfg.get("lr_min_factor", 0.1)),
        ).build(optimizers=self.optimizers, training_steps=int(steps))
        self.loss_fn: BaseLoss = CrossEntropyLoss.Config(global_vocab_size=self.vocab_size).build()

    def _build_data(self, data_dir: str) -> None:
        import torch
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        titan = self.cfg.get("titan") or {}
        self.tokenizer: HuggingFaceTokenizer = HuggingFaceTokenizer(tokenizer_path=titan.get("tokenizer_path")
                                                                    or data_dir)
        if titan.get("dataset"):
            inputs, labels = self.read_dataset(titan["dataset"], titan.get("dataset_path")
                                                or str(Path(data_dir) / "c4_test"))
        else:
            ids = []
            with open(Path(data_dir) / "corpus.jsonl", encoding="utf-8") as f:
                for line in f:
                    ids.extend(self.tokenizer.encode(json.loads(line)["text"], add_bos=True, add_eos=True))
            inputs, labels = ids[:-1], ids[1:]
        # the token stream and its next-token targets, aligned (labels[i] follows inputs[i])
        self.inputs: torch.Tensor = torch.tensor(inputs, dtype=torch.long)
        self.labels: torch.Tensor = torch.tensor(labels, dtype=torch.long)
        if int(self.inputs.max()) >= self.vocab_size:
            raise ValueError(f"tokenizer produced id {int(self.inputs.max())} >= model vocab {self.vocab_size}")
        self.batch_size = int(self.cfg.get("batch_size", 2))
        # microbatches per step (a torchtitan job's global_batch_size): each is batch_size sequences
        self.microbatches = int((self.cfg.get("titan") or {}).get("grad_accumulation", 1))
        self.seq_len = int(self.cfg.get("seq_len", 64))
        if self.inputs.numel() <= self.seq_len:
            raise ValueError(f"the corpus has {self.inputs.numel()} tokens, fewer than one sequence of seq_len "
                             f"{self.seq_len}")

    def read_dataset(self, dataset: str, path: str) -> tuple[list[int], list[int]]:
        """One pass over a torchtitan text dataset, read and tokenized by torchtitan's own
        HuggingFaceTextDataset (local files only): its inputs and labels (shifted within each
        document, as torchtitan trains). Batches stay a pure function of (step, replica, rank)
        over them, so a healed group needs no data-loader state."""
        import tempfile

        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never the hub
        os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="monarch_nb-hf-"))
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

        inputs: list[int] = []
        labels: list[int] = []
        for sample, target in HuggingFaceTextDataset(dataset, path, self.tokenizer, seq_len=256, infinite=False):
            inputs.extend(sample["input"].tolist())
            labels.extend(target.tolist())
        return inputs, labels

    def batch(self, step: int, replica: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, labels) of ``step``'s microbatch ``micro`` for ``replica`` and this rank: a
        pure function (with one microbatch, the step's whole batch)."""
        replicas = int(self.cfg.get("replicas", 1))
        lanes = replicas * self.group_size
        lane = replica * self.group_size + self.rank
        usable = self.inputs.numel() - self.seq_len
        rows = self.batch_size * self.microbatches
        starts = [(((step * lanes + lane) * rows + b) * (self.seq_len + 1) * 7919) % usable
                  for b in range(micro * self.batch_size, (micro + 1) * self.batch_size)]
        return self.windows(self.inputs, self.labels, starts)

    def windows(self, inputs: torch.Tensor, labels: torch.Tensor, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) of ``seq_len`` tokens from each start, stacked on this rank's device."""
        import torch

        x = torch.stack([inputs[s:s + self.seq_len] for s in starts]).to(self.device)
        y = torch.stack([labels[s:s + self.seq_len] for s in starts]).to(self.device)
        return x, y

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The model's parameters by name; activation checkpointing wraps each block, and the
        names drop the wrapper (as its state_dict does), so checkpoints and heals agree across modes."""
        return [(n.replace("._checkpoint_wrapped_module", ""), p) for n, p in self.model.named_parameters()]

    def named_optim_state(self) -> list[tuple[str, torch.nn.Parameter, torch.optim.Optimizer]]:
        """(a stable name, parameter, its optimizer) for every parameter each optimizer steps:
        the keys heals, durable checkpoints and digests agree on."""
        names = {id(p): n for n, p in self.named_parameters()}
        out = []
        for oi, opt in enumerate(self.optimizers.optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    out.append((f"{oi}/{names[id(p)]}", p, opt))
        return out
