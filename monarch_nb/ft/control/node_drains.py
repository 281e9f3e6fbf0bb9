"""Planned maintenance from the orchestrator: a group on a node set to DRAIN is moved before the
node goes (issue 54). Controller side.

SLURM: an administrator's ``scontrol update nodename=N state=drain`` lets the jobs on N run on but
starts none there; the jobs are ended later, for the maintenance. The watch reads the nodes'
states every ``every`` seconds and drains (``FTRun.drain``: a replacement heals and commits a step
with the others, then the group leaves) every training group whose allocation holds a draining
node; the replacement's allocation lands elsewhere because SLURM schedules nothing on N.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from .groups import TRAINING

log = logging.getLogger(__name__)
EVERY_S = 2.0  # how often the nodes' states are read (one scontrol call)


class NodeDrainWatch:
    """Moves groups off draining nodes: ``nodes_of(group)`` names a group's nodes, ``draining()``
    the nodes being drained, ``drain(replica, reason)`` moves one group (blocking)."""

    def __init__(self, groups: Any, nodes_of: Callable[[Any], list[str]], draining: Callable[[], set[str]],
                 drain: Callable[[int, str], Any], every: float = EVERY_S) -> None:
        self.groups, self._nodes_of, self._draining, self._drain = groups, nodes_of, draining, drain
        self.every = every
        self._moving: set[int] = set()  # groups whose move started (each is moved once)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ft-node-drains", daemon=True)

    def start(self) -> "NodeDrainWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> list[int]:
        """One look: the groups it started moving."""
        try:
            draining = self._draining()
        except Exception as exc:  # the scheduler did not answer: look again next time
            log.warning("reading the nodes' states: %s", exc)
            return []
        started = []
        for g in self.groups.active():
            if g.state != TRAINING or g.index in self._moving:
                continue
            on = sorted(set(self._nodes_of(g)) & draining)
            if on:
                self._moving.add(g.index)
                started.append(g.index)
                threading.Thread(target=self._move, args=(g.index, f"node {on[0]} set to DRAIN"),
                                 name=f"ft-drain-{g.index}", daemon=True).start()
        return started

    def _move(self, replica: int, reason: str) -> None:
        try:
            self._drain(replica, reason)
        except Exception as exc:  # refused or failed: it may be tried again at the next look
            log.warning("moving group %d off a draining node: %s", replica, exc)
            self._moving.discard(replica)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.check()


def slurm_drain_watch(run: Any) -> NodeDrainWatch:
    """The watch for a run whose groups hold SLURM allocations; it ends when the run stops."""
    from ...jobs.slurm import draining_nodes

    def nodes_of(g: Any) -> list[str]:
        session = run.session
        allocation = getattr(session.mesh(g.name), "allocation", None) if session and g.name in session.meshes \
            else None
        return list(getattr(allocation, "nodes", []) or [])

    def drain(replica: int, reason: str) -> Any:
        return run.drain(replica, reason=reason)

    watch = NodeDrainWatch(run.groups, nodes_of, draining_nodes, drain)
    run.events.subscribe(lambda e: watch.stop() if getattr(e, "kind", "") == "run_stopped" else None)
    return watch
