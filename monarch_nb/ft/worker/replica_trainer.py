"""One rank of one replica group: torchtitan's Llama 3 trained under a torchft Manager.

Runs inside a worker process (built by :class:`monarch_nb.ft.worker.trainer_actor.TrainerActor`), never
in the controller. It assembles torchtitan components rather than driving torchtitan's
``Trainer``: the Llama 3 model and its FSDP ``parallelize_llama`` (when the group has more
than one process), ``OptimizersContainer``, ``LRSchedulersContainer``, ``CrossEntropyLoss``
and ``HuggingFaceTokenizer``. torchft's ``Manager`` drives every step with a *synchronous*
quorum: ``start_quorum`` (heals a recovering group before the forward pass) ->
forward/backward -> cross-replica gradient average with ``Manager.allreduce`` ->
``should_commit`` -> optimizer + LR step.

Two torchtitan 0.3.0 FT defects are avoided by construction, not patched:
  * its async quorum read the state dict during the forward pass and crashed on CPU: we
    use the synchronous quorum;
  * its ``TorchFTOptimizersContainer`` serves a state dict cached at start-up, so a healed
    group received a stale learning rate and silently diverged: the state we register with
    torchft is read live at transfer time (parameters, optimizer state, param-group
    hyper-parameters, LR scheduler) and loaded in place, so healed groups are bit-identical
    - which ``hashes()`` lets the controller prove after every heal.
Data is a pure function of (step, replica, rank), so a healed group needs no data-loader
state to read exactly the batch its peers read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ... import seam
from ..spec.config import is_loopback, refuse_exposure
from ..spec.plain_address import is_plain
from ..spec.platform import DEVICE_SLOT_ENV, Platform, select_platform
from .checkpointer import tensor_bytes as _tensor_bytes
from .plain_replication import PlainReplication


def _striped_info(transport: Any) -> dict[str, Any]:
    """What a striped heal adds to the ``healed`` event: its donors and where its time went."""
    rec = getattr(transport, "last", None)
    if rec is None:
        return {}
    return {"donors": rec.donors, "transfer_s": rec.seconds, "manifest_s": rec.manifest_s, "fetch_s": rec.fetch_s,
            "corrupt": len(rec.corrupt), "passed_over": rec.dropped}


def _local(t: Any) -> Any:
    """The local shard of a DTensor (FSDP), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _copy_in(dst: Any, src: Any) -> None:
    """Load ``src`` into ``dst``; nothing to do when a striped heal already wrote it there."""
    if not (src.device == dst.device and src.data_ptr() == dst.data_ptr() and src.shape == dst.shape):
        dst.copy_(src)


def _hash_tensor(h: Any, t: Any) -> None:
    import torch

    t = _local(t).detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h.update(str((t.dtype, tuple(t.shape))).encode())
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes())


@dataclass
class _Retry:
    """A computed step whose gradient average failed: what a retry needs to skip the compute."""

    step: int
    loss: float
    local: Any  # this rank's flattened local gradients
    tokens: int
    compute_s: float


class _NoQuorums:
    """A plain job has no quorums: its recorder never holds one."""

    last = None


def _replica_index(replica_id: str) -> int | None:
    """'replica_2:uuid' -> 2."""
    head = replica_id.split(":", 1)[0]
    digits = ""
    for ch in reversed(head):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


class ReplicaTrainer:
    """Build everything in ``__init__``; call :meth:`train_step` in a loop.

    With ``replica=None`` it is a warm spare: model, optimizer and data are built (the
    expensive part: imports and model construction), but there is no torchft Manager yet, so
    the Lighthouse does not know it exists. :meth:`join` makes it replica ``r`` in a moment.
    """

    def __init__(self, cfg: dict[str, Any], *, replica: int | None, rank: int, group_size: int,
                 lighthouse: str | None, store_port: int | None, data_dir: str,
                 emit: Callable[[dict[str, Any]], None]) -> None:
        t0 = time.time()
        self.cfg, self.replica, self.rank, self.group_size = cfg, replica, rank, group_size
        self.emit = emit
        # Called with the name of each phase of a quorum or heal this rank enters (faults.PHASES):
        # where faults aimed at a moment of a recovery fire (set by the trainer actor).
        self.phase_hook: Callable[[str], None] | None = None
        seam.stub_triton_kernels()
        import torch

        torch.set_num_threads(int(cfg.get("threads_per_proc", 1)))
        self.platform: Platform = select_platform(cfg.get("platform", "auto"), backend=cfg.get("backend"))
        # Groups on one host take GPUs one after another: slot = the group's index (a spare's
        # comes after the groups'), set by the supervisor for the mesh it brings up.
        slot = int(os.environ.get(DEVICE_SLOT_ENV, replica or 0))
        self.device = self.platform.device(slot * group_size + rank)
        if self.platform.device_type == "cuda":
            torch.cuda.set_device(self.device)
        seam.set_torchtitan_device(self.platform.device_type)

        from torch.distributed import TCPStore

        host = cfg.get("advertise_host") or "127.0.0.1"
        if host == "auto":  # this node's own address, as the other nodes resolve its name
            host = socket.gethostbyname(socket.gethostname())
        store_host = "127.0.0.1" if cfg.get("job", "local") == "local" else host
        if rank == 0:
            self.store = TCPStore(store_host, store_port or 0, world_size=None, is_master=True,
                                  wait_for_workers=False, timeout=timedelta(seconds=60))
        else:
            self.store = TCPStore(store_host, store_port, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=60))
        self.store_port = self.store.port
        self.store_host = store_host

        self.model, self.mesh = self._build_model(torch)
        self._build_optim()
        self._build_data(data_dir)
        self._healed_info: dict[str, Any] | None = None
        self._last_commit: tuple[int, float] | None = None  # (step, unix time) of our last committed step
        self._retry: _Retry | None = None
        self._comms_dead = False
        self._comms_retries = 0
        self._retry_quorum_id: int | None = None  # the quorum whose process group could not be built
        self._last_quorum_id: int | None = None
        self.host = host
        self.manager: Any = None
        self.min_step = 0  # never train below this step without a heal or a checkpoint (see train_step)
        self._waiting_for_peer = False
        self._pending_load: str | None = None
        self._loaded_step: int | None = None
        self.durable = None
        if cfg.get("checkpoint_every"):
            from .checkpointer import DurableCheckpointer

            self.durable = DurableCheckpointer(str(cfg["checkpoint_dir"]), int(cfg["checkpoint_every"]),
                                               int(cfg.get("checkpoint_keep", 3)), rank, group_size,
                                               self._durable_state, self._durable_meta, emit,
                                               getattr(self, "_ckpt_pg", None))
        if replica is not None:
            assert lighthouse is not None
            self.join(replica, lighthouse)
        self.init_seconds = time.time() - t0

    def join(self, replica: int, lighthouse: str) -> float:
        """Become replica ``replica``: a torchft Manager that joins the next quorum (and heals
        from a peer there). Returns the seconds it took."""
        t0 = time.time()
        self.replica, self.lighthouse = replica, lighthouse
        if is_plain(lighthouse):  # recovery="plain_restart": no torchft at all (see plain.py)
            self.manager = PlainReplication(lighthouse, replica, self.rank, int(self.cfg["replicas"]),
                                            timedelta(seconds=float(self.cfg.get("pg_timeout_s", 10))),
                                            self.platform.backend, self._phase)
            self.ft_pg, self.transport, self.quorum_recorder = self.manager, None, _NoQuorums()
        else:
            self.manager = self._build_manager(lighthouse, self.host)
            self.quorum_recorder = seam.record_quorums(self.manager)
        if self._loaded_step is not None:  # a spare that loaded a checkpoint before it joined
            self.manager.load_state_dict({"step": self._loaded_step, "batches_committed": 0})
        return time.time() - t0

    @property
    def plain(self) -> bool:
        return isinstance(self.manager, PlainReplication)

    def _new_manager(self, after_timeout: bool = False) -> None:
        """A fresh torchft Manager with this replica's step: after a quorum request timed out,
        torchft 0.2.0's Manager fails every later request at once (seen when the Lighthouse died
        and came back on the same address), while model, optimizer and step are all intact
        here. The new Manager joins the next quorum of a restarted Lighthouse as the same step,
        so no group loses its state or restarts."""
        state = self.manager.state_dict()
        if after_timeout:  # its quorum request may still count at the Lighthouse (seam.retire_manager)
            seam.retire_manager(self.manager, timedelta(milliseconds=int(self.cfg.get("heartbeat_timeout_ms", 1000))))
        else:  # it got its quorum: nothing of it waits at the Lighthouse
            try:
                seam.shutdown_manager(self.manager)
            except Exception:  # noqa: BLE001
                pass
        self.manager = self._build_manager(self.lighthouse, self.host)
        self.manager.load_state_dict(state)
        self.quorum_recorder = seam.record_quorums(self.manager)
        self._last_quorum_id = None
        self._retry = None

    # ---- construction --------------------------------------------------------------------

    def _build_model(self, torch: Any) -> tuple[Any, Any]:
        from torchtitan.models.common import ScaledDotProductAttention

        from ..spec.flavors import model_config

        # torchtitan's flavours, or monarch_nb's "small"/"medium" (monarch_nb/ft/spec/flavors.py).
        model_cfg = model_config(self.cfg.get("model", "debugmodel"), attn_backend="flex")
        # FlexAttention has no CPU backward and varlen no CPU kernel: the SDPA inner attention
        # (causal, no document masks) works everywhere. Our sequences are packed windows.
        for layer in model_cfg.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
        self.vocab_size = model_cfg.vocab_size
        torch.manual_seed(int(self.cfg.get("seed", 0)))  # identical init on every replica
        with torch.device("meta"):
            model = model_cfg.build()
        mesh = None
        if self.group_size > 1:
            mesh = self._shard(model, torch)
        model.to_empty(device=self.device)
        with torch.no_grad():
            model.init_states(buffer_device=None)
        model.train()
        return model, mesh

    def _shard(self, model: Any, torch: Any) -> Any:
        """FSDP inside the group, through torchtitan's own parallelize_llama."""
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.models.llama3 import parallelize_llama

        if not dist.is_initialized():
            dist.init_process_group(backend=self.platform.backend, store=PrefixStore("monarch_nb/group", self.store),
                                    rank=self.rank, world_size=self.group_size,
                                    timeout=timedelta(seconds=float(self.cfg.get("pg_timeout_s", 10)) * 6))
        os.environ.setdefault("WORLD_SIZE", str(self.group_size))
        # Durable checkpoints write from a background thread: their collectives get their own
        # gloo group, never the one training is using at the same time.
        self._ckpt_pg = dist.new_group(backend="gloo")
        parallelism = ParallelismConfig(data_parallel_shard_degree=self.group_size, spmd_backend="partial_dtensor")
        dims = ParallelDims.from_config(parallelism, self.group_size)
        dims.build_mesh()
        training = TrainingConfig(local_batch_size=int(self.cfg.get("batch_size", 2)),
                                  seq_len=int(self.cfg.get("seq_len", 64)), mixed_precision_param="float32")
        parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                          compile_config=CompileConfig(), ac_config=None, dump_folder="")
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
        self.optimizers = OptimizersContainer.Config(param_groups=groups, implementation="for-loop").build(
            model_parts=[self.model])
        for opt in self.optimizers.optimizers:
            init_optim_state(opt)  # state tensors exist before any heal loads into them
        steps = self.cfg.get("steps") or 10_000
        self.lr_schedulers = LRSchedulersContainer.Config(
            warmup_steps=int(self.cfg.get("warmup_steps", 2)), decay_ratio=0.8, decay_type="linear",
            min_lr_factor=0.1).build(optimizers=self.optimizers, training_steps=int(steps))
        self.loss_fn = CrossEntropyLoss.Config(global_vocab_size=self.vocab_size).build()

    def _build_data(self, data_dir: str) -> None:
        import torch
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        self.tokenizer = HuggingFaceTokenizer(tokenizer_path=data_dir)
        ids: list[int] = []
        with open(Path(data_dir) / "corpus.jsonl", encoding="utf-8") as f:
            for line in f:
                ids.extend(self.tokenizer.encode(json.loads(line)["text"], add_bos=True, add_eos=True))
        self.tokens = torch.tensor(ids, dtype=torch.long)
        if int(self.tokens.max()) >= self.vocab_size:
            raise ValueError(f"tokenizer produced id {int(self.tokens.max())} >= model vocab {self.vocab_size}")
        self.batch_size = int(self.cfg.get("batch_size", 2))
        self.seq_len = int(self.cfg.get("seq_len", 64))

    def batch(self, step: int) -> tuple[Any, Any]:
        """The (inputs, labels) of ``step`` for this replica and rank: a pure function."""
        import torch

        replicas = int(self.cfg.get("replicas", 1))
        lanes = replicas * self.group_size
        lane = self.replica * self.group_size + self.rank
        span = self.seq_len + 1
        usable = self.tokens.numel() - span
        rows = []
        for b in range(self.batch_size):
            start = (((step * lanes + lane) * self.batch_size + b) * span * 7919) % usable
            rows.append(self.tokens[start:start + span])
        window = torch.stack(rows).to(self.device)
        return window[:, :-1], window[:, 1:]

    def _build_manager(self, lighthouse: str, host: str) -> Any:
        import torchft

        timeout = timedelta(seconds=float(self.cfg.get("pg_timeout_s", 10)))
        if self.platform.backend == "nccl":
            pg = torchft.ProcessGroupNCCL(timeout=timeout)
        else:
            pg = torchft.ProcessGroupGloo(timeout=timeout)
        configure = pg.configure

        def configure_in_phase(store_addr: str, replica_id: str, rank: int, world_size: int,
                               *args: Any, **kwargs: Any) -> Any:  # the quorum's process group is built
            self._phase("pg_setup")
            out = configure(store_addr, replica_id, rank, world_size, *args, **kwargs)
            self._heal_peers.join(store_addr, rank, world_size)
            return out

        pg.configure = configure_in_phase
        self.ft_pg = pg
        self._recv_info: dict[str, Any] | None = None
        from .heal_transport import QuorumPeers, interface_address

        self._heal_peers = QuorumPeers(timeout)
        heal_host = host
        if self.cfg.get("heal_interface"):
            heal_host = interface_address(self.cfg["heal_interface"])
            refuse_exposure("heal_interface", f"{self.cfg['heal_interface']!r} (address {heal_host})", heal_host,
                            self.cfg.get("job", "local"), bool(self.cfg.get("expose")))
        self.transport = self._heal_transport(str(self.cfg.get("heal_transport") or "striped"), heal_host, pg, timeout)
        return torchft.Manager(
            pg=pg,
            load_state_dict=self._load_state_dict,
            state_dict=self._state_dict,
            min_replica_size=int(self.cfg.get("min_replicas", 1)),
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=float(self.cfg.get("quorum_timeout_s", 10))),
            connect_timeout=timedelta(seconds=30),
            rank=self.rank,
            world_size=self.group_size,
            store_addr=self.store_host,
            store_port=self.store_port,
            lighthouse_addr=lighthouse,
            replica_id=f"replica_{self.replica}",
            hostname=host,
            heartbeat_interval=timedelta(milliseconds=100),
            checkpoint_transport=self.transport,
            init_sync=False,  # every replica starts from the same seed; hashes prove it
        )

    def _heal_transport(self, kind: str, host: str, pg: Any, timeout: timedelta) -> Any:
        """torchft's checkpoint transport for heals, recording what each heal moved: "http" (a
        checkpoint server per rank, advertising a reachable address) or "pg" (the state goes
        over the cross-replica process group the quorum just configured)."""
        trainer = self

        def recorded(recv: Callable[..., Any]) -> Callable[..., Any]:
            def recv_checkpoint(src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
                trainer._phase("heal_recv")
                t = time.time()
                try:
                    state = recv(src_rank, metadata, step, timeout)
                finally:
                    trainer._report_corrupt(getattr(transport, "last", None), step)
                trainer._recv_info = {"seconds": time.time() - t, "bytes": _tensor_bytes(state),
                                      "src_rank": src_rank, "step": step, "striped": _striped_info(transport)}
                return state

            return recv_checkpoint

        if kind == "pg":
            from torchft.checkpointing.pg_transport import PGTransport

            transport = PGTransport(pg, timeout=timeout, device=self.device)
        elif kind == "striped":
            from .heal_transport import StripedTransport

            transport = StripedTransport(host, timeout, target=lambda: self.manager._manager_state_dict(),
                                         peers=self._heal_peers.addresses, replica=self.replica,
                                         streams_per_donor=int(self.cfg.get("heal_streams") or 4))
            self._heal_peers.mine = transport.metadata()
        else:
            from torchft.checkpointing.http_transport import HTTPTransport

            class PeerTransport(HTTPTransport):
                def address(self) -> str:  # the node's reachable address, not its hostname
                    return f"http://{host}:{seam.http_transport_port(self)}/checkpoint/"

            transport = PeerTransport(timeout=timeout, num_chunks=0)
            if is_loopback(host):  # peers are on this machine: nothing else may fetch our state
                seam.rebind_http_transport(transport, host)
        transport.recv_checkpoint = recorded(transport.recv_checkpoint)
        send = transport.send_checkpoint

        def send_checkpoint(*args: Any, **kwargs: Any) -> Any:  # we are a donor: a peer heals from us
            trainer._phase("heal_send")
            return send(*args, **kwargs)

        transport.send_checkpoint = send_checkpoint
        return transport

    def _report_corrupt(self, record: Any, step: int) -> None:
        """One ``heal_corrupt`` event per piece of a heal that arrived different from its donor's
        digest (it was refetched from another donor, or the heal failed)."""
        for bad in getattr(record, "corrupt", None) or []:
            self.emit({"kind": "heal_corrupt", "replica": self.replica, "rank": self.rank, "step": step,
                       "tensor": bad["tensor"], "offset": bad["offset"], "donor": bad["donor"],
                       "refetched_from": bad["refetched_from"], "t": time.time()})

    def _phase(self, name: str) -> None:
        hook = self.phase_hook
        if hook is not None:
            hook(name)

    def listening(self) -> dict[str, int | None]:
        """The TCP ports this rank's torchft parts listen on (what ``ss -ltnp`` shows)."""
        http = seam.http_transport_port(self.transport) if hasattr(self.transport, "_server") else None
        return {"torchft manager server": seam.manager_server_port(self.manager) if self.manager else None,
                "tcp store": self.store_port if self.rank == 0 else None, "checkpoint server": http}

    # ---- state that torchft moves between peers (read live, loaded in place) --------------

    def _optim_items(self) -> list[tuple[str, Any, Any]]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        out = []
        for oi, opt in enumerate(self.optimizers.optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    out.append((f"{oi}/{names[id(p)]}", p, opt))
        return out

    def _state_dict(self) -> dict[str, Any]:
        model = {n: _local(p).detach() for n, p in self.model.named_parameters()}
        optim_state: dict[str, dict[str, Any]] = {}
        for key, p, opt in self._optim_items():
            optim_state[key] = {k: (_local(v).detach() if hasattr(v, "detach") else v)
                                for k, v in opt.state.get(p, {}).items()}
        groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                  for opt in self.optimizers.optimizers]
        return {"model": model, "optim": optim_state, "param_groups": groups,
                "lr_schedulers": self.lr_schedulers.state_dict()}

    # ---- durable checkpoints (durable.py): the same state, for DCP ---------------------------

    def _durable_state(self) -> dict[str, Any]:
        """Tensors DCP saves and loads in place: parameters and optimizer state (DTensors stay
        DTensors, so DCP writes each FSDP shard once)."""
        model = {n: p.detach() for n, p in self.model.named_parameters()}
        optim = {key: {k: v.detach() for k, v in opt.state.get(p, {}).items() if hasattr(v, "detach")}
                 for key, p, opt in self._optim_items()}
        return {"model": model, "optim": optim}

    def _fingerprint(self) -> dict[str, Any]:
        from ..spec.checkpoint_format import fingerprint

        return fingerprint(self.cfg, {n: tuple(p.shape) for n, p in self.model.named_parameters()})

    def _durable_meta(self, step: int) -> dict[str, Any]:
        groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                  for opt in self.optimizers.optimizers]
        return {"step": step, "param_groups": groups, "lr_schedulers": self.lr_schedulers.state_dict(),
                "fingerprint": self._fingerprint(), "run_id": self.cfg.get("run_id")}

    def save_final(self) -> dict[str, Any]:
        """The run reached its last step: write this step's state as a durable checkpoint into
        the run's checkpoint folder (every rank of the saving group calls this; periodic
        checkpoints on or off). Returns the step, path and parameter digest of what is on disk."""
        from .checkpointer import DurableCheckpointer

        saver = self.durable or DurableCheckpointer(str(self.cfg["checkpoint_dir"]), 0,
                                                    int(self.cfg.get("checkpoint_keep", 3)), self.rank,
                                                    self.group_size, self._durable_state, self._durable_meta,
                                                    self.emit, getattr(self, "_ckpt_pg", None))
        return saver.save_final(self.current_step(), {"replica": self.replica, "digest": self.hashes()["params"]})

    def request_load(self, path: str) -> None:
        """Load checkpoint ``path`` before the next step (the training thread applies it)."""
        self._pending_load = path

    def load_checkpoint(self, path: str) -> int:
        """Replace this replica's state with a durable checkpoint's; returns its step."""
        import torch

        from ..spec.checkpoint_format import META, mismatch
        from .checkpointer import load_into

        meta = torch.load(Path(path) / META, weights_only=False)
        why = mismatch(meta.get("fingerprint", {}), self._fingerprint())
        if why is not None:
            raise ValueError(f"checkpoint {path} was written by a different model or config: {why}")
        t = time.time()
        load_into(path, self._durable_state(), getattr(self, "_ckpt_pg", None))
        for opt, groups in zip(self.optimizers.optimizers, meta["param_groups"]):
            for mine, theirs in zip(opt.param_groups, groups):
                mine.update(theirs)
        self.lr_schedulers.load_state_dict(meta["lr_schedulers"])
        step = int(meta["step"])
        self._loaded_step = step
        self.min_step = min(self.min_step, step)  # a checkpoint is as good a source as a peer
        if self.manager is not None:
            self.manager.load_state_dict({"step": step, "batches_committed": 0})
        self._retry = None
        self.emit({"kind": "checkpoint_loaded", "replica": self.replica, "rank": self.rank, "step": step,
                   "path": str(path), "seconds": time.time() - t, "digest": self.hashes()["params"],
                   "t": time.time()})
        return step

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        t = time.time()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                _copy_in(_local(p), state["model"][n])
            for key, p, opt in self._optim_items():
                mine = opt.state.setdefault(p, {})
                for k, v in state["optim"][key].items():
                    if k in mine and isinstance(mine[k], torch.Tensor):
                        _copy_in(_local(mine[k]), v)
                    else:
                        mine[k] = v.clone() if isinstance(v, torch.Tensor) else v
            for opt, groups in zip(self.optimizers.optimizers, state["param_groups"]):
                for mine_g, theirs in zip(opt.param_groups, groups):
                    mine_g.update(theirs)
        self.lr_schedulers.load_state_dict(state["lr_schedulers"])
        self._healed_info = {"apply_seconds": time.time() - t, "bytes": _tensor_bytes(state)}

    # ---- the step ------------------------------------------------------------------------

    def hashes(self) -> dict[str, str]:
        """Digests of this rank's parameters and optimizer state (incl. hyper-parameters)."""
        hp = hashlib.blake2b(digest_size=12)
        for n, p in self.model.named_parameters():
            hp.update(n.encode())
            _hash_tensor(hp, p)
        ho = hashlib.blake2b(digest_size=12)
        for key, p, opt in self._optim_items():
            ho.update(key.encode())
            for k, v in sorted(opt.state.get(p, {}).items()):
                ho.update(k.encode())
                if hasattr(v, "detach"):
                    _hash_tensor(ho, v)
                else:
                    ho.update(repr(v).encode())
        for opt in self.optimizers.optimizers:
            for g in opt.param_groups:
                ho.update(repr(sorted((k, v) for k, v in g.items() if k != "params")).encode())
        return {"params": hp.hexdigest(), "optim": ho.hexdigest()}

    def current_step(self) -> int:
        return self.manager.current_step() if self.manager is not None else 0

    def train_step(self, fault_point: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One fault-tolerant step; returns the step record (also emitted)."""
        import torch

        t0 = time.time()
        if self._pending_load is not None:
            path, self._pending_load = self._pending_load, None
            self.load_checkpoint(path)
        self._phase("quorum")
        if self.plain:
            waiting = self._plain_start()
            if waiting is not None:
                return waiting
        try:
            self.manager.start_quorum()
        except TimeoutError as exc:
            # No quorum in quorum_timeout_s: the Lighthouse is gone (a request in flight to a
            # Lighthouse that died never completes) or too few groups are alive. Not this
            # group's failure: report it and ask again - a restarted Lighthouse answers.
            self.emit({"kind": "quorum_timeout", "replica": self.replica, "rank": self.rank,
                       "error": str(exc)[:200], "t": time.time()})
            self._new_manager(after_timeout=True)
            return {"kind": "quorum_timeout", "step": self.manager.current_step(), "committed": False}
        except Exception as exc:  # noqa: BLE001 - the quorum machinery failed: a peer's doing
            return self._comms_retry(f"the quorum failed: {type(exc).__name__}: {exc}", rebuild=True,
                                     request_may_linger=True)
        if self._last_quorum_id is not None and seam.process_group_is_down(self.ft_pg):
            # The quorum formed, but building its process group failed: a member died while we
            # connected to it (a store key that never came, a gloo connect timeout). Our state
            # and step are intact; a peer's death is not our fault. The next quorum, without the
            # dead member, has a new id and torchft builds a new group for it; only when the same
            # quorum comes back (nobody left it) is our Manager rebuilt to force a new one.
            q = self.quorum_recorder.last
            qid = q.quorum_id if q is not None else None
            same, self._retry_quorum_id = qid is not None and qid == self._retry_quorum_id, qid
            return self._comms_retry(self._pg_error() or "the cross-replica process group could not be built",
                                     rebuild=same)
        self._comms_retries, self._retry_quorum_id = 0, None
        offer = getattr(self.transport, "offer", None)
        if offer is not None and self.manager.errored() is None:
            # Any member of the quorum may serve a peer that heals at this step (a striped heal
            # fetches from all of them); torchft itself offers only on the donor it picked.
            offer(self.manager.current_step(), self.manager._manager_state_dict)  # read only if asked
        q = self.quorum_recorder.last
        participants = self.manager.num_participants()
        if q is not None and q.quorum_id != self._last_quorum_id:
            self._last_quorum_id = q.quorum_id
            members = [_replica_index(r) for r in q.replica_ids]
            # The quorum's store (which every member's process group connects through) is one
            # member's group store: "store" names it, "own_store" is ours, so the controller can
            # tell whose node a quorum depends on.
            self.emit({"kind": "quorum", "quorum_id": int(q.quorum_id), "participants": members,
                       "store": str(q.store_address), "own_store": f"{self.store_host}:{self.store_port}",
                       "replica": self.replica, "rank": self.rank, "t": time.time()})
        healed = self._healed_info is not None
        if self._healed_info is not None:
            info, self._healed_info = self._healed_info, None
            recv = self._recv_info or {}
            self._recv_info = None
            src = None
            if q is not None and q.recover_src_replica_rank is not None:
                ids = list(q.replica_ids)
                if 0 <= q.recover_src_replica_rank < len(ids):
                    src = _replica_index(ids[q.recover_src_replica_rank])
            # Where we were before the heal: a group that was never failed heals because quorums
            # went on without it (on a starved host its heartbeats or its quorum request came late).
            last_step, last_t = self._last_commit or (None, None)
            self.emit({"kind": "healed", "replica": self.replica, "rank": self.rank,
                       "step": self.manager.current_step(), "bytes": info["bytes"],
                       "seconds": recv.get("seconds", 0.0) + info["apply_seconds"], "apply_s": info["apply_seconds"],
                       "source_replica": src, "from_step": last_step, **recv.get("striped", {}),
                       "unheard_s": None if last_t is None else time.time() - last_t, "t": time.time()})
        if self.manager.current_step() < self.min_step:
            # The run had reached min_step, and this replica is behind it with nobody to heal
            # from (every group was lost): it must not train on from its initial weights. It
            # waits - the controller loads a durable checkpoint, or a peer comes back.
            if not self._waiting_for_peer:
                self._waiting_for_peer = True
                self.emit({"kind": "waiting_for_peer", "replica": self.replica, "rank": self.rank,
                           "step": self.manager.current_step(), "min_step": self.min_step, "t": time.time()})
            time.sleep(0.5)  # ask for a quorum twice a second, not in a tight loop
            return {"kind": "waiting_for_peer", "step": self.manager.current_step(), "committed": False}
        self._waiting_for_peer = False
        step = self.manager.current_step() + 1
        # A step whose gradient average failed (a peer died in it) is retried with the gradients
        # already computed: data is a pure function of the step, and the parameters have not
        # changed, so recomputing would give the same numbers one step time later.
        retry, self._retry = self._retry, None
        if retry is not None and (retry.step != step or healed):
            retry = None
        t_compute = time.time()
        if retry is None:
            inputs, labels = self.batch(step)
            self.optimizers.zero_grad()
            pred = self.model(inputs)
            n_tokens = torch.tensor(labels.numel(), device=self.device)
            loss, _ = self.loss_fn(pred, labels, n_tokens)
            loss.backward()
            del pred
            grads = [_local(p.grad) for p in self.model.parameters() if p.grad is not None]
            local = torch.cat([g.reshape(-1) for g in grads])
            retry = _Retry(step, float(loss.detach()), local, labels.numel(), time.time() - t_compute)
        else:
            grads = [_local(p.grad) for p in self.model.parameters() if p.grad is not None]
        if fault_point is not None:
            fault_point(step)
        flat = retry.local.clone()  # the average is computed in place; keep our own for a retry
        self.manager.allreduce(flat).wait()
        if self.manager.errored() is not None:
            # A peer failed mid-collective. Drop our connections now: other survivors still
            # blocked on us then fail at once and come to the next quorum, instead of
            # waiting out the timeout while the Lighthouse (which needs at least half the
            # healthy replicas to join) cannot form a quorum without them.
            self._abort_pg()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters()], 1.0, foreach=True)
        committed = self.manager.should_commit()
        if committed:
            self.optimizers.step()
            self.lr_schedulers.step()
            self._last_commit = (step, time.time())
            if self.durable is not None:
                self.durable.after_commit(step, saver=self._is_saver(q))
        elif not self._comms_dead:
            self._retry = retry
        t1 = time.time()
        rec = {"kind": "step", "replica": self.replica, "rank": self.rank, "step": step,
               "loss": retry.loss, "committed": bool(committed),
               "tokens_per_s": retry.tokens / max(retry.compute_s, 1e-9), "seconds": t1 - t0,
               "quorum_id": self._last_quorum_id, "participants": participants, "t": t1}
        self.emit(rec)
        return rec

    def _plain_start(self) -> dict[str, Any] | None:
        """recovery="plain_restart": join the job's process group at the first step; once a
        collective failed (a peer died), stop stepping - the controller restarts the whole job,
        and this rank's failure report would blame the wrong process."""
        self.manager.start_quorum()
        if self.manager.errored() is None:
            return None
        if not self._waiting_for_peer:
            self._waiting_for_peer = True
            self.emit({"kind": "waiting_for_restart", "replica": self.replica, "rank": self.rank,
                       "step": self.manager.current_step(), "error": str(self.manager.errored())[:200],
                       "t": time.time()})
        time.sleep(0.5)
        return {"kind": "waiting_for_restart", "step": self.manager.current_step(), "committed": False}

    def _comms_retry(self, reason: str, rebuild: bool, request_may_linger: bool = False) -> dict[str, Any]:
        """Cross-replica communication broke through no fault of ours (a peer died during the
        quorum or while its process group was built). Keep the process, model, optimizer and
        step, and try the next quorum. ``rebuild``: first rebuild the torchft Manager in place
        (a new replica id, so the next quorum is a new one with a freshly built process group)
        - only when needed, since a new member makes every peer rebuild its group too. Backs
        off while it keeps failing, so a long outage is not a tight loop."""
        self._comms_retries += 1
        self.emit({"kind": "comms_retry", "replica": self.replica, "rank": self.rank, "reason": reason[:300],
                   "attempt": self._comms_retries, "rebuilt": rebuild, "step": self.manager.current_step(),
                   "t": time.time()})
        if rebuild:  # a quorum that never formed may leave its request at the Lighthouse
            self._new_manager(after_timeout=request_may_linger)
        time.sleep(min(0.1 * 2 ** min(self._comms_retries - 1, 5), 2.0))
        return {"kind": "comms_retry", "step": self.manager.current_step(), "committed": False}

    def _pg_error(self) -> str | None:
        err = self.manager.errored() if self.manager is not None else None
        return f"the process group of the new quorum could not be built: {type(err.original_exception).__name__}: " \
               f"{err.original_exception}" if err is not None and hasattr(err, "original_exception") else None

    def _is_saver(self, q: Any) -> bool:
        """The lowest-numbered group of the quorum saves durable checkpoints: every group knows
        the quorum, so exactly one of them saves without anyone telling it."""
        if self.plain:
            return self.replica == 0
        members = [_replica_index(r) for r in q.replica_ids] if q is not None else []
        members = [m for m in members if m is not None]
        return not members or self.replica == min(members)

    def comms_broken(self) -> bool:
        """True once our cross-replica communicator was declared dead (the ``comms`` fault)."""
        return self._comms_dead

    def abort_comms(self) -> None:
        """The ``comms`` fault: this group's cross-replica communicator dies for good."""
        self._comms_dead = True
        self._abort_pg()

    def _abort_pg(self) -> None:
        try:
            self.ft_pg.abort()
        except Exception:
            pass

    def shutdown(self, save_timeout: float | None = None) -> None:
        """Leave the run; a durable save still writing gets ``save_timeout`` s (None: no bound)."""
        if self.durable is not None:
            try:
                self.durable.close(save_timeout)
            except Exception:
                pass
        if self.manager is None:
            return
        if self.plain:
            self.manager.shutdown()
            return
        try:
            seam.shutdown_manager(self.manager)
        except Exception:
            pass
