"""The dashboard's widgets: one per panel, laid out once, and how a frame's content reaches each.

``DashboardWidgets`` builds the ipywidgets tree (header, controls, health grid and quorum beside
the loss plot, recoveries, worker logs) and is the frame loop's painter: ``read`` takes a panel's
content from the model as plain values (HTML from ``dashboard_render``, the plot's sampled data),
``show`` sends it, only when it changed. The loss plot is a matplotlib PNG in an
``ipywidgets.Image``, its legend HTML beside it; the workers' log files are read incrementally.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from .. import worker_logs
from . import dashboard_render as render
from .dashboard_controls import ControlPanel, RunControls
from .dashboard_curves import PlotData
from .dashboard_model import CONTROLS, HEADER, HEALTH, LOGS, PLOT, QUORUM, TIMELINE, DashboardModel

if TYPE_CHECKING:
    import ipywidgets

LOG_LINES = 14  # lines in the log panel (after folding)


class DashboardWidgets:
    """The widget tree of one dashboard (``box``) and its panels' widgets by name.

    Args:
        controls: the run the control panel drives; ``None`` hides the controls.
        log_dir: where the workers' log files are (``None``: no worker logs to show).
    """

    def __init__(self, controls: RunControls | None, log_dir: Path | None) -> None:
        import ipywidgets as w

        self.loss_plot = render.LossPlot()  # drawn under the frame loop's render_lock only
        self._logs = worker_logs.LogFollower(log_dir) if log_dir is not None else None
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
        self._html: dict[str, ipywidgets.HTML] = {HEADER: self.header, HEALTH: self.health, QUORUM: self.quorum,
                                                  TIMELINE: self.timeline, LOGS: self.logs}
        self.control_panel = ControlPanel(controls)

        def section(title: str) -> ipywidgets.HTML:
            return w.HTML(f"<div style='font-weight:bold;font-size:13px;margin-top:6px;"
                          f"border-bottom:1px solid #ccc'>{title}</div>")

        left = w.VBox([section("health (replica group x rank)"), self.health, self.quorum],
                      layout=w.Layout(flex="0 0 auto", margin="0 16px 0 0"))
        right = w.VBox([section("loss"), self.plot, self.plot_caption],
                       layout=w.Layout(flex="1 1 360px", min_width="300px"))
        self.box = w.VBox([
            self.header, self.control_panel.box,
            w.HBox([left, right], layout=w.Layout(flex_flow="row wrap", align_items="flex-start")),
            section("recoveries"), self.timeline,
            section("worker logs (the same line of many ranks once; %monarch logs for more)"), self.logs,
        ])
        self.box.add_class("mnb-dashboard")

    # ---- the frame loop's painter -----------------------------------------------------

    def read(self, panel: str, model: DashboardModel, now: float) -> object:
        """Under the frame loop's lock: ``panel``'s content, taken from ``model``."""
        if panel == HEADER:
            return render.header_html(model, now)
        if panel == HEALTH:
            return render.health_html(model.health_cells(now), model.spares)
        if panel == QUORUM:
            return render.quorum_html(model.quorum_summary())
        if panel == TIMELINE:
            return render.timeline_html(model)
        if panel == CONTROLS:
            return (sorted(model.replicas), model.live or model.run_id is None)
        if panel == LOGS:
            return self.logs_html()
        if panel == PLOT:
            return (model.plot_data(), render.live_groups_svg(model.live_series, model.started_t,
                                                              model.reference_time(now)))
        raise ValueError(f"no panel {panel!r}")

    def show(self, panel: str, value: object) -> int:
        """Send what ``read`` returned to the panel's widgets; the comm messages it took."""
        if panel == CONTROLS:
            replicas, live = cast("tuple[list[int], bool]", value)
            return self.control_panel.show(replicas, live)
        if panel == PLOT:
            data, strip = cast("tuple[PlotData, str]", value)
            return (self._set(self.plot, self.loss_plot.render(data, legend=False))
                    + self._set(self.plot_caption, render.plot_legend_html(data) + strip))
        return self._set(self._html[panel], value)

    def report(self, exc: BaseException) -> None:
        self.control_panel.report(exc)

    @staticmethod
    def _set(widget: ipywidgets.ValueWidget, value: object) -> int:
        if widget.value != value:
            widget.value = value
            return 1
        return 0

    # ---- for the dashboard ------------------------------------------------------------

    def logs_html(self, *, scroll: bool = True) -> str:
        """The workers' newest log lines, folded (reads what the files gained since last time)."""
        if self._logs is None:
            return render.logs_html([], None, scroll=scroll)
        self._logs.poll()
        return render.logs_html(self._logs.tail(LOG_LINES), self._logs.log_dir, scroll=scroll)

    def plot_png(self, data: PlotData, *, dpi: int | None = None) -> bytes:
        """The loss plot as PNG, with its legend drawn in (callers hold the render lock)."""
        return self.loss_plot.render(data, dpi=dpi)

    def send_state(self) -> None:
        """Send every panel widget's whole state again, changed or not."""
        for widget in (self.header, self.health, self.quorum, self.plot, self.plot_caption, self.timeline,
                       self.logs, *self.control_panel.stateful):
            widget.send_state()
