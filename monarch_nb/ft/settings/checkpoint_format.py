"""The on-disk format of a durable checkpoint, read by the controller and written by workers.

Layout: ``<checkpoint_dir>/step-0000120/`` holds torch DCP's files, ``meta.pt`` (step, hyper-
parameters, LR schedule, and a fingerprint of the model and its split) and, written last,
``COMPLETE``. A directory without ``COMPLETE`` (a save interrupted mid-write) is never loaded;
one a stopping run gave up on also holds ``ABANDONED``. The writer is
:mod:`monarch_nb.ft.worker.checkpointer`; the folder's owner and its clean-up are the
controller's (:mod:`monarch_nb.ft.control.checkpoint_folder`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETE = "COMPLETE"
ABANDONED = "ABANDONED"
META = "meta.pt"


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int

    @property
    def complete(self) -> bool:
        return (self.path / COMPLETE).exists()


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:07d}"


def list_checkpoints(root: str | Path) -> list[CheckpointInfo]:
    """Every checkpoint directory under ``root``, oldest first (complete or not)."""
    out = []
    for child in sorted(Path(root).glob("step-*")) if Path(root).is_dir() else []:
        try:
            out.append(CheckpointInfo(child, int(child.name.split("-", 1)[1])))
        except ValueError:
            continue
    return sorted(out, key=lambda c: c.step)


def latest_complete(root: str | Path) -> CheckpointInfo | None:
    """The newest checkpoint whose write finished; ones interrupted mid-write are skipped."""
    return next((c for c in reversed(list_checkpoints(root)) if c.complete), None)


def fingerprint(cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """What must match for a checkpoint to load: the model and how it is split."""
    digest = hashlib.blake2b(json.dumps(sorted(shapes.items())).encode(), digest_size=8).hexdigest()
    return {"model": cfg.get("model"), "group_size": cfg.get("group_size"), "parameters": len(shapes),
            "shapes": digest, "sync": sync_settings(cfg)}


def sync_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """How the groups meet, as a checkpoint records it: a LocalSGD/DiLoCo checkpoint's meeting
    count and outer state only mean something under the same settings."""
    sync = cfg.get("sync") or "step"
    return {"sync": sync} if sync == "step" else {"sync": sync, "sync_every": cfg.get("sync_every"),
                                                  "fragments": cfg.get("fragments") or 1}


def sync_mismatch(saved: dict[str, Any] | None, ours: dict[str, Any]) -> str | None:
    """``sync_every: the checkpoint has 4, this run has 8`` (the first setting that differs), or
    None; a checkpoint from before these were recorded was written by a synchronous run."""
    saved = saved or {"sync": "step"}
    for key in ("sync", "sync_every", "fragments"):
        if saved.get(key) != ours.get(key):
            return f"{key}: the checkpoint has {saved.get(key)!r}, this run has {ours.get(key)!r}"
    return None


def mismatch(saved: dict[str, Any], ours: dict[str, Any]) -> str | None:
    """A sentence naming what differs between a checkpoint's fingerprint and ours, or None."""
    for key in ("model", "group_size", "parameters", "shapes"):
        if saved.get(key) != ours.get(key):
            what = "parameter shapes" if key == "shapes" else key
            return f"{what}: the checkpoint has {saved.get(key)!r}, this run has {ours.get(key)!r}"
    return sync_mismatch(saved.get("sync"), ours.get("sync") or {"sync": "step"})
