"""Warm spare groups: a failed group's replacement, already built.

Respawning a group costs seconds of process start, torch and torchtitan import and model
build - most of a recovery. A spare pays that in advance: its processes are up and its
trainers hold a built model and optimizer, but it has no torchft Manager yet, so the
Lighthouse does not know it and no quorum waits for it. When a group fails, the supervisor
takes a ready spare, renames its mesh to the group's, and activates it (a Manager joins the
next quorum and heals from a live peer). The pool then builds a replacement in the
background. A spare that dies while waiting is replaced the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...telemetry.events import Event, SpareState

log = logging.getLogger(__name__)

BUILDING, READY, TAKEN, FAILED, MOVED = "building", "ready", "taken", "failed", "moved"


@dataclass
class Spare:
    index: int
    state: str = BUILDING
    actors: Any = None
    procs: list[tuple[int, str]] = field(default_factory=list)

    @property
    def mesh(self) -> str:
        return f"spare{self.index}"


class SparePool:
    """Keeps ``count`` spares ready (see the module docstring). ``build(spare)`` brings one up
    and returns once its trainers are constructed; it is given by the supervisor."""

    def __init__(self, count: int, build: Callable[[Spare], None], teardown: Callable[[Spare], None],
                 emit: Callable[[Event], None]) -> None:
        self.count = count
        self._build, self._teardown, self._emit = build, teardown, emit
        self._lock = threading.Lock()
        self._spares: list[Spare] = []
        self._next = 0
        self._stopped = False
        self._threads: list[threading.Thread] = []

    def _set(self, spare: Spare, state: str, detail: str = "") -> None:
        with self._lock:
            spare.state = state
        self._emit(SpareState(spare=spare.index, state=state, detail=detail))

    def fill(self) -> None:
        """Start building spares until ``count`` are ready or building (in the background)."""
        with self._lock:
            if self._stopped:
                return
            live = [s for s in self._spares if s.state in (BUILDING, READY)]
            new = []
            for _ in range(self.count - len(live)):
                spare = Spare(self._next)
                self._next += 1
                self._spares.append(spare)
                new.append(spare)
        for spare in new:
            t = threading.Thread(target=self._bring_up, args=(spare,), name=f"ft-{spare.mesh}", daemon=True)
            t.start()
            self._threads.append(t)

    def _bring_up(self, spare: Spare) -> None:
        self._set(spare, BUILDING)
        t0 = time.monotonic()
        try:
            self._build(spare)
        except Exception as exc:
            if self._stopped or spare.state == MOVED:  # torn down on purpose while it was built
                return
            log.warning("building %s failed: %s", spare.mesh, exc)
            self._set(spare, FAILED, f"could not be built: {exc}"[:300])
            self._teardown(spare)
            return
        with self._lock:
            gone = self._stopped or spare.state == MOVED  # the run stopped, or its node is leaving
            if not gone:
                spare.state = READY
        if gone:
            self._teardown(spare)
            return
        self._emit(SpareState(spare=spare.index, state=READY, detail=f"built in {time.monotonic() - t0:.1f} s"))

    def take(self, by: str = "") -> Spare | None:
        """A ready spare for the failed group ``by``, or None; a replacement starts building."""
        with self._lock:
            spare = next((s for s in self._spares if s.state == READY), None)
            if spare is not None:
                spare.state = TAKEN
        if spare is not None:
            self._emit(SpareState(spare=spare.index, state=TAKEN, detail=f"by {by}" if by else ""))
            self.fill()
        return spare

    def failed(self, mesh: str, reason: str) -> bool:
        """A spare's process died while it waited: replace it. False if ``mesh`` is no spare."""
        with self._lock:
            spare = next((s for s in self._spares if s.mesh == mesh and s.state in (BUILDING, READY)), None)
        if spare is None:
            return False
        self._set(spare, FAILED, reason[:300])
        self._teardown(spare)
        self.fill()
        return True

    def move(self, mesh: str, reason: str) -> bool:
        """A spare on a node that is leaving (drained, cordoned): let it go and build one elsewhere
        (the scheduler starts nothing on a leaving node), before a failed or drained group takes
        it onto that node. Not a failure. False if ``mesh`` is no live spare."""
        with self._lock:
            spare = next((s for s in self._spares if s.mesh == mesh and s.state in (BUILDING, READY)), None)
            if spare is not None:
                spare.state = MOVED  # no take() hands it out from now on
        if spare is None:
            return False
        self._emit(SpareState(spare=spare.index, state=MOVED, detail=reason[:300]))
        self._teardown(spare)
        self.fill()
        return True

    def live(self) -> list[str]:
        """The meshes of the spares building or ready."""
        with self._lock:
            return [s.mesh for s in self._spares if s.state in (BUILDING, READY)]

    def ready(self) -> int:
        with self._lock:
            return sum(1 for s in self._spares if s.state == READY)

    def status(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {s.mesh: {"state": s.state, "pids": [pid for pid, _ in s.procs]}
                    for s in self._spares if s.state in (BUILDING, READY)}

    def stop(self) -> list[Spare]:
        """No more spares; returns the ones still held (the caller stops their meshes)."""
        with self._lock:
            self._stopped = True
            held = [s for s in self._spares if s.state in (BUILDING, READY)]
        for t in self._threads:
            t.join(timeout=1.0)
        return held
