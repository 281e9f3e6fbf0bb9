"""Where a run's groups find each other, kept there for the run's life: ``Coordinator``.

Under torchft recovery that is a Lighthouse in its own process (:mod:`.lighthouse`), watched
like any worker process: when it dies it is restarted on the same address (recorded as
``lighthouse_failed``, then ``lighthouse_restarted``) and the groups' Managers find it again at
their next quorum. Under ``on_failure="plain_restart"`` it is the job's store
(:mod:`.plain_rendezvous`), and a group's address names the job's generation. The run opens
one when it starts, stops watching first when it stops, and closes it once its groups are gone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from typing import Callable

from ...telemetry.events import Event, LighthouseFailed, LighthouseRestarted, LighthouseStarted
from ..settings.config import RunConfig, meeting_period
from .groups import ReplicaGroup
from .lighthouse import Lighthouse, LighthouseSettings, join_timeout_for, meeting_join_timeout
from .name_lookup import reverse_lookup_finding
from .placement import Placement
from .plain_rendezvous import PlainRendezvous

log = logging.getLogger(__name__)

LIGHTHOUSE_POLL_S = 0.25  # how often the watch looks at the Lighthouse's process
RESTART_GIVE_UP_S = 60.0  # a Lighthouse that cannot be restarted for this long is given up on


class Coordinator:
    """The run's Lighthouse (or plain rendezvous) and the thread that keeps a Lighthouse up.

    Args:
        emit: where ``lighthouse_started`` / ``lighthouse_failed`` / ``lighthouse_restarted``
            go (the run's event store).
    """

    def __init__(self, emit: Callable[[Event], None]) -> None:
        self.lighthouse: Lighthouse | None = None
        self.rendezvous: PlainRendezvous | None = None  # on_failure="plain_restart" instead of a Lighthouse
        self._emit = emit
        self._stop = threading.Event()  # set once: the watch ends and restarts no more

    def open(self, config: RunConfig, placement: Placement) -> None:
        """Start the Lighthouse (its join timeout stretched when every group shares this host's
        cores), or the job's store under plain_restart."""
        cfg = config
        join_ms = cfg.join_timeout_ms
        if placement.shares_this_host:
            join_ms = join_timeout_for(join_ms, (cfg.replicas + cfg.spares) * cfg.group_size, os.cpu_count() or 1)
        period = meeting_period(cfg.sync, cfg.sync_every, cfg.fragments)
        if period is not None:
            join_ms = meeting_join_timeout(join_ms, period)
        if cfg.on_failure == "plain_restart":  # no torchft: the job's store instead of a Lighthouse
            self.rendezvous = PlainRendezvous(placement.bind_host)
            return
        finding = reverse_lookup_finding(placement.advertise_host) if placement.shares_this_host else None
        if finding:
            log.warning("%s", finding)
            warnings.warn(finding, RuntimeWarning, stacklevel=2)
        self.lighthouse = Lighthouse(LighthouseSettings(
            bind=f"{placement.bind_host}:0", min_replicas=cfg.min_replicas, join_timeout_ms=join_ms,
            quorum_tick_ms=cfg.quorum_tick_ms, heartbeat_timeout_ms=cfg.heartbeat_timeout_ms)).start()
        self._emit(LighthouseStarted(address=self.lighthouse.address or "?", pid=self.lighthouse.pid,
                                     join_timeout_ms=join_ms, name_lookup=finding))

    def lighthouse_address(self) -> str:
        """The Lighthouse's address now (the same after a restart)."""
        assert self.lighthouse is not None and self.lighthouse.address
        return self.lighthouse.address

    def address(self, g: ReplicaGroup) -> str:
        """Where group ``g`` finds the others: the Lighthouse, or (plain_restart) the job's store
        with the job's generation - every failure restarts all groups, so their attempt counts
        move together and one start of the job is one generation."""
        if self.rendezvous is not None:
            return self.rendezvous.address(g.attempts)
        return self.lighthouse_address()

    def watch(self) -> None:
        """Keep the Lighthouse up from now on, in a thread of its own (none under plain_restart)."""
        if self.lighthouse is not None:
            threading.Thread(target=self._watch, args=(self.lighthouse,), name="ft-lighthouse-watch",
                             daemon=True).start()

    def stop_watching(self) -> None:
        """No restart from now on (the run is stopping); the watch thread ends within a poll."""
        self._stop.set()

    def close(self) -> None:
        """Stop the Lighthouse's process, or the job's store."""
        if self.lighthouse is not None:
            self.lighthouse.stop()
        if self.rendezvous is not None:
            self.rendezvous.stop()

    def _watch(self, lighthouse: Lighthouse) -> None:
        while not self._stop.wait(LIGHTHOUSE_POLL_S):
            status = lighthouse.exit_status()
            if status is None:
                continue
            self._emit(LighthouseFailed(address=lighthouse.address or "?", pid=lighthouse.pid,
                                        reason=f"the torchft Lighthouse (pid {lighthouse.pid}) {status}: "
                                               "the groups cannot form a quorum until it is back"))
            t0 = time.monotonic()
            delay = 0.0
            while not self._stop.is_set():
                try:
                    lighthouse.stop()  # reap the dead process
                    lighthouse.start()
                except Exception as exc:  # the port may still be held for a moment: try again
                    delay = min(5.0, max(0.2, delay * 2))
                    self._stop.wait(delay)
                    if time.monotonic() - t0 > RESTART_GIVE_UP_S:
                        self._emit(LighthouseFailed(address=lighthouse.address or "?", pid=None,
                                                    reason=f"could not restart the Lighthouse: {exc}"))
                        return
                    continue
                self._emit(LighthouseRestarted(address=lighthouse.address or "?", pid=lighthouse.pid,
                                               seconds=time.monotonic() - t0))
                break
