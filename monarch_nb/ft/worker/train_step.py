"""One fault-tolerant training step, the same code whatever ``on_failure`` says.

The order is the contract the recovery tests and figures rely on: a durable checkpoint the
controller asked for is loaded; the quorum starts (a recovering group heals there); a group
behind the run's progress with nobody to heal from waits; forward/backward (or the gradients
kept from a step whose average failed); the fault point; the cross-group gradient average,
dropping our connections at once if it failed; clipping; ``should_commit``; optimizer and LR
step; a durable save when due; the step record. What differs between torchft and plain_restart
sits behind :class:`~.replication.Replication`, which tells the step what its quorum gave it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .checkpointer import DurableCheckpointer
from .rank_parts import RankParts
from .rank_state import RankState, local_shard
from .replication import MustWait, NoStep, Replication

if TYPE_CHECKING:
    import torch

    from .semi_sync import SemiSync
    from .torchft_replication import TorchftReplication


def floor_after_meeting(min_step: int, step: int, synced: bool | None) -> int:
    """``min_step`` after a semi-synchronous step. A meeting that moved the count leaves the group
    holding the groups' agreed parameters at ``step``: it has caught up, even where the run had
    reported more - a failed meeting puts its groups back at the meeting before (torchft's DiLoCo
    restores the parameters) and they count those steps again, below the most they reported."""
    return min(min_step, step - 1) if synced else min_step


@dataclass
class _Retry:
    """A computed step whose gradient average failed: what a retry needs to skip the compute."""

    step: int
    loss: float
    local: torch.Tensor  # this rank's flattened local gradients
    tokens: int
    compute_s: float


class TrainStep:
    """Steps ``parts`` (model, optimizer, data) one committed step at a time, and keeps what
    carries from one step to the next: gradients for a retry, the run's progress
    (``min_step``), the last commit, a checkpoint to load. The replication is attached when the
    rank becomes a replica (a warm spare has none yet). ``emit`` takes events; ``phase`` is
    called with the name of each phase of a quorum or heal this rank enters."""

    def __init__(self, parts: RankParts, state: RankState, durable: DurableCheckpointer | None, *,
                 emit: Callable[[dict[str, Any]], None], phase: Callable[[str], None]) -> None:
        self.parts, self.state, self.durable = parts, state, durable
        self.rank = parts.rank
        self.max_norm = float(parts.cfg.get("max_norm", 1.0))  # gradient clipping (torchtitan's training.max_norm)
        self._emit, self._phase = emit, phase
        self.replica: int | None = None
        self.replication: Replication | None = None
        self.min_step = 0  # never train below this step without a heal or a checkpoint (see run)
        self.last_commit: tuple[int, float] | None = None  # (step, unix time) of our last committed step
        self._retry: _Retry | None = None
        self._comms_dead = False
        self.slow_factor = 1.0  # the ``slow`` fault: this rank's own work takes this many times as long
        self._waiting = False
        self._pending_load: str | None = None
        self._loaded_step: int | None = None
        # The group leaves after this step (a drain, a scale-down): its gradients count in the
        # step's average and it goes quiet to the Lighthouse at its quorum (Replication.go_quiet).
        self.leaving = False

    def attach(self, replica: int, replication: Replication) -> None:
        """This rank is now of group ``replica``, averaging through ``replication``."""
        self.replica, self.replication = replica, replication
        if self._loaded_step is not None:  # a spare that loaded a checkpoint before it joined
            replication.restore_step(self._loaded_step)

    def current_step(self) -> int:
        if self.replication is None:
            return 0
        if self.replication.semi is not None:  # LocalSGD / DiLoCo: the Manager counts meetings, not steps
            return self.replication.semi.step()
        return self.replication.current_step()

    def run(self, fault_point: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One fault-tolerant step; returns the step record (also emitted)."""
        import torch

        t0 = time.time()
        if self._pending_load is not None:
            path, self._pending_load = self._pending_load, None
            self.load_checkpoint(path)
        repl = self.replication
        assert repl is not None, "a warm spare does not train"
        if repl.semi is not None:
            return self._run_semi_sync(repl, repl.semi, fault_point, t0)
        self._phase("quorum")
        quorum = repl.start(self.last_commit)
        t_quorum = time.time()
        if isinstance(quorum, MustWait):
            return self._wait(quorum)
        if isinstance(quorum, NoStep):
            if quorum.manager_replaced:
                self._retry = None
            return quorum.record
        if repl.current_step() < self.min_step:
            repl.catch_up()  # an async quorum may heal us to the run's progress: know first
        if repl.current_step() < self.min_step:
            # The run had reached min_step, and this replica is behind it with nobody to heal
            # from (every group was lost): it must not train on from its initial weights. It
            # waits - the controller loads a durable checkpoint, or a peer comes back.
            return self._wait(MustWait("waiting_for_peer", {"min_step": self.min_step}))
        self._waiting = False
        step = repl.current_step() + 1
        # Its last step (it leaves, see ``leaving``): silent to the Lighthouse from here, unless
        # the save of this step would be its own to write.
        quiet = (self.leaving and not quorum.pending
                 and not (self.durable is not None and self.durable.due(step, quorum.saver)) and repl.go_quiet())
        # A step whose gradient average failed (a peer died in it) is retried with the gradients
        # already computed: data is a pure function of the step, and the parameters have not
        # changed, so recomputing would give the same numbers one step time later.
        retry, self._retry = self._retry, None
        if retry is not None and (retry.step != step or quorum.healed):
            retry = None
        if retry is None:
            retry, grads = self._compute(step)
        else:
            grads = self._local_grads()
        if fault_point is not None:
            fault_point(step)
        t_average = time.time()
        self._average(retry.local, grads)
        average_s = time.time() - t_average
        model = self.parts.model
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters()], self.max_norm, foreach=True)
        t_commit = time.time()
        committed = False if quiet else repl.should_commit()  # a quiet group's gradients counted; it leaves
        commit_s = time.time() - t_commit
        quorum = repl.settle(quorum, self.last_commit)
        if committed:
            step = repl.current_step()  # an async quorum's heal moved us to the donors' step
            self.parts.optimizers.step()
            self.parts.lr_schedulers.step()
            self.last_commit = (step, time.time())
            if self.durable is not None:
                self.durable.after_commit(step, saver=quorum.saver)
        else:  # its gradients are intact even when our own collective failed; a group's ranks
            self._retry = retry  # must agree whether to recompute (FSDP gathers in the compute)
        t1 = time.time()
        rec = {"kind": "step", "replica": self.replica, "rank": self.rank, "step": step,
               "loss": retry.loss, "committed": bool(committed),
               "tokens_per_s": retry.tokens / max(retry.compute_s, 1e-9), "seconds": t1 - t0,
               "quorum_id": quorum.quorum_id, "participants": quorum.participants,
               "quorum_s": t_quorum - t0, "average_s": average_s, "commit_s": commit_s, "left": quiet or None,
               "t": t1}
        self._emit(rec)
        return rec

    def _run_semi_sync(self, repl: TorchftReplication, semi: SemiSync, fault_point: Callable[[int], None] | None,
                       t0: float) -> dict[str, Any]:
        """One step of LocalSGD or DiLoCo (``semi_sync.py``): this group's own optimizer step,
        and every ``semi.period`` steps the meeting torchft's hook holds inside it. A group behind
        the run's progress (``min_step``: it came back) trains provisionally - its steps are not
        committed - until a meeting heals it from a peer."""
        import torch

        step = semi.step() + 1
        meeting = semi.meets_next()
        retry, _ = self._compute(step)
        if fault_point is not None:
            fault_point(step)
        torch.nn.utils.clip_grad_norm_([p for p in self.parts.model.parameters()], self.max_norm, foreach=True)
        if meeting:
            repl.offer()  # any member may serve a peer that heals at this meeting (a striped heal)
        meetings = repl.current_step()
        t_meet = time.time()
        self.parts.optimizers.step()  # torchft's hook holds the meeting when it is due
        self.parts.lr_schedulers.step()
        meet_s = time.time() - t_meet
        synced: bool | None = None
        quorum = None
        if semi.met():
            synced = repl.current_step() > meetings  # committed: the count moved (a heal moves it further)
            quorum = repl.formed(self.last_commit)
            if synced:
                step = semi.step()
        self.min_step = floor_after_meeting(self.min_step, step, synced)
        committed = step > self.min_step
        if committed:
            self.last_commit = (step, time.time())
        if synced and committed and quorum is not None and self.durable is not None:
            self.durable.after_commit(step, saver=quorum.saver)  # at meetings only: the state all groups agree on
        t1 = time.time()
        rec = {"kind": "step", "replica": self.replica, "rank": self.rank, "step": step, "loss": retry.loss,
               "committed": committed, "synced": synced,
               "tokens_per_s": retry.tokens / max(retry.compute_s, 1e-9), "seconds": t1 - t0,
               "quorum_id": quorum.quorum_id if quorum else None,
               "participants": quorum.participants if quorum else None,
               "quorum_s": 0.0, "average_s": meet_s if synced is not None else 0.0, "commit_s": 0.0, "t": t1}
        self._emit(rec)
        return rec

    def _local_grads(self) -> list[torch.Tensor]:
        return [local_shard(p.grad) for p in self.parts.model.parameters() if p.grad is not None]

    def _compute(self, step: int) -> tuple[_Retry, list[torch.Tensor]]:
        """Forward and backward on ``step``'s batch: the step's loss and this rank's gradients."""
        import torch

        parts = self.parts
        t_compute = time.time()
        assert self.replica is not None
        parts.optimizers.zero_grad()
        # gradient accumulation (a torchtitan job's global_batch_size): each microbatch's loss is
        # over the step's tokens, so the summed gradients are those of the whole batch, as torchtitan
        n_micro = parts.microbatches
        n_tokens = torch.tensor(parts.batch_size * parts.seq_len * n_micro, device=parts.device)
        total = 0.0
        for micro in range(n_micro):
            inputs, labels = parts.batch(step, self.replica, micro)
            pred = parts.model(inputs)
            loss, _ = parts.loss_fn(pred, labels, n_tokens)
            loss.backward()
            total += float(loss.detach())
            del pred
        grads = self._local_grads()
        local = torch.cat([g.reshape(-1) for g in grads])
        if self.slow_factor > 1.0:  # the ``slow`` fault: a throttled device, as a delay in this rank's own work
            time.sleep((self.slow_factor - 1.0) * (time.time() - t_compute))
        return _Retry(step, total, local, int(n_tokens), time.time() - t_compute), grads

    def _average(self, local: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Average ``local`` over the groups and write the result into ``grads``."""
        assert self.replication is not None
        flat = local.clone()  # the average is computed in place; keep our own for a retry
        self.replication.allreduce(flat).wait()
        if self.replication.errored() is not None:
            # A peer failed mid-collective. Drop our connections now: other survivors still
            # blocked on us then fail at once and come to the next quorum, instead of
            # waiting out the timeout while the Lighthouse (which needs at least half the
            # healthy replicas to join) cannot form a quorum without them.
            self._abort()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _wait(self, wait: MustWait) -> dict[str, Any]:
        """Report ``wait`` once (until a step trains again) and ask again in half a second."""
        assert self.replication is not None
        if not self._waiting:
            self._waiting = True
            self._emit({"kind": wait.kind, "replica": self.replica, "rank": self.rank,
                        "step": self.replication.current_step(), **wait.fields, "t": time.time()})
        time.sleep(0.5)  # ask for a quorum twice a second, not in a tight loop
        return {"kind": wait.kind, "step": self.replication.current_step(), "committed": False}

    # ---- between steps ----------------------------------------------------------------------

    def request_load(self, path: str) -> None:
        """Load checkpoint ``path`` before the next step (the training thread applies it)."""
        self._pending_load = path

    def load_checkpoint(self, path: str) -> int:
        """Replace this replica's state with a durable checkpoint's; returns its step."""
        meta = self.state.read_checkpoint_meta(path)
        t = time.time()
        step = self.state.load_checkpoint(path, meta)
        self._loaded_step = step
        self.min_step = min(self.min_step, step)  # a checkpoint is as good a source as a peer
        if self.replication is not None:
            self.replication.restore_step(step)
        self._retry = None
        self._emit({"kind": "checkpoint_loaded", "replica": self.replica, "rank": self.rank, "step": step,
                    "path": str(path), "seconds": time.time() - t, "digest": self.state.hashes()["params"],
                    "t": time.time()})
        return step

    def comms_broken(self) -> bool:
        """True once our cross-replica communicator was declared dead (the ``comms`` fault),
        until :meth:`repair` replaces it."""
        return self._comms_dead

    def abort_comms(self) -> None:
        """The ``comms`` fault: this group's cross-replica communicator is dead until replaced."""
        self._comms_dead = True
        self._abort()

    def repair(self) -> bool:
        """Rungs ``communicator`` and ``step``, in this process: a new communicator (the next
        quorum builds its group; a heal follows only if the peers moved on), and nothing kept
        from a step that raised (a failed collective keeps its gradients for the retry, as the
        group's other ranks do). Model, optimizer and step stay.
        Returns whether the group stayed a quorum member throughout; raises when the
        replication cannot (plain_restart)."""
        assert self.replication is not None, "a warm spare has no communicator"
        self._abort()  # whatever is left of the old one: peers blocked on us fail at once
        kept = self.replication.reset(failed_collective=self._comms_dead)
        if not self._comms_dead:
            self._retry = None
        self._comms_dead = False
        return kept

    def _abort(self) -> None:
        try:
            if self.replication is not None:
                self.replication.abort()
        except Exception:
            pass
