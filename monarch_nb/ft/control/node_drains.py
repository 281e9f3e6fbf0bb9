"""Planned maintenance from the orchestrator: a group on a node being drained is moved before the
node goes (issue 54). Controller side.

SLURM: an administrator's ``scontrol update nodename=N state=drain`` lets the jobs on N run on but
starts none there; the jobs are ended later, for the maintenance.
Kubernetes: ``kubectl drain N`` cordons N (nothing new is scheduled there) and evicts its pods,
each with its grace period; a worker's pod keeps serving through it (``kubernetes.DRAIN_GRACE_S``,
a preStop sleep), and an eviction with a grace period is not a failure of the mesh
(``kubernetes_watch``). A pod evicted alone (its node not cordoned) is moved the same way.

The watch looks every ``every`` seconds and drains (``FTRun.drain``: a replacement heals and
commits a step with the others, then the group leaves) every training group on a place that is
leaving (a node, or on Kubernetes one of its pods); the replacement lands elsewhere because the
scheduler starts nothing on a draining or cordoned node. A warm spare on a leaving place is let go
first (the pool builds one elsewhere): a group moved, or failed, must not land on it there.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from .groups import TRAINING

log = logging.getLogger(__name__)
EVERY_S = 2.0  # how often the nodes' states are read (one scontrol call)


class NodeDrainWatch:
    """Moves groups and warm spares off leaving places: ``places_of(mesh)`` names a mesh's nodes
    (and pods), ``draining()`` each leaving place with why (``"node n2": "is cordoned"``),
    ``drain(replica, reason)`` moves one group (blocking); ``spares()`` names the live spares'
    meshes and ``move_spare(mesh, reason)`` lets one go (the pool builds one elsewhere)."""

    def __init__(self, groups: Any, places_of: Callable[[str], list[str]], draining: Callable[[], dict[str, str]],
                 drain: Callable[[int, str], Any], every: float = EVERY_S,
                 close: Callable[[], None] | None = None, spares: Callable[[], list[str]] = list,
                 move_spare: Callable[[str, str], Any] | None = None) -> None:
        self.groups, self._places_of, self._draining, self._drain = groups, places_of, draining, drain
        self._spares, self._move_spare = spares, move_spare
        self._close = close  # what the looks held open (an API client), closed by the loop once it ends
        self.every = every
        self._moving: set[int] = set()  # groups whose move started (each is moved once)
        self._refused: dict[int, str] = {}  # each group's last refused move, as said
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
        if self._move_spare is not None and draining:
            for mesh in self._spares():  # first: a group moved now must not take a spare that is leaving
                on = sorted(set(self._places_of(mesh)) & set(draining))
                if on:
                    self._move_spare(mesh, f"{on[0]} {draining[on[0]]}")
        for g in self.groups.active():
            if g.state != TRAINING or g.index in self._moving:
                continue
            on = sorted(set(self._places_of(g.name)) & set(draining))
            if on:
                self._moving.add(g.index)
                started.append(g.index)
                threading.Thread(target=self._move, args=(g.index, f"{on[0]} {draining[on[0]]}"),
                                 name=f"ft-drain-{g.index}", daemon=True).start()
        return started

    def _move(self, replica: int, reason: str) -> None:
        try:
            self._drain(replica, reason)
        except Exception as exc:  # refused or failed: it is tried again at the next look
            if self._refused.get(replica) != str(exc):  # said once, not every look while it lasts
                log.warning("moving group %d off a leaving node: %s", replica, exc)
                self._refused[replica] = str(exc)
            self._moving.discard(replica)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.check()
        if self._close is not None:
            self._close()


def node_drain_watch(run: Any) -> NodeDrainWatch | None:
    """The watch for a run whose groups hold SLURM allocations or Kubernetes pod sets (None for
    others); it ends when the run stops."""
    close = None
    if run.config.job == "slurm":
        from ...jobs.slurm import draining_nodes

        def draining() -> dict[str, str]:
            return {f"node {n}": "set to DRAIN" for n in draining_nodes()}
    elif run.config.job == "kubernetes":
        from ...jobs import kubernetes_api as kapi

        spec = run.placement.spec  # the groups' own: their cluster, namespace and the run's label
        target = kapi.ApiTarget(spec.namespace, spec.kubeconfig, spec.context)
        api = kapi.api_client(target)
        close = api.close
        run_pods = ",".join(f"{k}={v}" for k, v in spec.labels.items())

        def draining() -> dict[str, str]:
            return kapi.planned_departures(api, target, run_pods)
    else:
        return None

    def places_of(mesh: str) -> list[str]:
        session = run.session
        allocation = getattr(session.mesh(mesh), "allocation", None) if session and mesh in session.meshes else None
        return [f"node {n}" for n in getattr(allocation, "nodes", []) or []] + \
            [f"pod {p}" for p in getattr(allocation, "pods", []) or []]

    def drain(replica: int, reason: str) -> Any:
        return run.drain(replica, reason=reason)

    pool = run.supervisor.spares if run.supervisor is not None else None
    watch = NodeDrainWatch(run.groups, places_of, draining, drain, close=close,
                           spares=pool.live if pool is not None else list,
                           move_spare=pool.move if pool is not None else None)
    run.events.subscribe(lambda e: watch.stop() if getattr(e, "kind", "") == "run_stopped" else None)
    return watch
