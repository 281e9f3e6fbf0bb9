"""A warm spare on a node that is leaving is let go and built elsewhere, before any group is moved
onto it (issue 54). The watch's and the pool's logic, with the pool's real threads and events; what
Kubernetes and SLURM report is faked here as the ``draining()`` answer (the cluster tests deliver
the real drains: tests/test_k8s_drain.py, tests/test_slurm_drain.py)."""

from __future__ import annotations

import threading
import types

from monarch_nb.ft.control.groups import TRAINING
from monarch_nb.ft.control.node_drains import NodeDrainWatch
from monarch_nb.ft.control.spares import MOVED, READY, SparePool
from monarch_nb.telemetry.events import SpareState


def _pool(places: dict[str, str]):
    """A pool of one spare whose builds land on ``places[mesh]`` (else node n1)."""
    events, torn = [], []
    built = threading.Event()

    def build(spare):
        places.setdefault(spare.mesh, "node n1")
        built.set()

    pool = SparePool(1, build, lambda spare: torn.append(spare.mesh), events.append)
    return pool, events, torn


def _wait_ready(pool, n: int = 1) -> None:
    for _ in range(500):
        if pool.ready() >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the spare was never ready")


def test_a_spare_on_a_cordoned_node_is_let_go_and_rebuilt_before_a_group_there_moves():
    places = {"spare0": "node n2", "replica0": "node n2", "replica1": "node n1"}
    pool, events, torn = _pool(places)
    pool.fill()
    _wait_ready(pool)
    ready_at_drain = []

    def drain(replica, reason):
        ready_at_drain.append((replica, reason, pool.status()))

    groups = types.SimpleNamespace(active=lambda: [types.SimpleNamespace(index=i, name=f"replica{i}", state=TRAINING)
                                                   for i in (0, 1)])
    watch = NodeDrainWatch(groups, lambda mesh: [places[mesh]], lambda: {"node n2": "is cordoned"}, drain,
                           spares=pool.live, move_spare=pool.move)
    assert watch.check() == [0]  # only the group on n2
    moved = [e for e in events if isinstance(e, SpareState) and e.state == MOVED]
    assert [(e.spare, e.detail) for e in moved] == [(0, "node n2 is cordoned")]
    assert torn == ["spare0"]
    _wait_ready(pool)
    assert pool.live() == ["spare1"] and places["spare1"] == "node n1"  # built again, elsewhere
    for _ in range(500):
        if ready_at_drain:
            break
        threading.Event().wait(0.01)
    (replica, reason, spares_then), = ready_at_drain
    assert replica == 0 and reason == "node n2 is cordoned"
    assert "spare0" not in spares_then, "the group's move could have taken the spare on the leaving node"


def test_a_spare_moved_while_it_is_built_is_not_reported_failed_or_ready():
    release = threading.Event()
    events, torn = [], []

    def build(spare):
        release.wait(5)
        if spare.mesh == "spare0":
            raise RuntimeError("its mesh was stopped under it")

    pool = SparePool(1, build, lambda spare: torn.append(spare.mesh), events.append)
    pool.fill()
    assert pool.move("spare0", "node n2 set to DRAIN")
    release.set()
    _wait_ready(pool)
    states = [(e.spare, e.state) for e in events if isinstance(e, SpareState)]
    assert (0, MOVED) in states and (0, "failed") not in states and (0, READY) not in states
    assert (1, READY) in states and not pool.move("spare0", "again")
