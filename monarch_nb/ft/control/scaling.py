"""Resizing a run while it trains: ``Scaler`` (``FTRun.scale``).

A new group comes from a warm spare when one is ready, else from fresh processes, and heals
from a peer like a group that failed; a surplus group (the newest first) leaves at a step
boundary and is recorded as retired, not failed. One resize at a time (``Scaler._lock``).
A plain_restart job has a fixed world size (one process group over every group, as under
torchrun) and is never resized; ``scaled`` records each resize.
"""

from __future__ import annotations

import threading
from typing import Callable

from ...telemetry import EventStore
from ...telemetry.events import Scaled
from ..settings.config import MAX_GROUPS, RunConfig
from .groups import GroupTable
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
