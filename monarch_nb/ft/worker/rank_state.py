"""A rank's training state as the things that move it see it: heals, durable checkpoints, digests.

One state, three readers. torchft moves it between peers in a heal: it is read live at transfer
time (parameters, optimizer state, param-group hyper-parameters, LR scheduler) and loaded in
place, so a healed group is bit-identical to its donors - torchtitan 0.3.0's
``TorchFTOptimizersContainer`` served a state dict cached at start-up, so a healed group got a
stale learning rate and silently diverged. Durable checkpoints (DCP, ``checkpointer.py``) save
and load the same tensors, with the hyper-parameters, schedule and a fingerprint of model and
config in their meta. ``hashes`` digests it all, so the controller can prove replicas equal.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .checkpointer import DurableCheckpointer, load_into, tensor_bytes
from .rank_parts import RankParts

if TYPE_CHECKING:
    import torch

    from .semi_sync import SemiSync


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _copy_in(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Load ``src`` into ``dst``; nothing to do when a striped heal already wrote it there."""
    if not (src.device == dst.device and src.data_ptr() == dst.data_ptr() and src.shape == dst.shape):
        dst.copy_(src)


def _hash_tensor(h: hashlib.blake2b, t: torch.Tensor) -> None:
    import torch

    t = local_shard(t).detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h.update(str((t.dtype, tuple(t.shape))).encode())
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes())


class RankState:
    """Reads and replaces the training state of ``parts`` (model, optimizers, LR schedule)."""

    def __init__(self, parts: RankParts) -> None:
        self.parts = parts
        self.semi: SemiSync | None = None  # LocalSGD / DiLoCo: their own state is in checkpoints too
        # What the last heal loaded (seconds to apply, bytes), until the step reports it.
        self._healed: dict[str, Any] | None = None

    # ---- heals: what torchft moves between peers (read live, loaded in place) -----------------

    def state_dict(self) -> dict[str, Any]:
        """The state a donor serves (torchft's ``state_dict`` callback)."""
        p = self.parts
        model = {n: local_shard(t).detach() for n, t in p.named_parameters()}
        optim_state: dict[str, dict[str, Any]] = {}
        for key, param, opt in p.named_optim_state():
            optim_state[key] = {k: (local_shard(v).detach() if hasattr(v, "detach") else v)
                                for k, v in opt.state.get(param, {}).items()}
        return {"model": model, "optim": optim_state, "param_groups": self._param_groups(),
                "lr_schedulers": p.lr_schedulers.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace ours with a donor's, in place (torchft's ``load_state_dict`` callback)."""
        import torch

        p = self.parts
        t = time.time()
        with torch.no_grad():
            for n, param in p.named_parameters():
                _copy_in(local_shard(param), state["model"][n])
            for key, param, opt in p.named_optim_state():
                mine = opt.state.setdefault(param, {})
                for k, v in state["optim"][key].items():
                    if k in mine and isinstance(mine[k], torch.Tensor):
                        _copy_in(local_shard(mine[k]), v)
                    else:
                        mine[k] = v.clone() if isinstance(v, torch.Tensor) else v
            self._update_param_groups(state["param_groups"])
        p.lr_schedulers.load_state_dict(state["lr_schedulers"])
        self._healed = {"apply_seconds": time.time() - t, "bytes": tensor_bytes(state)}

    def take_healed(self) -> dict[str, Any] | None:
        """What the heal since the last call loaded (``apply_seconds``, ``bytes``); None: no heal."""
        healed, self._healed = self._healed, None
        return healed

    def _param_groups(self) -> list[list[dict[str, Any]]]:
        return [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                for opt in self.parts.optimizers.optimizers]

    def _update_param_groups(self, groups: list[list[dict[str, Any]]]) -> None:
        for opt, theirs_groups in zip(self.parts.optimizers.optimizers, groups):
            for mine, theirs in zip(opt.param_groups, theirs_groups):
                mine.update(theirs)

    # ---- durable checkpoints (checkpointer.py): the same state, for DCP ------------------------

    def durable_state(self) -> dict[str, Any]:
        """Tensors DCP saves and loads in place: parameters and optimizer state (DTensors stay
        DTensors, so DCP writes each FSDP shard once)."""
        p = self.parts
        model = {n: t.detach() for n, t in p.named_parameters()}
        optim = {key: {k: v.detach() for k, v in opt.state.get(param, {}).items() if hasattr(v, "detach")}
                 for key, param, opt in p.named_optim_state()}
        state = {"model": model, "optim": optim}
        if self.semi is not None:
            state["semi"] = self.semi.durable_state()
        return state

    def fingerprint(self) -> dict[str, Any]:
        from ..settings.checkpoint_format import fingerprint

        return fingerprint(self.parts.cfg, {n: tuple(t.shape) for n, t in self.parts.named_parameters()})

    def durable_meta(self, step: int) -> dict[str, Any]:
        return {"step": step, "param_groups": self._param_groups(),
                "lr_schedulers": self.parts.lr_schedulers.state_dict(),
                "fingerprint": self.fingerprint(), "run_id": self.parts.cfg.get("run_id")}

    def checkpointer(self, every: int, emit: Callable[[dict[str, Any]], None]) -> DurableCheckpointer:
        """A durable checkpoint writer for this rank (``every``: committed steps between saves;
        0 for a writer only used for the final save)."""
        p = self.parts
        return DurableCheckpointer(str(p.cfg["checkpoint_dir"]), every, int(p.cfg.get("checkpoint_keep", 3)), p.rank,
                                   p.group_size, self.durable_state, self.durable_meta, emit, p.ckpt_pg)

    def read_checkpoint_meta(self, path: str) -> dict[str, Any]:
        """Checkpoint ``path``'s meta; ``ValueError`` if another model or config wrote it."""
        import torch

        from ..settings.checkpoint_format import META, mismatch

        meta = torch.load(Path(path) / META, weights_only=False)
        why = mismatch(meta.get("fingerprint", {}), self.fingerprint())
        if why is not None:
            raise ValueError(f"checkpoint {path} was written by a different model or config: {why}")
        return meta

    def load_checkpoint(self, path: str, meta: dict[str, Any]) -> int:
        """Replace this rank's state with checkpoint ``path``'s (``meta``: its checked meta);
        returns its step."""
        load_into(path, self.durable_state(), self.parts.ckpt_pg)
        self._update_param_groups(meta["param_groups"])
        self.parts.lr_schedulers.load_state_dict(meta["lr_schedulers"])
        return int(meta["step"])

    # ---- digests ----------------------------------------------------------------------------

    def hashes(self) -> dict[str, str]:
        """Digests of this rank's parameters and optimizer state (incl. hyper-parameters)."""
        p = self.parts
        hp = hashlib.blake2b(digest_size=12)
        for n, param in p.named_parameters():
            hp.update(n.encode())
            _hash_tensor(hp, param)
        ho = hashlib.blake2b(digest_size=12)
        for key, param, opt in p.named_optim_state():
            ho.update(key.encode())
            for k, v in sorted(opt.state.get(param, {}).items()):
                ho.update(k.encode())
                if hasattr(v, "detach"):
                    _hash_tensor(ho, v)
                else:
                    ho.update(repr(v).encode())
        for opt in p.optimizers.optimizers:
            for g in opt.param_groups:
                ho.update(repr(sorted((k, v) for k, v in g.items() if k != "params")).encode())
        if p.cfg.get("sync", "step") != "step":  # LocalSGD / DiLoCo: each group's optimizer is its own
            return {"params": hp.hexdigest(), "optim": "each group's own (semi-synchronous)"}
        return {"params": hp.hexdigest(), "optim": ho.hexdigest()}
