"""The live dashboard: ipywidgets that observe a run's telemetry store and redraw themselves.

``Dashboard(store, controls)`` subscribes to an ``EventStore`` (replaying its history first),
folds events into a ``DashboardModel`` and renders panels: a health grid (one cell per replica
group x rank), a quorum summary, loss curves (matplotlib, see below), a recovery timeline with an
event list, and controls (inject a fault, stop the run) when a live run is attached.

Observers run on the writer's thread, so the observer only folds the event into the model and
marks panels dirty. One background flusher thread per dashboard renders dirty panels, at most
``max_hz`` times a second per widget, and only sends a widget value when it changed: a burst
of thousands of events costs a handful of comm messages (the Jupyter server drops iopub traffic
above 1000 msg/s). Widget updates from that thread reach the browser while no cell executes.

Displayed, a dashboard's output carries the widget view and a static copy (``text/html``
with the plot as an embedded PNG) under one display id; the copy is redrawn when the run ends
and on ``close()``, so a notebook saved after a headless run shows the final dashboard to a
viewer without widgets.

Plot choice: matplotlib's Agg renderer into an ``ipywidgets.Image``. It needs no frontend
extension beyond ipywidgets (works in JupyterLab, Notebook 7, VS Code and in saved widget
state), the same PNG is the static fallback for headless runs, and drawing happens in the
kernel where we can bound it. Every panel measures the CPU time of its frames (render + send)
and waits long enough between frames to stay within its part of ``cpu_share`` (default 3% of
a core); what the UI spends outside frames (the store observer on the writers' threads, which
grows with the event rate, and the flusher's own scheduling) is measured too and comes off
that budget first, so the UI's whole cost is bounded whatever the event rate or the number of
groups; the plot redraws every one to a few seconds, the health grid up to ``max_hz``. ipympl would cost
the same rendering plus a frontend round trip per frame (and stays blank under nbclient);
bqplot would add a dependency and ~1 MB of JavaScript.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .. import worker_logs
from ..telemetry.events import Event
from ..telemetry.store import EventStore

from . import dashboard_render as render
from .dashboard_model import CONTROLS, FAULT_KINDS, HEADER, HEALTH, LOGS, PANELS, PLOT, QUORUM, TIMELINE, DashboardModel

__all__ = ["Dashboard", "DashboardStats", "RunControls", "FAULT_KINDS"]

# How the UI's CPU budget (``cpu_share`` of one core) is split between panels.
CPU_SPLIT = {PLOT: 0.55, HEALTH: 0.15, QUORUM: 0.05, HEADER: 0.05, TIMELINE: 0.1, CONTROLS: 0.05, LOGS: 0.05}
LOG_LINES = 14  # lines in the log panel (after folding)


class RunControls(Protocol):
    """What the controls panel drives: the fault-tolerant run."""

    def inject(self, kind: str, replica: int) -> Any: ...

    def stop(self) -> Any: ...


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


class Dashboard:
    """Live (or replayed) dashboard of one FT run. Display it; ``close()`` stops updates.

    ``controls`` is the run (``inject(kind, replica=...)`` and ``stop()``); ``None`` for a
    reopened or finished run, which hides the controls.
    """

    def __init__(
        self,
        store: EventStore,
        controls: RunControls | None = None,
        *,
        max_hz: float = 10.0,
        cpu_share: float = 0.03,
        max_plot_interval_s: float = 5.0,
        heartbeat_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_hz <= 0:
            raise ValueError("max_hz must be positive")
        self.store = store
        self.controls = controls
        self.max_hz = float(max_hz)
        self.cpu_share = float(cpu_share)
        self._cost: dict[str, float] = {p: 0.0 for p in PANELS}
        self._overhead = 0.0  # CPU share the UI spends outside frames (see _update_overhead)
        self._overhead_mark: tuple[float, float] | None = None
        self._flusher_frames_s = 0.0  # CPU time of the frames the flusher thread drew
        self.max_plot_interval_s = float(max_plot_interval_s)
        self.heartbeat_interval_s = float(heartbeat_interval_s)
        self._clock = clock
        # Built from a log read back from disk with no run attached: nothing will append, so
        # a run without run_stopped in it shows as interrupted (see DashboardModel.interrupted).
        self.model = DashboardModel(reopened=controls is None and store.reopened)
        self.stats = DashboardStats()
        self._plot = render.LossPlot()
        # The workers' log files sit beside the event log (<run_dir>/logs), read incrementally.
        log_dir = store.path.parent / "logs" if getattr(store, "path", None) else None
        self._logs = worker_logs.LogFollower(log_dir) if log_dir is not None else None

        self._lock = threading.Lock()  # guards model, dirty set, schedule
        self._wake = threading.Condition(self._lock)
        self._render_lock = threading.Lock()  # one renderer at a time (flusher or flush())
        self._dirty: set[str] = set()
        self._next_ok: dict[str, float] = {p: 0.0 for p in PANELS}
        self._next_tick = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._display_id: str | None = None  # set once displayed in IPython (see _ipython_display_)

        self._build_widgets()

        # Replay history, deferring events that other threads append meanwhile so the model
        # sees them in order.
        self._replay_thread: int | None = threading.get_ident()
        self._deferred: list[Event] = []
        self._unsubscribe = store.subscribe(self._on_event, replay=True)
        with self._lock:
            self._replay_thread = None
            for e in self._deferred:
                self._dirty |= self.model.apply(e)
            self._deferred.clear()
        self._flush_widgets()  # the widgets hold the full history before they are displayed

        with self._lock:
            self._ensure_flusher()

    @classmethod
    def open(cls, path: str | Path, **kwargs: Any) -> "Dashboard":
        """A read-only dashboard of a run directory (or its ``events.jsonl``)."""
        return cls(EventStore.open(path), controls=None, **kwargs)

    # ---- widgets ----------------------------------------------------------------------

    def _build_widgets(self) -> None:
        import ipywidgets as w

        self.header = w.HTML(layout=w.Layout(width="100%"))
        self.health = w.HTML(layout=w.Layout(width="auto"))
        self.quorum = w.HTML(layout=w.Layout(width="auto"))
        self.plot = w.Image(format="png", layout=w.Layout(width="600px", max_width="100%"))
        self.plot_caption = w.HTML()
        self.timeline = w.HTML(layout=w.Layout(width="100%"))
        self.logs = w.HTML(layout=w.Layout(width="100%"))
        for widget, name in ((self.header, "header"), (self.health, "health"), (self.quorum, "quorum"),
                             (self.plot, "plot"), (self.plot_caption, "plot-caption"),
                             (self.timeline, "timeline"), (self.logs, "logs")):
            widget.add_class(f"mnb-{name}-widget")

        self.fault_kind = w.Dropdown(options=list(FAULT_KINDS), value="kill", description="fault",
                                     layout=w.Layout(width="180px"))
        self.replica_choice = w.Dropdown(options=[], description="group", layout=w.Layout(width="190px"))
        self.inject_button = w.Button(description="Inject fault", button_style="danger", icon="bolt",
                                      tooltip="inject the chosen fault into the chosen replica group")
        self.stop_button = w.Button(description="Stop run", button_style="warning", icon="stop",
                                    tooltip="stop the training run")
        self.control_status = w.HTML()
        self.inject_button.on_click(self._on_inject_clicked)
        self.stop_button.on_click(self._on_stop_clicked)
        self.controls_box = w.HBox([self.fault_kind, self.replica_choice, self.inject_button,
                                    self.stop_button, self.control_status])
        self.controls_box.add_class("mnb-controls")
        if self.controls is None:
            self.controls_box.layout.display = "none"
            for c in (self.fault_kind, self.replica_choice, self.inject_button, self.stop_button):
                c.disabled = True

        def section(title: str) -> Any:
            return w.HTML(f"<div style='font-weight:bold;font-size:13px;margin-top:6px;"
                          f"border-bottom:1px solid #ccc'>{title}</div>")

        left = w.VBox([section("health (replica group x rank)"), self.health, self.quorum],
                      layout=w.Layout(flex="0 0 auto", margin="0 16px 0 0"))
        right = w.VBox([section("loss"), self.plot, self.plot_caption],
                       layout=w.Layout(flex="1 1 360px", min_width="300px"))
        self.widget = w.VBox([
            self.header, self.controls_box,
            w.HBox([left, right], layout=w.Layout(flex_flow="row wrap", align_items="flex-start")),
            section("recoveries"), self.timeline,
            section("worker logs (the same line of many ranks once; %monarch logs for more)"), self.logs,
        ])
        self.widget.add_class("mnb-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget view, plus a static copy for viewers without a widget manager.

        JupyterLab, Notebook 7 and VS Code render the widget view; nbviewer, GitHub, nbconvert
        and a saved notebook opened without its widget state render ``text/html``: the same
        dashboard as HTML tables with the loss plot embedded as a PNG (one render per call).
        ``text/plain`` is a sentence, not the widget tree's repr.
        """
        bundle = dict(self.widget._repr_mimebundle_(**kwargs))
        bundle["text/html"] = self.static_html()
        bundle["text/plain"] = self._plain_text()
        return bundle

    def _ipython_display_(self) -> None:
        """Display under a display id, so ``close()`` and the end of the run can replace the
        static copy with the final state: a notebook executed headless (nbclient) then keeps
        the dashboard as it ended, not as it was when the cell showing it ran."""
        from IPython.display import display

        if self._display_id is None:
            self._display_id = f"monarch_nb-dashboard-{uuid.uuid4().hex}"
        display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)

    def _plain_text(self) -> str:
        with self._lock:
            _, status, _ = render.run_status(self.model)
            run_id = self.model.run_id or "-"
        return (f"monarch_nb dashboard of run {run_id} ({status}): live widgets in Jupyter, "
                f"a static HTML copy in other viewers")

    def _refresh_static(self) -> None:
        """Replace every displayed copy of this dashboard with the current one (one PNG render);
        nbclient rewrites those outputs in the saved notebook. No-op until displayed."""
        if self._display_id is None:
            return
        try:
            from IPython.display import update_display

            update_display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)
        except Exception as exc:  # never let the static copy break the live view
            self._report_error(exc)

    # ---- events in --------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        t0 = time.thread_time()
        with self._lock:
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

    def _ensure_flusher(self) -> None:
        """Under the lock: start the flusher thread unless it runs (it exits once a stopped run
        is fully drawn, so finished and reopened runs hold no thread)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._flusher, name="monarch_nb-dashboard", daemon=True)
            self._thread.start()

    # ---- flushing ---------------------------------------------------------------------

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
        return self.controls is not None and self.model.live and self.heartbeat_interval_s > 0

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
            with self._lock:
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
                self._refresh_static()  # the run's last state also becomes the static copy
                with self._lock:
                    if not self._dirty:  # else an event came meanwhile: draw it, end again
                        self._thread = None  # a new event restarts us
                        self.stats.flusher_cpu_s = base + time.thread_time() - cpu0
                        return
                continue
            try:
                self._render(due)
            except Exception as exc:  # a rendering bug must not kill live updates
                self._report_error(exc)
            self.stats.flusher_cpu_s = base + time.thread_time() - cpu0
            with self._lock:
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

    def _report_error(self, exc: BaseException) -> None:
        try:
            self.control_status.value = f"<span style='color:#d32f2f'>dashboard error: {type(exc).__name__}: {exc}</span>"
        except Exception:
            pass

    def _set(self, panel: str, widget: Any, value: Any) -> None:
        if widget.value != value:
            widget.value = value
            self.stats.messages[panel] += 1

    def _render(self, panels: set[str]) -> None:
        """Render ``panels`` and send what changed; each panel's CPU cost sets its next interval."""
        with self._render_lock:
            now = self._clock()
            values: dict[str, Any] = {}
            cost: dict[str, float] = {}
            with self._lock:
                m = self.model
                for p in panels:
                    c0 = time.thread_time()
                    if p == HEADER:
                        values[p] = render.header_html(m, now)
                    elif p == HEALTH:
                        values[p] = render.health_html(m.health_cells(now), m.spares)
                        if m.mark_drawn():
                            self._dirty.add(HEALTH)  # next frame (after the throttle) shows the current state
                    elif p == QUORUM:
                        values[p] = render.quorum_html(m.quorum_summary())
                    elif p == TIMELINE:
                        values[p] = render.timeline_html(m)
                    elif p == CONTROLS:
                        values[p] = (sorted(m.replicas), m.live or m.run_id is None)
                    elif p == LOGS:
                        values[p] = self._logs_html()
                    elif p == PLOT:
                        values[p] = (m.plot_data(), render.live_groups_svg(m.live_series, m.started_t,
                                                                          m.reference_time(now)))
                    cost[p] = time.thread_time() - c0
                scheduled = time.monotonic()
                for p in panels:
                    self._next_ok[p] = scheduled + self._interval(p)
            for p in panels:
                c0 = time.thread_time()
                self.stats.renders[p] += 1
                if p == HEADER:
                    self._set(p, self.header, values[p])
                elif p == HEALTH:
                    self._set(p, self.health, values[p])
                elif p == QUORUM:
                    self._set(p, self.quorum, values[p])
                elif p == TIMELINE:
                    self._set(p, self.timeline, values[p])
                elif p == LOGS:
                    self._set(p, self.logs, values[p])
                elif p == CONTROLS:
                    self._render_controls(*values[p])
                elif p == PLOT:
                    data, strip = values[p]
                    self._set(p, self.plot, self._plot.render(data, legend=False))
                    self._set(p, self.plot_caption, render.plot_legend_html(data) + strip)
                cost[p] += time.thread_time() - c0
            with self._lock:
                if threading.current_thread() is self._thread:
                    self._flusher_frames_s += sum(cost.values())
                for p in panels:
                    self._record_cost(p, cost[p])
                    self.stats.cpu_s[p] += cost[p]
                    self._next_ok[p] = scheduled + self._interval(p)
                self.stats.plot_render_s = self._cost[PLOT]
                self.stats.plot_interval_s = self._interval(PLOT)

    def _logs_html(self, *, scroll: bool = True) -> str:
        if self._logs is None:
            return render.logs_html([], None, scroll=scroll)
        self._logs.poll()
        return render.logs_html(self._logs.tail(LOG_LINES), self._logs.log_dir, scroll=scroll)

    def _record_cost(self, panel: str, seconds: float) -> None:
        """Smoothed CPU cost of one frame of ``panel``; the very first frame (imports, font
        cache, comm open) is an outlier and only counts up to a small cap."""
        if self.stats.renders[panel] <= 1:
            self._cost[panel] = min(seconds, 0.002 if panel != PLOT else 0.03)
        else:
            self._cost[panel] = 0.7 * self._cost[panel] + 0.3 * seconds

    def _render_controls(self, replicas: list[int], live: bool) -> None:
        options = [(f"group {r}", r) for r in replicas]
        if list(self.replica_choice.options) != options:
            keep = self.replica_choice.value
            self.replica_choice.options = options
            if replicas:
                self.replica_choice.value = keep if keep in replicas else replicas[0]
            self.stats.messages[CONTROLS] += 1
        if self.controls is not None:
            disabled = not live
            if self.inject_button.disabled != disabled:
                self.inject_button.disabled = disabled
                self.stop_button.disabled = disabled
                self.stats.messages[CONTROLS] += 2

    def flush(self) -> None:
        """Render every panel now, on the calling thread.

        Call it (or ``close()``) in the last cell of a notebook run headless: nbclient stores
        widget state only from messages sent while a cell executes, so every widget's state is
        sent again, changed or not (the flusher may have drawn the last frame between two
        cells, where nbclient does not listen). A displayed dashboard's static copy is redrawn
        too.
        """
        self._flush_widgets()
        for widget in (self.header, self.health, self.quorum, self.plot, self.plot_caption, self.timeline,
                       self.logs, self.replica_choice, self.inject_button, self.stop_button, self.control_status):
            widget.send_state()
        self._refresh_static()

    def _flush_widgets(self) -> None:
        with self._lock:
            self._dirty -= set(PANELS)
        self._render(set(PANELS))

    def close(self, *, final_flush: bool = True) -> None:
        """Stop following the store. The widgets stay displayed with their last state, and a
        displayed dashboard's static copy is redrawn with it (see ``_ipython_display_``)."""
        with self._lock:
            if self._closed:
                return
        self._unsubscribe()
        if final_flush:
            self.flush()
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Dashboard":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- controls ---------------------------------------------------------------------

    def _on_inject_clicked(self, _button: Any = None) -> None:
        if self.inject_button.disabled:  # a click from a stale frontend: the run takes no faults now
            return
        kind, replica = self.fault_kind.value, self.replica_choice.value
        if replica is None:
            self.control_status.value = "<span style='color:#d32f2f'>no replica group to inject into</span>"
            return
        self._call_control(f"inject '{kind}' into group {replica}", "inject", kind, replica=replica)

    def _on_stop_clicked(self, _button: Any = None) -> None:
        if self.stop_button.disabled:
            return
        self._call_control("stop the run", "stop")

    def _call_control(self, what: str, method: str, *args: Any, **kwargs: Any) -> threading.Thread | None:
        """Run a control action off the kernel's message loop (a kill or stop can take seconds)."""
        if self.controls is None:
            self.control_status.value = "<span style='color:#616161'>read-only: no live run attached</span>"
            return None
        self.control_status.value = f"<span class='mnb-control-status' data-state='pending'>{what}&hellip;</span>"

        def call() -> None:
            try:
                getattr(self.controls, method)(*args, **kwargs)
            except Exception as exc:
                self.control_status.value = (f"<span class='mnb-control-status' data-state='error' "
                                             f"style='color:#d32f2f'>could not {what}: "
                                             f"{render._e(type(exc).__name__)}: {render._e(exc)}</span>")
            else:
                self.control_status.value = (f"<span class='mnb-control-status' data-state='done'>"
                                             f"done: {what}</span>")

        thread = threading.Thread(target=call, name=f"monarch_nb-dashboard-{method}", daemon=True)
        thread.start()
        return thread

    # ---- static fallback --------------------------------------------------------------

    def loss_png(self, *, dpi: int | None = None) -> bytes:
        """The loss plot as PNG bytes (rendered now from the model)."""
        with self._lock:
            data = self.model.plot_data()
        with self._render_lock:
            return self._plot.render(data, dpi=dpi)

    def static_html(self, *, include_plot: bool = True) -> str:
        """The dashboard as one HTML block with no JavaScript: plot PNG, health and recoveries."""
        png = self.loss_png() if include_plot else None
        with self._lock:
            return render.static_html(self.model, png, self._clock(), self._logs_html(scroll=False))

    def show_static(self) -> None:
        """Display the static fallback (an image of the loss curves, then HTML tables).

        Readable in a saved notebook or CI artifact without a kernel or widget manager.
        """
        from IPython.display import HTML, Image, display

        display(Image(data=self.loss_png(), format="png"))
        display(HTML(self.static_html(include_plot=False)))
