"""torchtitan's validator for one rank: the held-out loss every ``validate_every`` committed steps.

The validation set is read once, by torchtitan's own ``HuggingFaceTextDataset`` (local files only),
into a token stream; validation batch ``i`` is a pure function of ``i`` (the same windows at
every validation, on every group: the groups' held-out losses are comparable, and identical
groups report identical losses). No gradients, the model in eval mode and back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .rank_parts import RankParts


class HeldOut:
    """Built with the rank when a job's validator is on; :meth:`after` is called after every step."""

    def __init__(self, parts: RankParts, titan: dict[str, Any], data_dir: str) -> None:
        import torch

        self.parts = parts
        self.every = int(titan["validate_every"])
        path = titan.get("validation_path") or str(Path(data_dir) / "validation")
        inputs, labels = parts.read_dataset(titan.get("validation_dataset") or "c4_test", path)
        self.inputs = torch.tensor(inputs, dtype=torch.long)
        self.labels = torch.tensor(labels, dtype=torch.long)
        per_batch = parts.batch_size * parts.seq_len
        available = max(1, self.inputs.numel() // per_batch)
        wanted = int(titan.get("validate_steps", -1))
        self.batches = available if wanted < 0 else wanted  # -1: one pass over the set, as torchtitan

    def _batch(self, i: int) -> tuple[Any, Any]:
        p = self.parts
        usable = self.inputs.numel() - p.seq_len
        starts = [((i * p.batch_size + b) * p.seq_len) % max(usable, 1) for b in range(p.batch_size)]
        return p.windows(self.inputs, self.labels, starts)

    def after(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The ``validated`` event when ``record`` committed a step the validator is due at."""
        import torch

        step = int(record.get("step") or 0)
        if not record.get("committed") or record.get("kind") != "step" or step % self.every:
            return None
        p = self.parts
        t0 = time.time()
        p.model.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for i in range(self.batches):
                    x, y = self._batch(i)
                    loss, _ = p.loss_fn(p.model(x), y, torch.tensor(y.numel(), device=p.device))
                    total += float(loss)
        finally:
            p.model.train()
        return {"kind": "validated", "replica": record.get("replica"), "rank": p.rank, "step": step,
                "loss": total / self.batches, "batches": self.batches, "seconds": time.time() - t0, "t": time.time()}
