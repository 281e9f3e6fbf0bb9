"""A synthetic run: scripted telemetry fed into an EventStore from a background thread.

It trains nothing. It emits the events a fault-tolerant run emits (steps with a falling loss,
quorum changes, and for every injected fault the detected/respawned/healed/rejoined phases)
at a chosen rate, and answers ``inject(kind, replica=...)`` and ``stop()`` like the real run.
Used by the dashboard's tests, its browser-test replay notebook and ``bench/bench_dashboard.py``
to exercise rendering, throttling and the Jupyter plumbing without torch or worker processes.
"""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Callable

from ..telemetry.events import (
    FailureDetected,
    FaultInjected,
    GaveUp,
    Healed,
    Quorum,
    Rejoined,
    ReplicaState,
    Respawned,
    RunStarted,
    RunStopped,
    Step,
)
from ..telemetry.store import EventStore

__all__ = ["SyntheticRun"]


class SyntheticRun:
    """Scripted FT-run telemetry at ``step_hz`` steps/s per replica group (see module doc).

    ``phase_s`` scales the recovery phases: detection, respawn and heal take about
    0.3, 1.0 and 0.2 times it.
    """

    def __init__(self, store: EventStore | None = None, *, replicas: int = 3, group_size: int = 1,
                 step_hz: float = 5.0, phase_s: float = 1.0, max_steps: int | None = None,
                 seed: int = 0, run_id: str = "synthetic") -> None:
        self.events = store if store is not None else EventStore()
        self.replicas = replicas
        self.group_size = group_size
        self.step_hz = step_hz
        self.phase_s = phase_s
        self.max_steps = max_steps
        self.run_id = run_id
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._state = {r: "starting" for r in range(replicas)}
        self._failed_at: dict[int, float] = {}
        self._pending: list[tuple[float, Callable[[], None]]] = []
        self._step = 0
        self._quorum_id = 0
        self._members: tuple[int, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.step_done = threading.Condition()

    # ---- the run API the dashboard drives --------------------------------------------

    def start(self) -> "SyntheticRun":
        self.events.append(RunStarted(run_id=self.run_id, config={
            "replicas": self.replicas, "group_size": self.group_size, "synthetic": True}))
        for r in range(self.replicas):
            self.events.append(ReplicaState(replica=r, state="starting"))
        for r in range(self.replicas):
            self._set(r, "training")
        self._thread = threading.Thread(target=self._loop, name="synthetic-run", daemon=True)
        self._thread.start()
        return self

    def inject(self, kind: str = "kill", replica: int = 0, rank: int = 0, *, give_up: bool = False) -> None:
        """Fail ``replica``; it recovers through the usual phases, or with ``give_up`` the restart
        policy gives up on it once the failure is detected (the group stays down)."""
        with self._lock:
            if self._state.get(replica) != "training":
                raise RuntimeError(f"group {replica} is {self._state.get(replica)}, not training")
            step = self._step
            self._failed_at[replica] = time.time()
            self._state[replica] = "down"
        self.events.append(FaultInjected(fault=kind, replica=replica, rank=rank, step=step))
        p = self.phase_s
        if give_up:
            self._after(0.3 * p, lambda: self._give_up(replica, rank, kind, 0.3 * p))
            return
        self._after(0.3 * p, lambda: self._detect(replica, rank, kind, 0.3 * p))
        self._after(1.3 * p, lambda: self._respawned(replica, 1.0 * p))
        self._after(1.5 * p, lambda: self._healed(replica, 0.2 * p))

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        for r in range(self.replicas):
            if self._state.get(r) != "gave_up":  # a group given up on stays so
                self._set(r, "stopped")
        self.events.append(RunStopped(run_id=self.run_id))

    def wait_for_step(self, step: int, timeout: float = 30.0) -> bool:
        with self.step_done:
            return self.step_done.wait_for(lambda: self._step >= step or self._stop.is_set(), timeout)

    @property
    def step(self) -> int:
        return self._step

    # ---- the script ---------------------------------------------------------------------

    def _set(self, replica: int, state: str, detail: str = "") -> None:
        with self._lock:
            if state in ("training", "stopped"):
                self._state[replica] = state
        self.events.append(ReplicaState(replica=replica, state=state, detail=detail))

    def _after(self, seconds: float, action: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append((time.monotonic() + seconds, action))

    def _detect(self, replica: int, rank: int, kind: str, took: float) -> None:
        self.events.append(FailureDetected(replica=replica, rank=rank, reason=f"{kind}: process died",
                                           detection_s=took))
        self._set(replica, "failed", f"{kind}")
        self._set(replica, "respawning")

    def _give_up(self, replica: int, rank: int, kind: str, took: float) -> None:
        self.events.append(FailureDetected(replica=replica, rank=rank, reason=f"{kind}: process died",
                                           detection_s=took))
        self._set(replica, "failed", f"{kind}")
        self.events.append(GaveUp(replica=replica, attempts=3))
        with self._lock:
            self._state[replica] = "gave_up"
            self._failed_at.pop(replica, None)
        self._set(replica, "gave_up", "after 3 attempts in a row")

    def _respawned(self, replica: int, took: float) -> None:
        self.events.append(Respawned(replica=replica, attempt=1, seconds=took))
        self._set(replica, "healing")

    def _healed(self, replica: int, took: float) -> None:
        step = self._step
        source = min((r for r, s in self._state.items() if s == "training"), default=None)
        self.events.append(Healed(replica=replica, step=step, bytes=1_800_000, seconds=took,
                                  source_replica=source))
        since = time.time() - self._failed_at.pop(replica, time.time())
        self.events.append(Rejoined(replica=replica, step=step, seconds_since_failure=since))
        self._set(replica, "training")

    def _loop(self) -> None:
        period = 1.0 / self.step_hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [a for t, a in self._pending if t <= now]
                self._pending = [(t, a) for t, a in self._pending if t > now]
            for action in due:
                action()
            with self._lock:
                members = tuple(r for r, s in sorted(self._state.items()) if s == "training")
            if members != self._members:
                self._members = members
                self._quorum_id += 1
                self.events.append(Quorum(quorum_id=self._quorum_id, participants=list(members)))
            if members:
                step = self._step
                base = 4.0 * math.exp(-step / 150.0) + 1.0
                for r in members:
                    loss = base + 0.15 * self._rng.random() + 0.05 * r
                    self.events.append(Step(replica=r, step=step, loss=loss, tokens_per_s=2048.0,
                                            committed=True, quorum_id=self._quorum_id,
                                            participants=len(members)))
                with self.step_done:
                    self._step = step + 1
                    self.step_done.notify_all()
                if self.max_steps is not None and self._step >= self.max_steps:
                    break
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))
