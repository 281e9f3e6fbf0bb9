"""How a run is opened: new, resumed, or started from another run's checkpoint.

Everything here is checked before any process starts and before the run writes anything
but its own checkpoint folder's manifest: a new run's name is one directory under the runs
root that holds no run yet; ``resume_from`` names a complete checkpoint written for this
model and group size; ``FTRun.resume`` continues only a fault-tolerant run's own log from its
own newest complete checkpoint; and ``steps`` lies beyond the checkpoint a run starts from.
Each refusal names the field and the way out. :class:`RunPlace` is what the run keeps.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from ...session import runs_root
from ...telemetry import EventStore
from ...telemetry.events import Resumed, RunStarted
from ..settings.checkpoint_format import CheckpointInfo, latest_complete, list_checkpoints, sync_settings
from ..settings.config import RESTARTS, RunConfig, current_names
from .checkpoint_folder import (checkpoint_root, claim, own_checkpoint, read_fingerprint, refuse_other_sync,
                                source_checkpoint)


@dataclasses.dataclass(frozen=True)
class RunPlace:
    """Where a run lives and what it starts from."""

    run_id: str
    run_dir: Path
    checkpoint_dir: Path  # the run's own folder for durable checkpoints
    resume_from: CheckpointInfo | None = None  # the checkpoint the run starts from, if any
    resume_source: str | None = None  # the run that wrote resume_from, when it is another run

    def resumed_event(self, config: RunConfig) -> Resumed | None:
        """The ``resumed`` event a start records (None: the run starts from scratch)."""
        if self.resume_from is None:
            return None
        named = config.resume_from is not None and self.resume_source != self.run_id
        return Resumed(step=self.resume_from.step, checkpoint=str(self.resume_from.path),
                       reason=f"resume_from {config.resume_from}" if named else "FTRun.resume",
                       source_run=self.resume_source if named else None)


def new_run(cfg: RunConfig) -> RunPlace:
    """A new run's id and directory (refused outside the runs root, or where a run already
    is), and the checkpoint ``resume_from`` names, if any."""
    run_id = cfg.run_name or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    root = runs_root(cfg.runs_root)
    run_dir = root / run_id
    if run_dir.resolve().parent != root:  # validate() allows one plain component; never leave root
        raise ValueError(f"run_name: {run_id!r} would put the run outside {root}; a run name is one "
                         "directory name")
    if (run_dir / "events.jsonl").exists():
        raise ValueError(f"run_name: {run_id!r} already exists under {root}; pick another name, or "
                         f"continue that run: `%monarch train --resume {run_dir}` "
                         "(FTRun.resume(run_dir))")
    checkpoint_dir = checkpoint_root(cfg.checkpoint_dir, run_dir)
    if not cfg.resume_from:
        return RunPlace(run_id, run_dir, checkpoint_dir)
    checkpoint, source = source_checkpoint(cfg.resume_from, cfg.model, cfg.group_size,
                                           sync_settings(cfg.to_dict()))
    refuse_steps_at_or_below(cfg.steps, checkpoint.step)
    return RunPlace(run_id, run_dir, checkpoint_dir, checkpoint, source)


def resumed_run(run_dir: Path, checkpoint: CheckpointInfo, cfg: RunConfig) -> RunPlace:
    """The place of a run ``FTRun.resume`` continues (checked by :func:`resume_point`)."""
    return RunPlace(run_dir.name, run_dir, checkpoint_root(cfg.checkpoint_dir, run_dir), checkpoint)


def claim_checkpoint_folder(place: RunPlace, cfg: RunConfig, resumed: bool) -> None:
    """Before anything starts: the run's checkpoint folder, writable, owned by no other run
    (a resumed run adopts its own folder even when it predates manifests). A run that can
    write no checkpoint (no ``checkpoint_every``, no last step, peer recovery) and names no
    folder claims none."""
    if not (cfg.checkpoint_every or cfg.steps is not None or cfg.on_failure in RESTARTS or resumed
            or cfg.checkpoint_dir is not None):
        return
    try:
        claim(place.checkpoint_dir, place.run_id, cfg.model, cfg.group_size, adopt=resumed)
    except OSError as exc:
        raise ValueError(f"checkpoint_dir: {place.checkpoint_dir} is not writable ({exc.strerror or exc}); "
                         "pick a directory you can write") from None


def recorded_fields(recorded: dict[str, Any]) -> dict[str, Any]:
    """The RunConfig fields of a run's recorded config (``run_started``), older names read under
    their names now; what the controller added for its workers (``run_dir``, ...) is left out."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    return {k: v for k, v in current_names(recorded).items() if k in fields}


def recorded_config(run_dir: Path, overrides: dict[str, Any]) -> RunConfig:
    """A resume's first checks: the run's directory and log, and its saved config with
    ``overrides`` applied (also where a detached run is placed again, before its host starts)."""
    log = run_dir / "events.jsonl"
    if not log.is_file():
        raise ValueError(f"resume: {run_dir} is not a run directory (no events.jsonl); pass the directory "
                         "a run wrote (run.run_dir)")
    started = EventStore.open(log).events(RunStarted)
    if not started:
        raise ValueError(f"resume: {log} records no run_started; it is not a fault-tolerant run's log")
    if overrides.get("resume_from"):
        raise ValueError("resume_from: FTRun.resume continues a run from its own checkpoints; to start a new "
                         "run from another run's checkpoint, pass resume_from to a new FTRun instead")
    saved = recorded_fields(started[-1].config)  # type: ignore[attr-defined]
    saved.update(overrides, resume_from=None)  # where it started from is history now
    return RunConfig.from_dict(saved)


def resume_point(run_dir: str | Path, overrides: dict[str, Any]) -> tuple[RunConfig, Path, CheckpointInfo]:
    """``FTRun.resume``'s checks: the run's directory and log, its saved config with
    ``overrides`` applied, and its own newest complete checkpoint, written for this model."""
    run_dir = Path(run_dir).resolve()
    cfg = recorded_config(run_dir, overrides)
    root = checkpoint_root(cfg.checkpoint_dir, run_dir)
    own_checkpoint(root, run_dir.name)
    checkpoint = latest_complete(root)
    if checkpoint is None:
        incomplete = len(list_checkpoints(root))
        extra = f" ({incomplete} incomplete: interrupted mid-write)" if incomplete else ""
        raise ValueError(f"resume: no complete checkpoint under {root}{extra}; a run writes them with "
                         "RunConfig(checkpoint_every=K), and when it finishes its steps")
    meta = read_fingerprint(checkpoint)
    for key in ("model", "group_size"):
        if meta.get(key) != getattr(cfg, key):
            raise ValueError(f"resume: the checkpoint of step {checkpoint.step} was written with {key}="
                             f"{meta.get(key)!r}, this config has {key}={getattr(cfg, key)!r}")
    refuse_other_sync(meta, sync_settings(cfg.to_dict()), checkpoint, "resume")
    refuse_steps_at_or_below(cfg.steps, checkpoint.step)
    return cfg, run_dir, checkpoint


def refuse_steps_at_or_below(steps: int | None, checkpoint_step: int) -> None:
    """A resumed run trains on from its checkpoint: ``steps`` (the last step) must lie beyond it."""
    if steps is not None and steps <= checkpoint_step:
        raise ValueError(f"steps: the checkpoint is at step {checkpoint_step} and steps={steps} would train none; "
                         f"pass steps > {checkpoint_step} (`--steps {checkpoint_step + 50}`), or None to train "
                         "until stopped")
