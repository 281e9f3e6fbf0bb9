"""Semi-synchronous training: torchft's LocalSGD or DiLoCo, built the way torchtitan builds them.

Each group trains on its own; every ``sync_every`` steps (streaming DiLoCo: one of ``fragments``
pieces every sync_every/fragments steps) the groups meet: a quorum (a group that came back heals
there, from a peer), then LocalSGD averages the parameters and DiLoCo the pseudo-gradients (then
its outer Nesterov step), and should_commit. A failed meeting (a peer died in it) is dropped:
LocalSGD keeps its local parameters, DiLoCo goes back to the last ones the groups agreed on.

torchft's objects run inside the optimizer's step (its hooks); torchtitan's
``maybe_semi_sync_training`` and ``fragment_llm`` build them from torchtitan's own config keys
(``semi_sync_method``, ``sync_steps``, ``num_fragments``). This wrapper enters them and says where
a group is: the meetings it committed times the period between meetings, plus its steps since.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import seam

if TYPE_CHECKING:
    from torchft import Manager

    from .rank_parts import RankParts


class SemiSync:
    """LocalSGD or DiLoCo (``cfg["sync"]``) around ``parts``' model and optimizers under ``manager``."""

    def __init__(self, cfg: dict[str, Any], parts: RankParts, manager: Manager) -> None:
        from torchtitan.experiments.torchft.config import FaultTolerance
        from torchtitan.experiments.torchft.diloco import fragment_llm

        ft = FaultTolerance(enable=True, semi_sync_method=str(cfg["sync"]), sync_steps=int(cfg["sync_every"]),
                            num_fragments=int(cfg.get("fragments") or 1),
                            fragment_update_alpha=float((cfg.get("titan") or {}).get("fragment_update_alpha", 0.0)))
        self.manager = manager
        self.period = ft.sync_steps // ft.num_fragments  # steps between two meetings
        self._context = seam.semi_sync_training(ft, manager, parts.model, parts.optimizers, fragment_llm)
        self.algorithm = self._context.__enter__()

    def local_steps(self) -> int:
        """Steps since the last meeting."""
        return seam.semi_sync_local_steps(self.algorithm)

    def step(self) -> int:
        """The step this group is at: committed meetings x period + local steps since the last."""
        return self.manager.current_step() * self.period + self.local_steps()

    def meets_next(self) -> bool:
        """True when the coming optimizer step holds a meeting."""
        return self.local_steps() + 1 == self.period

    def met(self) -> bool:
        """True right after a step whose optimizer step held a meeting (its local count restarts)."""
        return self.local_steps() == 0

    def durable_state(self) -> dict[str, Any]:
        """DiLoCo's state beside the model and the inner optimizers, as tensors DCP saves and
        loads in place: per fragment, the parameters the groups last agreed on and the outer
        optimizer's momentum (LocalSGD keeps nothing else)."""
        return {f"fragment{i}": {"agreed": dict(agreed), "outer": _momentum(outer)}
                for i, (agreed, outer) in enumerate(seam.diloco_fragments(self.algorithm))}

    def restore(self, step: int) -> None:
        """Go on from a checkpoint of ``step``: its meetings counted, its steps since the last."""
        self.manager.load_state_dict({"step": step // self.period, "batches_committed": 0})
        seam.set_semi_sync_local_steps(self.algorithm, step % self.period)

    def reset_communicator(self, left: bool) -> bool:
        """The ladder's ``communicator`` rung: our optimizer hooks hold this Manager, so it is kept;
        the next meeting's quorum gets a new id and every member builds a fresh process group with
        us. A meeting that failed on the dead group counted a commit failure, which asks for that
        new id; a fault between meetings has no collective to fail, so the failure is counted here
        and the next meeting goes ahead with everyone's inner steps. A group that ``left`` the
        quorum needs a new Manager and new hooks: its process is replaced (raises)."""
        if left:
            raise RuntimeError("the group left the quorum; torchft's LocalSGD/DiLoCo hooks hold its Manager: "
                               "the process is replaced")
        if seam.commit_failures(self.manager) == 0:
            seam.count_commit_failure(self.manager)
        return True

    def close(self) -> None:
        """Remove torchft's optimizer hooks."""
        self._context.__exit__(None, None, None)


def _momentum(optimizer: Any) -> dict[str, Any]:
    """The outer SGD's momentum buffers, by position. One not made yet (before the first meeting)
    is made as zeros: with no dampening, SGD's first step then gives exactly what it gives without
    one (the gradient), and a checkpoint always holds, and loads into, the same tensors."""
    import torch

    out = {}
    for g, group in enumerate(optimizer.param_groups):
        if not group.get("momentum") or group.get("dampening", 0):
            continue
        for i, p in enumerate(group["params"]):
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p.detach())
            out[f"{g}.{i}"] = state["momentum_buffer"]
    return out
