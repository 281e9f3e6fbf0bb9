"""The dashboard's update loop: events folded in on the writers' threads, frames drawn on one thread.

The store observer only folds each event into the model and marks the panels it changed dirty;
one flusher thread per dashboard draws dirty panels at most ``max_hz`` times a second each and
sends a widget value only when it changed, so a burst of thousands of events costs a handful of
comm messages (the Jupyter server drops iopub traffic above 1000 msg/s). Each panel's frames are
timed and spaced to keep it within its part (``CPU_SPLIT``) of ``cpu_share`` of a core, after
what the UI spends outside frames (the observer, the flusher's scheduling): the UI's whole cost is
bounded whatever the event rate or the number of groups. What a frame shows is the painter's job.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..telemetry.events import Event
from ..telemetry.store import EventStore
from .dashboard_model import CONTROLS, HEADER, HEALTH, LOGS, PANELS, PLOT, QUORUM, TIMELINE, DashboardModel

# How the UI's CPU budget (``cpu_share`` of one core) is split between panels.
CPU_SPLIT = {PLOT: 0.55, HEALTH: 0.15, QUORUM: 0.05, HEADER: 0.05, TIMELINE: 0.1, CONTROLS: 0.05, LOGS: 0.05}


@dataclass
class DashboardStats:
    """What the UI has cost so far (read by ``bench/bench_dashboard.py`` and tests)."""

    started: float = field(default_factory=time.monotonic)
    events: int = 0
    messages: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PANELS})
    renders: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PANELS})
    cpu_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PANELS})  # per panel, all frames
    observer_cpu_s: float = 0.0  # time spent in the store observer (on writer threads)
    flusher_cpu_s: float = 0.0  # CPU time of the flusher thread
    plot_render_s: float = 0.0  # smoothed CPU seconds of one plot render
    plot_interval_s: float = 0.0  # current adaptive minimum interval between plot redraws
    overhead_share: float = 0.0  # CPU share spent outside frames (observer, scheduling), see _update_overhead

    @property
    def total_messages(self) -> int:
        return sum(self.messages.values())


class Painter(Protocol):
    """What a frame of one panel shows, and how it reaches the panel's widget."""

    def read(self, panel: str, model: DashboardModel, now: float) -> object:
        """Under the loop's lock: the panel's content, as plain values taken from the model."""

    def show(self, panel: str, value: object) -> int:
        """Outside the lock: send ``value`` to the panel's widget; the comm messages it took."""

    def report(self, exc: BaseException) -> None:
        """A frame failed: say so where the user looks (never raises)."""


class FrameLoop:
    """Folds a store's events into ``model`` and draws the dirty panels, throttled (module doc).

    ``lock`` guards the model, the dirty set and the schedule: whoever reads the model holds it.
    ``render_lock`` lets one renderer draw at a time (the flusher thread or a ``draw_all`` caller).

    Args:
        model: what the panels show; the loop is its only writer.
        painter: reads a panel's content from the model and sends it to the widget.
        attached: a live run is attached, so heartbeat ages and elapsed time move on their own.
        max_hz: most frames a second of any one panel.
        cpu_share: the UI's CPU budget, as a share of one core.
        max_plot_interval_s: longest wait between two plot frames, whatever they cost.
        heartbeat_interval_s: seconds between redraws of a live run's ages (0: never).
        clock: wall clock for heartbeat ages (a test's fixed time).
        on_settled: called once a stopped (or interrupted) run is fully drawn.
    """

    def __init__(self, model: DashboardModel, painter: Painter, *, attached: bool, max_hz: float,
                 cpu_share: float, max_plot_interval_s: float, heartbeat_interval_s: float,
                 clock: Callable[[], float], on_settled: Callable[[], None]) -> None:
        self.model = model
        self.painter = painter
        self.attached = attached
        self.max_hz = float(max_hz)
        self.cpu_share = float(cpu_share)
        self.max_plot_interval_s = float(max_plot_interval_s)
        self.heartbeat_interval_s = float(heartbeat_interval_s)
        self._clock = clock
        self._on_settled = on_settled
        self.stats = DashboardStats()
        self._cost: dict[str, float] = {p: 0.0 for p in PANELS}
        self._overhead = 0.0  # CPU share the UI spends outside frames (see _update_overhead)
        self._overhead_mark: tuple[float, float] | None = None
        self._flusher_frames_s = 0.0  # CPU time of the frames the flusher thread drew

        self.lock = threading.Lock()  # guards model, dirty set, schedule
        self._wake = threading.Condition(self.lock)
        self.render_lock = threading.Lock()  # one renderer at a time (flusher or draw_all())
        self._dirty: set[str] = set()
        self._next_ok: dict[str, float] = {p: 0.0 for p in PANELS}
        self._next_tick = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._replay_thread: int | None = None
        self._deferred: list[Event] = []

    @property
    def flusher(self) -> threading.Thread | None:
        """The flusher thread while one runs (a stopped run fully drawn holds none)."""
        return self._thread

    @property
    def dirty(self) -> frozenset[str]:
        """The panels waiting for a frame."""
        return frozenset(self._dirty)

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- events in --------------------------------------------------------------------

    def follow(self, store: EventStore) -> Callable[[], None]:
        """Subscribe to ``store``, replaying its history first; events other threads append
        meanwhile are deferred so the model sees them in order. Returns the unsubscribe."""
        self._replay_thread = threading.get_ident()
        unsubscribe = store.subscribe(self._on_event, replay=True)
        with self.lock:
            self._replay_thread = None
            for e in self._deferred:
                self._dirty |= self.model.apply(e)
            self._deferred.clear()
        return unsubscribe

    def _on_event(self, event: Event) -> None:
        t0 = time.thread_time()
        with self.lock:
            if self._closed:
                return
            if self._replay_thread is not None and threading.get_ident() != self._replay_thread:
                self._deferred.append(event)
                return
            self.stats.events += 1
            changed = self.model.apply(event)
            new = changed - self._dirty
            if new:
                self._dirty |= new
                # Wake the flusher only for a panel that was clean: for one already dirty it
                # already sleeps until that panel is due (a burst costs one wake-up, not one each).
                if self._replay_thread is None:  # the constructor draws the replayed history itself
                    self._ensure_flusher()
                    self._wake.notify()
            self.stats.observer_cpu_s += time.thread_time() - t0

    def start(self) -> None:
        with self.lock:
            self._ensure_flusher()

    def _ensure_flusher(self) -> None:
        """Under the lock: start the flusher thread unless it runs (it exits once a stopped run
        is fully drawn, so finished and reopened runs hold no thread)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._flusher, name="monarch_nb-dashboard", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No more frames; waits for the flusher thread to end (unless called on it)."""
        with self.lock:
            self._closed = True
            self._wake.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    # ---- scheduling -------------------------------------------------------------------

    def _interval(self, panel: str) -> float:
        """Seconds between two frames of ``panel``: at most ``max_hz`` frames a second, and no
        more often than keeps the panel within its share of the CPU budget (capped so that a
        slow machine still sees updates)."""
        base = 1.0 / self.max_hz
        share = max(self.cpu_share - self._overhead, self.cpu_share / 2) * CPU_SPLIT[panel]
        if share <= 0:
            return base
        cap = self.max_plot_interval_s if panel == PLOT else max(base, 2.0)
        return max(base, min(self._cost[panel] / share, cap))

    @property
    def _ticking(self) -> bool:
        """Heartbeat ages and elapsed time move on their own only for a live, attached run."""
        return self.attached and self.model.live and self.heartbeat_interval_s > 0

    def _take_due(self, now: float) -> tuple[set[str], float | None]:
        """Under the lock: the dirty panels whose interval has passed, and seconds to wait."""
        if self._ticking and now >= self._next_tick:
            self._dirty |= {HEALTH, HEADER, LOGS}
            self._next_tick = now + self.heartbeat_interval_s
        due = {p for p in self._dirty if now >= self._next_ok[p]}
        self._dirty -= due
        waits = [self._next_ok[p] - now for p in self._dirty]
        if self._ticking:
            waits.append(self._next_tick - now)
        return due, (max(0.0, min(waits)) if waits else None)

    def _flusher(self) -> None:
        cpu0, base = time.thread_time(), self.stats.flusher_cpu_s
        while True:
            with self.lock:
                while True:
                    if self._closed:
                        self.stats.flusher_cpu_s = base + time.thread_time() - cpu0
                        return
                    due, wait = self._take_due(time.monotonic())
                    if due:
                        break
                    if wait is None and (self.model.stopped_t is not None or self.model.interrupted):
                        break  # all drawn and nothing will move
                    self._wake.wait(wait)
            if not due:
                self._on_settled()  # the run's last state also becomes the static copy
                with self.lock:
                    if not self._dirty:  # else an event came meanwhile: draw it, end again
                        self._thread = None  # a new event restarts us
                        self.stats.flusher_cpu_s = base + time.thread_time() - cpu0
                        return
                continue
            try:
                self._render(due)
            except Exception as exc:  # a rendering bug must not kill live updates
                self.painter.report(exc)
            self.stats.flusher_cpu_s = base + time.thread_time() - cpu0
            with self.lock:
                self._update_overhead(time.monotonic())

    def _update_overhead(self, now: float) -> None:
        """Under the lock: re-estimate (at most once a second) the CPU share the UI spends
        outside frames: the store observer on the writers' threads (it grows with the event
        rate, so with the number of groups) and the flusher's waking and scheduling. The
        frames get what remains of ``cpu_share`` (at least half of it)."""
        outside = self.stats.observer_cpu_s + max(0.0, self.stats.flusher_cpu_s - self._flusher_frames_s)
        if self._overhead_mark is None:
            self._overhead_mark = (now, outside)
            return
        t0, before = self._overhead_mark
        if now - t0 >= 1.0:
            self._overhead = 0.5 * self._overhead + 0.5 * (outside - before) / (now - t0)
            self._overhead_mark = (now, outside)
            self.stats.overhead_share = self._overhead

    # ---- frames -----------------------------------------------------------------------

    def _render(self, panels: set[str]) -> None:
        """Render ``panels`` and send what changed; each panel's CPU cost sets its next interval."""
        with self.render_lock:
            now = self._clock()
            values: dict[str, object] = {}
            cost: dict[str, float] = {}
            with self.lock:
                for p in panels:
                    c0 = time.thread_time()
                    values[p] = self.painter.read(p, self.model, now)
                    if p == HEALTH and self.model.mark_drawn():
                        self._dirty.add(HEALTH)  # next frame (after the throttle) shows the current state
                    cost[p] = time.thread_time() - c0
                scheduled = time.monotonic()
                for p in panels:
                    self._next_ok[p] = scheduled + self._interval(p)
            for p in panels:
                c0 = time.thread_time()
                self.stats.renders[p] += 1
                self.stats.messages[p] += self.painter.show(p, values[p])
                cost[p] += time.thread_time() - c0
            with self.lock:
                if threading.current_thread() is self._thread:
                    self._flusher_frames_s += sum(cost.values())
                for p in panels:
                    self._record_cost(p, cost[p])
                    self.stats.cpu_s[p] += cost[p]
                    self._next_ok[p] = scheduled + self._interval(p)
                self.stats.plot_render_s = self._cost[PLOT]
                self.stats.plot_interval_s = self._interval(PLOT)

    def _record_cost(self, panel: str, seconds: float) -> None:
        """Smoothed CPU cost of one frame of ``panel``; the very first frame (imports, font
        cache, comm open) is an outlier and only counts up to a small cap."""
        if self.stats.renders[panel] <= 1:
            self._cost[panel] = min(seconds, 0.002 if panel != PLOT else 0.03)
        else:
            self._cost[panel] = 0.7 * self._cost[panel] + 0.3 * seconds

    def draw_all(self) -> None:
        """Draw every panel now, on the calling thread."""
        with self.lock:
            self._dirty -= set(PANELS)
        self._render(set(PANELS))
