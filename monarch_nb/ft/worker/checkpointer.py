"""Worker side of durable checkpoints: the state a heal moves, written to disk off the critical path.

Peer recovery needs a live peer. When there is none - every group lost at once, the
Lighthouse and the kernel gone - a run continues from a durable checkpoint. One group saves
(the lowest-numbered group in the current quorum: every group knows the quorum, so they agree
without being told), every ``checkpoint_every`` committed steps, with torch's distributed
checkpoint (DCP) ``async_save``: the training thread only stages a copy (the step's stall),
and a background thread writes it. The saved state is exactly what a heal moves: parameters,
optimizer state, optimizer hyper-parameters, LR schedule, and the step (data is a function of
the step, so the data position comes with it).

Layout: ``<checkpoint_dir>/step-0000120/`` holds DCP's files, ``meta.pt`` (step, hyper-
parameters, schedule, and a fingerprint of the model and config) and, written last,
``COMPLETE``. A directory without ``COMPLETE`` (a save interrupted mid-write) is never loaded.
The newest ``checkpoint_keep`` complete checkpoints are kept.

A stopping run lets a save in flight finish (``close(timeout)``); one that cannot finish in
time gets an ``ABANDONED`` marker and a ``checkpoint_abandoned`` event, and the controller
removes its directory once the writer is gone (``remove_torn``), so the newest directory of
a stopped run is always a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from ..settings.checkpoint_format import COMPLETE, ABANDONED, META, list_checkpoints, step_dir

# Test hook: seconds each DCP write sleeps before writing (a slow disk, made on purpose).
SLOW_SAVE_ENV = "MONARCH_NB_TEST_SLOW_SAVE_S"


def _save_errors() -> tuple[type[BaseException], ...]:
    """What a failed save raises: DCP's ``CheckpointException`` is a ``BaseException`` (a write
    that failed in DCP's finish - its directory gone mid-save - escaped ``except Exception`` and
    ended the group's training)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def save_error_text(exc: BaseException) -> str:
    """A failed save's error for its ``checkpoint_failed`` event: DCP wraps what each rank raised
    in one ``CheckpointException`` whose text is a traceback; the rank's own error (a full disk, a
    permission) is named first, so the 300 characters kept say what to fix."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, wrapped = next(iter(failures.items()))
        cause = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        return f"{type(exc).__name__} on rank {rank}: {type(cause).__name__}: {cause}"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested dict/list: what a heal or a checkpoint moves."""
    import torch

    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return local.numel() * local.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class DurableCheckpointer:
    """Worker side: saves the replica's state every ``every`` steps when this group is the saver."""

    def __init__(self, root: str, every: int, keep: int, rank: int, group_size: int,
                 state: Callable[[], dict[str, Any]], meta: Callable[[int], dict[str, Any]],
                 emit: Callable[[dict[str, Any]], None], process_group: Any = None) -> None:
        self.root, self.every, self.keep = Path(root), every, keep
        self.rank, self.group_size = rank, group_size
        self._state, self._meta, self._emit, self._pg = state, meta, emit, process_group
        # (step, DCP's future, start, stall, bytes, when the write ended, the meta of the step)
        self._pending: tuple[int, Future, float, float, int, list[float], dict[str, Any]] | None = None

    def due(self, step: int, saver: bool) -> bool:
        """Whether committing ``step`` starts a save here."""
        return saver and step % self.every == 0

    def after_commit(self, step: int, saver: bool) -> None:
        """Called after every committed step: finish a save that is done, start one when due."""
        self._finish_if_done()
        if not self.due(step, saver):
            return
        if self._pending is not None:  # the previous save is still writing: skip this one
            self._failed(step, f"skipped: the save of step {self._pending[0]} is still writing")
            return
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter

        path = step_dir(self.root, step)
        t0 = time.time()
        try:
            path.mkdir(parents=True, exist_ok=True)
            state = self._state()
            future = dcp.async_save(state, storage_writer=_writer(FileSystemWriter, path),
                                    process_group=self._pg, no_dist=not dist.is_initialized())
        except _save_errors() as exc:  # an unwritable or full disk: the run goes on, the failure is recorded
            self._failed(step, save_error_text(exc))
            return
        written: list[float] = []  # when the write ended (in DCP's writer thread, or at once if it wrote here)
        future.add_done_callback(lambda _: written.append(time.time()))
        stall = time.time() - t0
        # The meta (LR schedule, hyper-parameters) of the step saved, not of the step at which the
        # background write happens to end: a resume must continue the schedule where the weights are.
        meta = self._meta(step) if self.rank == 0 else {}
        self._pending = (step, future, t0, stall, tensor_bytes(state), written, meta)

    def _failed(self, step: int, error: str) -> None:
        self._emit({"kind": "checkpoint_failed", "step": step, "rank": self.rank, "t": time.time(), "error": error})

    def _finish_if_done(self, wait: bool = False) -> None:
        if self._pending is None:
            return
        step, future, t0, stall, nbytes, written, meta = self._pending
        if not wait and not future.done():
            return
        self._pending = None
        path = step_dir(self.root, step)
        try:
            future.result()
            if self.rank == 0:
                mark_complete(path, meta, self.keep)
        except _save_errors() as exc:
            self._failed(step, save_error_text(exc))
            return
        self._emit({"kind": "checkpoint_saved", "step": step, "rank": self.rank, "bytes": nbytes,
                    "seconds": (written[0] if written else time.time()) - t0, "stall": stall, "path": str(path),
                    "t": time.time()})

    def close(self, timeout: float | None = None) -> int | None:
        """The run is stopping: finish a save still writing, waiting at most ``timeout`` seconds
        (None: as long as it takes). Returns the step of a save it had to abandon, else None;
        an abandoned save is marked on disk and reported as ``checkpoint_abandoned``."""
        if self._pending is None:
            return None
        step, future = self._pending[0], self._pending[1]
        try:
            future.exception(timeout=timeout)  # waits; the save's own error is handled below
        except TimeoutError:
            self._pending = None
            reason = f"the run stopped and the write did not finish within {timeout:.1f} s"
            path = step_dir(self.root, step)
            if self.rank == 0:
                (path / ABANDONED).write_text(json.dumps({"step": step, "reason": reason, "t": time.time()}))
            self._emit({"kind": "checkpoint_abandoned", "step": step, "rank": self.rank, "t": time.time(),
                        "reason": reason, "path": str(path)})
            return step
        self._finish_if_done(wait=True)
        return None

    def save_final(self, step: int, extra: dict[str, Any] | None = None, model_only: bool = False) -> dict[str, Any]:
        """The run reached its last step: the state of ``step`` is written now, synchronously
        (after any periodic save still writing), unless a periodic save already holds it.
        Every rank of the group calls it. Returns the ``checkpoint_saved`` record (``saved``
        False, and no event, when a periodic save already holds the step). ``model_only`` (a
        torchtitan job's ``last_save_model_only``): the weights alone, in ``step-N-model``, a
        name no resume picks (it needs the whole state)."""
        self.close(timeout=None)
        path = step_dir(self.root, step)
        if (path / COMPLETE).exists():
            return {"step": step, "path": str(path), "saved": False, **(extra or {})}
        if model_only:
            path = path.with_name(path.name + "-model")
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint.api import CheckpointException

        t0 = time.time()
        path.mkdir(parents=True, exist_ok=True)
        state = self._state()
        if model_only:
            state = {"model": state["model"]}
        try:
            dcp.save(state, storage_writer=FileSystemWriter(str(path)), process_group=self._pg,
                     no_dist=not dist.is_initialized())
        except CheckpointException as exc:  # a BaseException (_save_errors): an error the caller can handle
            raise RuntimeError(f"the final save of step {step} to {path} failed: {save_error_text(exc)}") from exc
        if self.rank == 0:
            mark_complete(path, {**self._meta(step), "model_only": model_only}, self.keep)
        record = {"kind": "checkpoint_saved", "step": step, "rank": self.rank, "bytes": tensor_bytes(state),
                  "seconds": time.time() - t0, "stall": time.time() - t0, "path": str(path), "final": True,
                  "saved": True, **(extra or {}), "t": time.time()}
        self._emit(record)
        return record


def mark_complete(path: Path, meta: dict[str, Any], keep: int) -> None:
    """Rank 0, once DCP's files are written: the meta, then the ``COMPLETE`` marker (a save is
    loadable only from here on), then the oldest complete checkpoints beyond ``keep`` go."""
    import torch

    torch.save(meta, path / META)
    _fsync_dir(path)
    (path / COMPLETE).write_text(json.dumps({"step": meta["step"], "t": time.time()}))
    complete = [c for c in list_checkpoints(path.parent) if c.complete]
    for old in complete[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)


def _writer(base: type, path: Path) -> Any:
    """DCP's file writer; slowed down on purpose when the test hook ``SLOW_SAVE_ENV`` is set."""
    delay = float(os.environ.get(SLOW_SAVE_ENV) or 0)
    if delay <= 0:
        return base(str(path))

    class SlowWriter(base):  # type: ignore[misc, valid-type]
        def write_data(self, plan: Any, planner: Any) -> Any:
            time.sleep(delay)  # the test's slow disk: the write itself takes this long
            return super().write_data(plan, planner)

    return SlowWriter(str(path))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load_into(path: str | Path, state: dict[str, Any], process_group: Any = None) -> dict[str, Any]:
    """Load DCP's tensors into ``state`` in place; returns the checkpoint's ``meta``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not (path / COMPLETE).exists():
        raise ValueError(f"checkpoint: {path} is incomplete (no {COMPLETE}: its write was interrupted)")
    dcp.load(state, checkpoint_id=str(path), process_group=process_group, no_dist=not dist.is_initialized())
    return torch.load(path / META, weights_only=False)
