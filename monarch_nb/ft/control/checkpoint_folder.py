"""A run's checkpoint folder, from the controller: whose it is, and its clean-up.

A run writes its durable checkpoints into one folder (``RunConfig.checkpoint_dir``): by
default ``<run_dir>/checkpoints``; a relative path is taken inside the run directory, as
torchtitan takes ``[checkpoint] folder`` inside its dump folder. Two runs started from one
job file therefore never share a folder. A folder given as an absolute path could still be
shared, so the folder carries its owner in ``manifest.json`` (run id, model, group size),
written by the controller before the first save: a run refuses a folder another run owns
(it would prune, overwrite and resume from that run's checkpoints), and ``FTRun.resume``
refuses to continue from a folder that is not the run's own. Starting from another run's
checkpoint is a separate, named act (``RunConfig.resume_from``), checked here against the
model it was written for. Once no writer is left, saves that never completed are removed
(:func:`remove_torn`), so the newest directory of a stopped run is a complete checkpoint.
Controller side only: workers just write where they are told (:mod:`..worker.checkpointer`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..settings.checkpoint_format import META, CheckpointInfo, latest_complete, list_checkpoints, sync_mismatch

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    """Who owns a checkpoint folder, and for which model its checkpoints were written."""

    run_id: str
    model: str
    group_size: int
    created_t: float = 0.0

    @classmethod
    def read(cls, folder: Path) -> "Manifest | None":
        """The folder's manifest; None when it has none. A damaged one is refused by name."""
        path = folder / MANIFEST
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(run_id=str(data["run_id"]), model=str(data["model"]), group_size=int(data["group_size"]),
                       created_t=float(data.get("created_t", 0.0)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint_dir: {path} is not a readable checkpoint manifest ({exc}); it names the "
                             "run that owns the folder: restore it, or pick another folder") from None


def checkpoint_root(checkpoint_dir: str | None, run_dir: Path) -> Path:
    """Where a run's checkpoints go: ``<run_dir>/checkpoints`` by default, a relative
    ``checkpoint_dir`` inside the run directory (never above it), an absolute one as given."""
    if not checkpoint_dir:
        return run_dir / "checkpoints"
    path = Path(checkpoint_dir).expanduser()
    if path.is_absolute():
        return path.resolve()
    inside = (run_dir / path).resolve()
    if not inside.is_relative_to(run_dir.resolve()):
        raise ValueError(f"checkpoint_dir: {checkpoint_dir!r} leaves the run directory; a relative folder is "
                         "taken inside the run directory (e.g. 'checkpoint'): give an absolute path for a "
                         "folder elsewhere")
    return inside


def claim(folder: Path, run_id: str, model: str, group_size: int, adopt: bool = False) -> Manifest:
    """Make ``folder`` this run's (or confirm it is): refused when another run owns it, or when
    it already holds checkpoints with no owner named (``adopt``: a resumed run's own folder,
    written before manifests existed, is taken as its own)."""
    owner = Manifest.read(folder)
    if owner is not None:
        if owner.run_id != run_id:
            raise ValueError(f"checkpoint_dir: {folder} holds the checkpoints of run {owner.run_id!r}; a run writes "
                             "only into its own folder. Leave checkpoint_dir unset (or relative) for a folder in "
                             "this run's directory; to continue that run use FTRun.resume / `%monarch train "
                             "--resume RUN_DIR`; to start from its weights, name it: resume_from / "
                             "`--resume-from PATH`")
        return owner
    if list_checkpoints(folder) and not adopt:
        raise ValueError(f"checkpoint_dir: {folder} already holds checkpoints that no run claims (no "
                         f"{MANIFEST}); this run would prune and overwrite them. Pick an empty folder, or start "
                         "from them by name with resume_from / `--resume-from PATH`")
    folder.mkdir(parents=True, exist_ok=True)
    mine = Manifest(run_id=run_id, model=model, group_size=group_size, created_t=time.time())
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(asdict(mine)) + "\n", encoding="utf-8")
    tmp.replace(folder / MANIFEST)
    return mine


def own_checkpoint(folder: Path, run_id: str) -> None:
    """``FTRun.resume``: the folder must be this run's (a folder another run owns is refused,
    naming ``resume_from`` for the explicit way)."""
    owner = Manifest.read(folder)
    if owner is not None and owner.run_id != run_id:
        raise ValueError(f"resume: {folder} holds the checkpoints of run {owner.run_id!r}, not of run {run_id!r}; "
                         "a run continues only from its own. To start a new run from that run's weights, say so: "
                         "resume_from / `%monarch train --resume-from PATH`")


def source_checkpoint(path: str, model: str, group_size: int,
                      sync: dict[str, Any] | None = None) -> tuple[CheckpointInfo, str | None]:
    """``resume_from``: the complete checkpoint ``path`` names (a ``step-N`` directory, or a
    folder: its newest complete one) and the run that wrote it; refused, naming the difference,
    when it was written for another model or group size."""
    given = Path(path).expanduser().resolve()
    if not given.exists():
        raise ValueError(f"resume_from: {path} does not exist (the working directory is {Path.cwd()}); pass a "
                         "step-N checkpoint directory or a run's checkpoint folder")
    step_info = next((c for c in list_checkpoints(given.parent) if c.path == given), None)
    checkpoint = step_info if step_info is not None else latest_complete(given)
    if checkpoint is None or not checkpoint.complete:
        raise ValueError(f"resume_from: {path} is no complete checkpoint (a step-N directory with a COMPLETE "
                         "marker) and holds none; a run writes them with checkpoint_every, and when it finishes")
    folder = checkpoint.path.parent
    owner = Manifest.read(folder)
    meta = read_fingerprint(checkpoint)
    for key, ours in (("model", model), ("group_size", group_size)):
        theirs = meta.get(key, getattr(owner, key, None) if owner else None)
        if theirs != ours:
            raise ValueError(f"resume_from: the checkpoint of step {checkpoint.step} in {folder} was written with "
                             f"{key}={theirs!r}, this run has {key}={ours!r}; set {key}={theirs!r} to start "
                             "from it")
    refuse_other_sync(meta, sync or {"sync": "step"}, checkpoint, "resume_from")
    return checkpoint, owner.run_id if owner else meta.get("run_id")


def refuse_other_sync(meta: dict[str, Any], ours: dict[str, Any], checkpoint: CheckpointInfo, what: str) -> None:
    """A checkpoint loads only under the semi-synchronous settings that wrote it: its meeting count
    and DiLoCo's outer state are those of its period and fragments."""
    why = sync_mismatch(meta.get("sync"), ours)
    if why is not None:
        key = why.split(":", 1)[0]
        theirs = (meta.get("sync") or {"sync": "step"}).get(key)
        raise ValueError(f"{what}: the checkpoint of step {checkpoint.step} was written with {key}={theirs!r} and "
                         f"this run has {key}={ours.get(key)!r}; a checkpoint loads under the settings that wrote "
                         f"it (its meeting count and DiLoCo's outer state depend on them): set {key}={theirs!r}")


def read_fingerprint(checkpoint: CheckpointInfo) -> dict[str, Any]:
    """The model fingerprint (and writer's run id) a checkpoint's ``meta.pt`` records."""
    import torch

    try:
        meta = torch.load(checkpoint.path / META, weights_only=False)
        return {**meta.get("fingerprint", {}), "run_id": meta.get("run_id")}
    except Exception as exc:  # missing, truncated or not ours: the checkpoint cannot be trusted
        raise ValueError(f"checkpoint: {checkpoint.path / META} cannot be read ({type(exc).__name__}: "
                         f"{str(exc)[:200]}); this checkpoint is damaged: move its directory away to use the "
                         "one before it") from None


def remove_torn(root: str | Path) -> list[CheckpointInfo]:
    """Remove checkpoint directories newer than the newest complete one (saves that never
    finished: abandoned at a stop, or cut short by a kill). Call only when no writer is left.
    Returns what was removed."""
    newest = latest_complete(root)
    torn = [c for c in list_checkpoints(root) if not c.complete and (newest is None or c.step > newest.step)]
    for c in torn:
        shutil.rmtree(c.path, ignore_errors=True)
    return torn
