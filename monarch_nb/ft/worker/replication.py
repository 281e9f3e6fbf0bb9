"""How a replica group keeps in step with the others: the one interface the train step talks to.

The step (``train_step.py``) is the same code whatever ``on_failure`` says; what differs is who
averages gradients across groups and what happens when a peer fails. Two implementations:
:class:`~.torchft_replication.TorchftReplication` (a torchft Manager: a quorum every step, heals
from a live peer, retries when a peer dies) and :class:`~.plain_replication.PlainReplication`
(on_failure="plain_restart": one process group for the whole job, built once; on a failure the
rank stops and the controller restarts the job). ``start`` tells the step what its quorum gave
it: train (:class:`StepQuorum`), end this step with a record (:class:`NoStep`) or wait
(:class:`MustWait`); the rest are the few Manager calls the step makes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torchft.checkpointing.transport import CheckpointTransport

    from .semi_sync import SemiSync


@dataclass(frozen=True)
class StepQuorum:
    """The quorum this step trains in."""

    participants: int  # groups averaging gradients in this step
    quorum_id: int | None  # the torchft quorum (None: plain_restart has none), for the step record
    healed: bool  # this group's state was just replaced by a heal
    saver: bool  # this group writes the durable checkpoints due at this step
    pending: bool = False  # started asynchronously: the fields above are known after ``settle``


@dataclass(frozen=True)
class NoStep:
    """No quorum this time: the step ends with ``record`` (already reported) and is asked again."""

    record: dict[str, Any]
    manager_replaced: bool = False  # a new Manager: gradients kept for a retry are dropped


@dataclass(frozen=True)
class MustWait:
    """This group may not train now: the step reports ``kind`` once (with ``fields``) and waits."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


class Waitable(Protocol):
    def wait(self) -> Any: ...


class Replication(ABC):
    """One rank's side of cross-group data parallelism, as the train step uses it."""

    transport: CheckpointTransport[Any] | None = None  # what heals move state through (torchft only)
    semi: SemiSync | None = None  # LocalSGD / DiLoCo (torchft only): the groups meet every few steps

    @abstractmethod
    def start(self, last_commit: tuple[int, float] | None) -> StepQuorum | NoStep | MustWait:
        """Start this step's quorum, healing first when behind. ``last_commit``: (step, unix
        time) of this group's last committed step, for the ``healed`` event."""

    def settle(self, quorum: StepQuorum, last_commit: tuple[int, float] | None) -> StepQuorum:
        """After ``should_commit``: the quorum this step really trained in. The same as
        ``quorum`` unless it was started asynchronously (torchft's async quorum: it formed, and
        any heal arrived, while the step computed)."""
        return quorum

    def catch_up(self) -> None:
        """Wait for a quorum started asynchronously (a group behind the run's progress must know
        whether it heals before it may train)."""

    @abstractmethod
    def current_step(self) -> int:
        """The last step this group committed (or healed or loaded to)."""

    @abstractmethod
    def restore_step(self, step: int) -> None:
        """The state now is that of ``step`` (a durable checkpoint was loaded)."""

    @abstractmethod
    def allreduce(self, tensor: torch.Tensor) -> Waitable:
        """Average ``tensor`` over the groups in place; a failure is recorded (``errored``)."""

    @abstractmethod
    def errored(self) -> BaseException | None:
        """The failure of this step's cross-group communication, if any."""

    @abstractmethod
    def should_commit(self) -> bool:
        """Whether every group got through this step (then the optimizer steps)."""

    @abstractmethod
    def abort(self) -> None:
        """Drop this rank's cross-group connections now (a failed collective, the comms fault)."""

    def reset(self, failed_collective: bool = False) -> bool:
        """Rung ``communicator``: replace this rank's cross-group communicator in place, keeping
        the process, model, optimizer and step; the next quorum builds a fresh one.
        ``failed_collective``: the step broke in its collective (the comms fault), so the step
        was not committed. Returns True when the group stayed a member of the quorum throughout
        (the others never dropped it). Raises when this side cannot (the ladder then replaces
        the process)."""
        raise RuntimeError(f"{type(self).__name__} cannot rebuild its communicator in place")

    def go_quiet(self) -> bool:
        """This group leaves after this step: stop telling the quorum's keeper it is alive, while
        its connections stay up for this step's average. True if it did; then the step must not
        be committed (what commits it is gone). The default: it cannot."""
        return False

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the run."""

    def ports(self) -> dict[str, int | None]:
        """The TCP ports this side listens on (the socket audit), by what listens."""
        return {"torchft manager server": None, "checkpoint server": None}
