"""on_failure="plain_restart": data parallelism across groups as a torchtitan job without torchft.

The baseline users run today: every rank of every group in one job, gradients averaged by a
plain ``torch.distributed`` process group built once at start (torchrun's rendezvous), durable
checkpoints with torch DCP, and on any failure the whole job restarted from the newest one
(torchelastic's answer). No Lighthouse, no Manager, no quorum per step: a plain job does not pay
for them, so the race against peer recovery is against the old way at its best.

This module is each rank's side (the job's store is the controller's,
:mod:`..control.plain_rendezvous`): :class:`PlainReplication` is one of the two
:class:`~.replication.Replication` classes the trainer's step talks to (torchft's is the other),
so the step is the same code in every mode.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

from ..settings.plain_address import PlainAddress
from .replication import MustWait, Replication, StepQuorum

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


class _Done:
    def wait(self) -> bool:
        return True


class PlainReplication(Replication):
    """One rank's share of the job-wide data parallelism: ranks at the same position of every
    group average their gradients (the replicate dimension of HSDP). The process group is built
    at the first step (every rank of the job must arrive: the rendezvous). A failed collective
    (a peer died) is not this rank's fault: it stops stepping and waits for the controller, which
    restarts the whole job."""

    def __init__(self, address: str, replica: int, rank: int, replicas: int, timeout: timedelta,
                 backend: str, phase: Callable[[str], None]) -> None:
        self.address = PlainAddress.parse(address)
        self.replica, self.rank, self.replicas = replica, rank, replicas
        self._timeout, self._backend, self._phase = timeout, backend, phase
        self._pg: ProcessGroup | None = None
        self._error: BaseException | None = None
        self._step = 0
        self.rendezvous_s: float | None = None

    # ---- what the step asks ------------------------------------------------------------------

    def start(self, last_commit: tuple[int, float] | None) -> StepQuorum | MustWait:
        """Join the job's process group at the first step; once a collective failed (a peer
        died), stop stepping - the controller restarts the whole job, and this rank's failure
        report would blame the wrong process. The lowest group saves durable checkpoints."""
        self._join()
        if self._error is not None:
            return MustWait("waiting_for_restart", {"error": str(self._error)[:200]})
        return StepQuorum(participants=self.replicas, quorum_id=None, healed=False, saver=self.replica == 0)

    def _join(self) -> None:
        """Join the job's process group once; a rendezvous that fails (a peer never came) is
        recorded like a failed collective, not raised."""
        if self._pg is None and self._error is None:
            try:
                self._connect()
            except Exception as exc:  # noqa: BLE001
                self._error = exc

    def _connect(self) -> None:
        import torch.distributed as dist

        self._phase("pg_setup")
        t0 = time.time()
        store = dist.TCPStore(self.address.host, self.address.port, is_master=False, wait_for_workers=False,
                              timeout=self._timeout)
        prefixed = dist.PrefixStore(f"plain/{self.address.generation}/rank{self.rank}", store)
        if self._backend == "nccl":
            self._pg = dist.ProcessGroupNCCL(prefixed, self.replica, self.replicas)
        else:
            self._pg = dist.ProcessGroupGloo(prefixed, self.replica, self.replicas, self._timeout)
        self.rendezvous_s = time.time() - t0

    def allreduce(self, tensor: torch.Tensor) -> _Done:
        """Average ``tensor`` over the groups in place; a failure is recorded, not raised."""
        if self._error is not None or self._pg is None:
            return _Done()
        try:
            self._pg.allreduce([tensor]).wait()
            tensor.div_(self.replicas)
        except Exception as exc:  # noqa: BLE001 - a peer died in the collective
            self._error = exc
        return _Done()

    def errored(self) -> BaseException | None:
        return self._error

    def should_commit(self) -> bool:
        if self._error is not None:
            return False
        self._step += 1
        return True

    def current_step(self) -> int:
        return self._step

    def restore_step(self, step: int) -> None:
        self._step = int(step)

    def abort(self) -> None:
        """The ``comms`` fault: this rank's communicator is gone for good."""
        self._error = self._error or RuntimeError("the job's process group was aborted")
        pg, self._pg = self._pg, None
        if pg is not None and hasattr(pg, "abort"):
            try:
                pg.abort()
            except Exception:  # noqa: BLE001
                pass

    def shutdown(self) -> None:
        self._pg = None
