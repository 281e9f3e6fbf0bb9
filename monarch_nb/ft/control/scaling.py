"""Resizing a run while it trains: ``Scaler`` (``FTRun.scale``, ``FTRun.drain``).

A new group comes from a warm spare when one is ready, else from fresh processes, and heals
from a peer like a group that failed; a surplus group (the newest first) leaves at a step
boundary and is recorded as retired, not failed. A drain is a planned move: a replacement group
joins and commits a step with the others while the drained group still trains, then the drained
group leaves (so no quorum goes without its data before the replacement is in). One resize or
drain at a time (``Scaler._lock``).
A plain_restart job has a fixed world size (one process group over every group, as under
torchrun) and is never resized; ``scaled`` records each resize.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ...telemetry import EventStore
from ...telemetry.events import Drained, Draining, Scaled
from ..settings.config import MAX_GROUPS, RunConfig
from .groups import TRAINING, GroupTable
from .supervisor import Supervisor


class Scaler:
    """Grows and shrinks a run's group table through its supervisor.

    Args:
        config: the run's config (``min_replicas``, ``spares``, ``on_failure``).
        groups: the run's group table.
        events: the run's event store; ``scaled`` goes there.
        wait_for_step: the run's ``wait_for_step(step, replicas, timeout)``: a grow given a
            timeout blocks until the new groups commit a step.
    """

    def __init__(self, config: RunConfig, groups: GroupTable, events: EventStore,
                 wait_for_step: Callable[[int, list[int] | None, float], None]) -> None:
        self.config, self.groups, self.events = config, groups, events
        self._wait_for_step = wait_for_step
        self._lock = threading.Lock()  # one scale() at a time

    def scale(self, replicas: int, timeout: float | None, supervisor: Supervisor | None) -> Scaled:
        """Resize to ``replicas`` groups (``supervisor`` None: the run is not running)."""
        cfg = self.config
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ValueError(f"replicas: must be an integer, got {replicas!r}")
        if supervisor is None:
            raise RuntimeError("scale: the run is not running (start() it first; a stopped run cannot be resized)")
        if cfg.on_failure == "plain_restart":
            raise ValueError("scale: a plain_restart job has a fixed world size (one process group over every "
                             "group, as under torchrun); resize a run with on_failure='peer'")
        if not cfg.min_replicas <= replicas <= MAX_GROUPS - cfg.spares:
            raise ValueError(f"replicas: {replicas} is not allowed; allowed: {cfg.min_replicas} (min_replicas) "
                             f"to {MAX_GROUPS - cfg.spares}")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("scale: a scale is already in progress; wait for it to finish")
        try:
            active = self.groups.active()
            added: list[int] = []
            retired: list[int] = []
            if replicas > len(active):
                for _ in range(replicas - len(active)):
                    g = self.groups.add()
                    supervisor.add_group(g)
                    added.append(g.index)
                if timeout is not None:
                    self._wait_for_step(max(g.step for g in active) + 1, added, timeout)
            for g in sorted(active, key=lambda g: -g.index)[:max(0, len(active) - replicas)]:
                supervisor.retire(g)
                retired.append(g.index)
            event = Scaled(replicas=replicas, added=added, retired=retired)
            self.events.append(event)
            return event
        finally:
            self._lock.release()

    def drain(self, replica: int, timeout: float, supervisor: Supervisor | None, reason: str = "",
              leave_first: bool = False) -> Drained:
        """Move group ``replica`` onto a replacement (a warm spare first, else fresh processes) while
        it trains: the replacement heals from live peers and commits a step with them, then
        ``replica`` leaves at a step boundary. Nothing is lost if the replacement does not come:
        ``replica`` trains on and the replacement is retired. ``leave_first`` (a dropped straggler):
        ``replica`` leaves at once, and the replacement comes after."""
        if not isinstance(replica, int) or isinstance(replica, bool):
            raise ValueError(f"replica: must be an integer, got {replica!r}")
        if supervisor is None:
            raise RuntimeError("drain: the run is not running")
        if self.config.on_failure == "plain_restart":
            raise ValueError("drain: a plain_restart job has a fixed world size (one process group over every group, "
                             "as under torchrun); drain a run with on_failure='peer'")
        training = [g.index for g in self.groups.active() if g.state == TRAINING]
        g = next((g for g in self.groups.active() if g.index == replica), None)
        if g is None or g.state != TRAINING:
            what = "no such group" if g is None else f"it is {g.state}"
            raise ValueError(f"replica: cannot drain group {replica} ({what}); training groups: "
                             f"{', '.join(map(str, training)) or 'none'}")
        spare = supervisor.spares is not None and supervisor.spares.ready() > 0
        if not spare and len(self.groups.active()) + 1 > MAX_GROUPS - self.config.spares:
            raise ValueError(f"drain: no warm spare is ready and the run is at its most groups ({MAX_GROUPS} less "
                             f"{self.config.spares} spares): there is no room for group {replica}'s replacement; "
                             "scale down first, or run with spares=1")
        if not spare:
            why = supervisor.launcher.placement.no_room()
            if why:
                raise ValueError(f"drain: no warm spare is ready and {why}: group {replica}'s replacement has "
                                 f"nowhere to start, so group {replica} trains on (nothing was started); free "
                                 "room on the cluster, or run with spares=1")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("drain: a drain or resize is in progress; wait for it to finish")
        try:
            t0 = time.time()
            new = self.groups.add()
            self.events.append(Draining(replica=replica, replacement=new.index, reason=reason))
            if leave_first:
                supervisor.retire(g)
            supervisor.add_group(new)
            try:
                self._wait_for_step(max(x.step for x in self.groups.active()) + 1, [new.index], timeout)
            except TimeoutError:
                if leave_first:  # it left already: the replacement stays and goes on healing
                    raise TimeoutError(f"drop: the replacement (group {new.index}) did not commit a step within "
                                       f"{timeout:g} s; it goes on joining") from None
                supervisor.retire(new)
                raise TimeoutError(f"drain: the replacement (group {new.index}) did not commit a step within "
                                   f"{timeout:g} s; group {replica} trains on and the replacement was retired") from None
            if not leave_first:
                supervisor.retire(g)
            event = Drained(replica=replica, replacement=new.index, seconds=time.time() - t0, from_spare=spare)
            self.events.append(event)
            return event
        finally:
            self._lock.release()
