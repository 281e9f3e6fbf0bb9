"""One rank of one replica group: torchtitan's Llama 3 trained under a torchft Manager (or, for
on_failure="plain_restart", a plain job-wide process group).

Runs inside a worker process (built by :class:`monarch_nb.ft.worker.trainer_actor.TrainerActor`),
never in the controller. :class:`ReplicaTrainer` is what the actor holds; it is made of parts,
one module each: what a rank is made of (``rank_parts``: device, store, model, optimizer,
schedule, data), its state as heals, durable checkpoints and digests see it (``rank_state``),
how its group keeps in step with the others (``replication``: ``torchft_replication`` or
``plain_replication``), and the step itself (``train_step``). A warm spare has all but the
replication, which :meth:`ReplicaTrainer.join` adds.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

from ..settings.plain_address import is_plain
from ..settings.platform import Platform
from .checkpointer import DurableCheckpointer
from .held_out import HeldOut
from .plain_replication import PlainReplication
from .rank_parts import RankParts
from .rank_state import RankState
from .step_profiler import StepProfiler
from .replication import Replication
from .torchft_replication import TorchftReplication
from .train_step import TrainStep

if TYPE_CHECKING:
    from torchft.checkpointing.transport import CheckpointTransport


class _Phases:
    """Calls the phase hook the trainer actor sets once the trainer is built (a holder of its
    own, so the parts that call it hold no reference back to the trainer)."""

    def __init__(self) -> None:
        self.hook: Callable[[str], None] | None = None

    def __call__(self, name: str) -> None:
        hook = self.hook
        if hook is not None:
            hook(name)


class ReplicaTrainer:
    """Build everything in ``__init__``; call :meth:`train_step` in a loop.

    With ``replica=None`` it is a warm spare: model, optimizer and data are built (the
    expensive part: imports and model construction), but there is no torchft Manager yet, so
    the Lighthouse does not know it exists. :meth:`join` makes it replica ``r`` in a moment.

    Args:
        cfg: the run's config dict (``RunConfig`` as the worker receives it).
        replica: this rank's group, or ``None`` for a warm spare.
        rank: this process's rank within its group.
        group_size: processes per group.
        lighthouse: the torchft Lighthouse's address (a plain job's address for
            on_failure="plain_restart"); required unless ``replica`` is ``None``.
        store_port: the group's TCP store port (rank 0 opens it: ``None`` picks a free one).
        data_dir: the tokenizer and ``corpus.jsonl``.
        emit: takes each event this rank reports.
    """

    def __init__(self, cfg: dict[str, Any], *, replica: int | None, rank: int, group_size: int,
                 lighthouse: str | None, store_port: int | None, data_dir: str,
                 emit: Callable[[dict[str, Any]], None]) -> None:
        t0 = time.time()
        self.cfg, self.rank, self.group_size = cfg, rank, group_size
        self.emit = emit
        self._phase = _Phases()
        self.parts = RankParts(cfg, replica=replica, rank=rank, group_size=group_size, store_port=store_port,
                               data_dir=data_dir)
        self.platform: Platform = self.parts.platform
        self.state = RankState(self.parts)
        self.durable: DurableCheckpointer | None = None
        if cfg.get("checkpoint_every"):
            self.durable = self.state.checkpointer(int(cfg["checkpoint_every"]), emit)
        self.steps = TrainStep(self.parts, self.state, self.durable, emit=emit, phase=self._phase)
        titan = cfg.get("titan") or {}
        self.profiler: StepProfiler | None = None  # a torchtitan job's profiler section
        if titan.get("profile_freq"):
            self.profiler = StepProfiler(cfg, replica, rank, self.steps.current_step)
        self.held_out = HeldOut(self.parts, titan, data_dir) if titan.get("validate_every") else None
        self.replication: Replication | None = None
        if replica is not None:
            assert lighthouse is not None
            self.join(replica, lighthouse)
        self.init_seconds = time.time() - t0

    def join(self, replica: int, lighthouse: str) -> float:
        """Become replica ``replica``: a torchft Manager that joins the next quorum (and heals
        from a peer there). Returns the seconds it took."""
        t0 = time.time()
        if is_plain(lighthouse):  # on_failure="plain_restart": no torchft at all (plain_replication.py)
            replication: Replication = PlainReplication(
                lighthouse, replica, self.rank, int(self.cfg["replicas"]),
                timedelta(seconds=float(self.cfg.get("pg_timeout_s", 10))), self.platform.backend, self._phase)
        else:
            replication = TorchftReplication(self.parts, self.state, replica=replica, lighthouse=lighthouse,
                                             phase=self._phase, emit=self.emit)
        self.replication = replication
        self.steps.attach(replica, replication)
        return time.time() - t0

    @property
    def replica(self) -> int | None:
        return self.steps.replica

    @property
    def min_step(self) -> int:
        """The run's progress: below it this replica trains only after a heal or a checkpoint."""
        return self.steps.min_step

    @min_step.setter
    def min_step(self, step: int) -> None:
        self.steps.min_step = step

    @property
    def transport(self) -> CheckpointTransport[Any] | None:
        """What heals move state through (the ``corrupt`` fault reaches it); None without torchft."""
        return self.replication.transport if self.replication is not None else None

    @property
    def phase_hook(self) -> Callable[[str], None] | None:
        """Called with the name of each phase of a quorum or heal this rank enters
        (faults.PHASES): where faults aimed at a moment of a recovery fire (set by the actor)."""
        return self._phase.hook

    @phase_hook.setter
    def phase_hook(self, hook: Callable[[str], None] | None) -> None:
        self._phase.hook = hook

    # ---- what the trainer actor calls ------------------------------------------------------

    def train_step(self, fault_point: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One fault-tolerant step; returns the step record (also emitted)."""
        record = self.steps.run(fault_point)
        if self.profiler is not None and record.get("committed"):
            self.profiler.step()
        if self.held_out is not None and (validated := self.held_out.after(record)) is not None:
            self.emit(validated)
        return record

    def current_step(self) -> int:
        return self.steps.current_step()

    def hashes(self) -> dict[str, str]:
        """Digests of this rank's parameters and optimizer state (incl. hyper-parameters)."""
        return self.state.hashes()

    def request_load(self, path: str) -> None:
        """Load checkpoint ``path`` before the next step (the training thread applies it)."""
        self.steps.request_load(path)

    def load_checkpoint(self, path: str) -> int:
        """Replace this replica's state with a durable checkpoint's; returns its step."""
        return self.steps.load_checkpoint(path)

    def save_final(self) -> dict[str, Any]:
        """The run reached its last step: write this step's state as a durable checkpoint into
        the run's checkpoint folder (every rank of the saving group calls this; periodic
        checkpoints on or off). Returns the step, path and parameter digest of what is on disk."""
        saver = self.durable or self.state.checkpointer(0, self.emit)
        model_only = bool((self.cfg.get("titan") or {}).get("last_save_model_only"))
        return saver.save_final(self.current_step(), {"replica": self.replica, "digest": self.hashes()["params"]},
                                model_only=model_only)

    def listening(self) -> dict[str, int | None]:
        """The TCP ports this rank's torchft parts listen on (what ``ss -ltnp`` shows)."""
        ports = self.replication.ports() if self.replication is not None else {}
        return {"torchft manager server": ports.get("torchft manager server"),
                "tcp store": self.parts.store_port if self.rank == 0 else None,
                "checkpoint server": ports.get("checkpoint server")}

    def comms_broken(self) -> bool:
        """True once our cross-replica communicator was declared dead (the ``comms`` fault)."""
        return self.steps.comms_broken()

    def abort_comms(self) -> None:
        """The ``comms`` fault: this group's cross-replica communicator is dead until replaced."""
        self.steps.abort_comms()

    def repair(self) -> bool:
        """A new cross-replica communicator in this process, the broken step dropped (the
        ladder's ``communicator`` and ``step`` rungs); returns whether the group stayed a quorum
        member throughout."""
        return self.steps.repair()

    def training_ended(self) -> None:
        """The training thread leaves its loop: what it alone may stop (the profiler) stops."""
        if self.profiler is not None:
            self.profiler.close()

    def shutdown(self, save_timeout: float | None = None) -> None:
        """Leave the run; a durable save still writing gets ``save_timeout`` s (None: no bound)."""
        if self.durable is not None:
            try:
                self.durable.close(save_timeout)
            except Exception:
                pass
        if self.replication is not None:
            self.replication.shutdown()
