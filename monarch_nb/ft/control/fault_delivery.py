"""How an injected fault reaches its target: ``FaultDelivery``.

The injector (:mod:`.injector`) decides what fires where and when; this is the last hop. A
process fault (kill, exception, hang, comms, ...) is armed inside the target rank through its
actor's ``inject`` endpoint, and fires there at its step or phase. A cluster fault (preempt,
node_down on SLURM; pod_delete, evict, node_notready on Kubernetes) goes through the scheduler
that holds the group's allocation, so it exists only for runs on that scheduler. ``disarm`` takes back every armed fault that has not fired.
Every call is bounded: a group that cannot answer has no fault left to fire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..settings.config import RunConfig
from ..settings.faults import Fault, FaultKind, record_firing
from .groups import HEALING, TRAINING, GroupTable

if TYPE_CHECKING:
    from ...session import Session

CALL_TIMEOUT_S = 10.0  # how long arming or disarming one group may take


class FaultDelivery:
    """Arms, fires and disarms faults in a run's groups.

    Args:
        config: the run's config (``group_size``, ``job``).
        groups: the run's group table.
        fault_log: the run's ``faults.jsonl``; a cluster fault records its firing there.
        session: the run's session now (a run makes its own when it starts).
    """

    def __init__(self, config: RunConfig, groups: GroupTable, fault_log: str,
                 session: Callable[[], Session | None]) -> None:
        self.config, self.groups, self.fault_log = config, groups, fault_log
        self._session = session

    def _live_session(self) -> Session:
        session = self._session()
        assert session is not None, "faults reach only a started run"
        return session

    def arm(self, fault: Fault) -> int | None:
        """Arm ``fault`` in its target rank; returns the step it is due at."""
        g = self.groups[fault.replica]
        if fault.kind is FaultKind.SLOW:  # every rank of the group: it is the group that is slow
            self._live_session().deadline(g.actors, CALL_TIMEOUT_S).slow.call(float(fault.factor))
            return g.step
        actors = g.actors.slice(gpus=fault.rank) if self.config.group_size > 1 else g.actors
        res = self._live_session().deadline(actors, CALL_TIMEOUT_S).inject.call(
            fault.kind.value, fault.at_step, fault.hang_s, fault.during, fault.stuck)
        return next(iter(res.values.values()), None)

    def through_scheduler(self, fault: Fault, announce: Callable[[int], None] | None = None) -> int | None:
        """A cluster fault, through the scheduler holding the group's allocation (each allocation
        names the kinds its scheduler can deliver). ``announce(step)`` runs just before it is
        sent: the cluster's watch may see the fault before the call returns, and the injection
        must be in the run's log before the failure it causes."""
        g = self.groups[fault.replica]
        allocation = self._live_session().mesh(g.name).allocation
        kinds = getattr(allocation, "cluster_faults", ())
        if fault.kind.value not in kinds:
            needs = "SLURM allocations (job='slurm')" if fault.kind.value in ("preempt", "node_down") \
                else "Kubernetes pods (job='kubernetes')"
            raise ValueError(f"kind: {fault.kind.value} needs a run on {needs}; this run's job is {self.config.job!r}")
        record_firing(self.fault_log, {"kind": "fault_fired", "fault": fault.kind.value, "replica": fault.replica,
                                       "rank": fault.rank, "step": g.step, "job_id": allocation.job_id})
        step = g.step
        if announce is not None:
            announce(step)
        allocation.cluster_fault(fault.kind.value)
        return step

    def disarm(self) -> int:
        """Drop every armed fault that has not fired yet, in every training or healing group;
        returns how many were dropped."""
        dropped = 0
        for g in self.groups.active():
            if g.actors is None or g.state not in (TRAINING, HEALING):
                continue
            try:
                result = self._live_session().deadline(g.actors, CALL_TIMEOUT_S).disarm.call()
                dropped += sum(result.values.values())
            except Exception:
                continue  # a group that cannot answer has no fault left to fire
        return dropped
