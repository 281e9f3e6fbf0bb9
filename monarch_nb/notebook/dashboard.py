"""The live dashboard: ipywidgets that observe a run's telemetry store and redraw themselves.

``Dashboard(store, controls)`` subscribes to an ``EventStore`` (replaying its history first) and
wires three parts: a ``DashboardModel`` that folds events into plain data, the widgets that show it
(``dashboard_widgets``, with the controls of ``dashboard_controls`` when a live run is attached),
and the frame loop that redraws them, throttled to a small CPU budget (``dashboard_frames``).
Displayed, its output carries the widget view and a static copy (``text/html``, the plot as an
embedded PNG) under one display id; the copy is redrawn when the run ends and on ``close()``, so a
notebook saved after a headless run shows the final dashboard to a viewer without widgets.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..telemetry.store import EventStore
from . import dashboard_render as render
from .dashboard_controls import RunControls
from .dashboard_frames import CPU_SPLIT, DashboardStats, FrameLoop
from .dashboard_model import FAULT_KINDS, DashboardModel
from .dashboard_widgets import LOG_LINES, DashboardWidgets

if TYPE_CHECKING:
    import ipywidgets

__all__ = ["Dashboard", "DashboardStats", "RunControls", "FAULT_KINDS", "CPU_SPLIT", "LOG_LINES"]


class Dashboard:
    """Live (or replayed) dashboard of one FT run. Display it; ``close()`` stops updates.

    Args:
        store: the run's events; a store read back from disk (``EventStore.open``) with no
            ``controls`` is a finished or interrupted run, drawn once.
        controls: the run (``inject(kind, replica=...)`` and ``stop()``); ``None`` for a
            reopened or finished run, which hides the controls.
        max_hz: most frames a second of any one panel.
        cpu_share: the UI's CPU budget as a share of one core (default 3%): the plot redraws
            every one to a few seconds, the health grid up to ``max_hz``.
        max_plot_interval_s: longest wait between two plot frames, whatever they cost.
        heartbeat_interval_s: seconds between redraws of a live run's heartbeat ages (0: never).
        clock: the wall clock heartbeat ages are measured against.
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
        self._clock = clock
        # Built from a log read back from disk with no run attached: nothing will append, so
        # a run without run_stopped in it shows as interrupted (see DashboardModel.interrupted).
        self.model = DashboardModel(reopened=controls is None and store.reopened)
        # The workers' log files sit beside the event log (<run_dir>/logs), read incrementally.
        log_dir = store.path.parent / "logs" if getattr(store, "path", None) else None
        self.widgets = DashboardWidgets(controls, log_dir)
        self.frames = FrameLoop(self.model, self.widgets, attached=controls is not None, max_hz=max_hz,
                                cpu_share=cpu_share, max_plot_interval_s=max_plot_interval_s,
                                heartbeat_interval_s=heartbeat_interval_s, clock=clock,
                                on_settled=self._refresh_static)
        self._display_id: str | None = None  # set once displayed in IPython (see _ipython_display_)

        self._unsubscribe = self.frames.follow(store)
        self.frames.draw_all()  # the widgets hold the full history before they are displayed
        self.frames.start()

    @classmethod
    def open(cls, path: str | Path, **kwargs: Any) -> "Dashboard":
        """A read-only dashboard of a run directory (or its ``events.jsonl``)."""
        return cls(EventStore.open(path), controls=None, **kwargs)

    # ---- the widgets, by the names a notebook reads them ------------------------------

    @property
    def widget(self) -> ipywidgets.VBox:
        """The whole dashboard, one widget."""
        return self.widgets.box

    @property
    def stats(self) -> DashboardStats:
        return self.frames.stats

    @property
    def header(self) -> ipywidgets.HTML:
        return self.widgets.header

    @property
    def health(self) -> ipywidgets.HTML:
        return self.widgets.health

    @property
    def quorum(self) -> ipywidgets.HTML:
        return self.widgets.quorum

    @property
    def plot(self) -> ipywidgets.Image:
        return self.widgets.plot

    @property
    def plot_caption(self) -> ipywidgets.HTML:
        return self.widgets.plot_caption

    @property
    def timeline(self) -> ipywidgets.HTML:
        return self.widgets.timeline

    @property
    def logs(self) -> ipywidgets.HTML:
        return self.widgets.logs

    @property
    def controls_box(self) -> ipywidgets.HBox:
        return self.widgets.control_panel.box

    @property
    def fault_kind(self) -> ipywidgets.Dropdown:
        return self.widgets.control_panel.fault_kind

    @property
    def replica_choice(self) -> ipywidgets.Dropdown:
        return self.widgets.control_panel.replica_choice

    @property
    def inject_button(self) -> ipywidgets.Button:
        return self.widgets.control_panel.inject_button

    @property
    def stop_button(self) -> ipywidgets.Button:
        return self.widgets.control_panel.stop_button

    @property
    def control_status(self) -> ipywidgets.HTML:
        return self.widgets.control_panel.control_status

    # ---- display ----------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
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
        with self.frames.lock:
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
            self.widgets.report(exc)

    # ---- lifetime ---------------------------------------------------------------------

    def flush(self) -> None:
        """Render every panel now, on the calling thread.

        Call it (or ``close()``) in the last cell of a notebook run headless: nbclient stores
        widget state only from messages sent while a cell executes, so every widget's state is
        sent again, changed or not (the flusher may have drawn the last frame between two
        cells, where nbclient does not listen). A displayed dashboard's static copy is redrawn
        too.
        """
        self.frames.draw_all()
        self.widgets.send_state()
        self._refresh_static()

    def close(self, *, final_flush: bool = True) -> None:
        """Stop following the store. The widgets stay displayed with their last state, and a
        displayed dashboard's static copy is redrawn with it (see ``_ipython_display_``)."""
        with self.frames.lock:
            if self.frames.closed:
                return
        self._unsubscribe()
        if final_flush:
            self.flush()
        self.frames.stop()

    @property
    def closed(self) -> bool:
        return self.frames.closed

    def __enter__(self) -> "Dashboard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- static fallback --------------------------------------------------------------

    def loss_png(self, *, dpi: int | None = None) -> bytes:
        """The loss plot as PNG bytes (rendered now from the model)."""
        with self.frames.lock:
            data = self.model.plot_data()
        with self.frames.render_lock:
            return self.widgets.plot_png(data, dpi=dpi)

    def static_html(self, *, include_plot: bool = True) -> str:
        """The dashboard as one HTML block with no JavaScript: plot PNG, health and recoveries."""
        png = self.loss_png() if include_plot else None
        with self.frames.lock:
            return render.static_html(self.model, png, self._clock(), self.widgets.logs_html(scroll=False))

    def show_static(self) -> None:
        """Display the static fallback (an image of the loss curves, then HTML tables).

        Readable in a saved notebook or CI artifact without a kernel or widget manager.
        """
        from IPython.display import HTML, Image, display

        display(Image(data=self.loss_png(), format="png"))
        display(HTML(self.static_html(include_plot=False)))
