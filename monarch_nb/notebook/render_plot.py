"""The loss plot: a matplotlib image of every group's loss, the committed global loss and the
fault, failure and heal markers; its legend as HTML; the groups-training strip under it.

Drawn with matplotlib's Agg renderer on a private ``Figure`` (never pyplot, so it is safe off the
main thread and independent of the notebook's backend) and encoded as PNG: the same image is the
live ``ipywidgets.Image`` value and the static fallback's embedded picture. It needs no frontend
extension (ipympl would add a round trip per frame and stays blank under nbclient; bqplot would
add ~1 MB of JavaScript). Drawing reads ``PlotData`` (plain data) and never changes the model.
"""

from __future__ import annotations

import base64
import bisect
import io
import itertools
import math
from typing import TYPE_CHECKING, Sequence

from .dashboard_curves import PlotData

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D

# Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
REPLICA_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
GLOBAL_COLOUR = "#000000"
# More groups than colours: every group is one thin line of this colour (all drawn as one
# artist), the committed global loss stands out on top, markers say which group.
MANY_COLOUR = "#7f9bb3"


def many_groups(n: int) -> bool:
    """Whether ``n`` groups are too many for one colour each (colours would repeat)."""
    return n > len(REPLICA_COLOURS)


def _flat_xy(groups: list[list[tuple[float, float]]], *, gap: bool) -> np.ndarray:
    """The points of every group as one (n, 2) array, with a NaN row between groups when
    ``gap`` (one line artist draws them all, broken between groups)."""
    import numpy as np

    points: list[tuple[float, float]] = []
    for pts in groups:
        if gap and points:
            points.append((math.nan, math.nan))
        points.extend(pts)
    return np.fromiter(itertools.chain.from_iterable(points), float, count=2 * len(points)).reshape(-1, 2)


class LossPlot:
    """Loss curves (one line per replica group + committed global loss) with fault/heal markers.

    Keeps one matplotlib Figure whose artists are updated in place (new data, rescaled axes)
    rather than rebuilt: clearing the axes re-creates ticks and text and costs more than the
    drawing itself. Not thread-safe: one renderer at a time (the dashboard holds a lock).
    """

    MARKER_STYLE = {"fault": dict(marker="X", color="#d32f2f", s=90, label="fault injected"),
                    "failure": dict(marker="v", color="#d32f2f", s=70, label="failure"),
                    "heal": dict(marker="^", color="#1565c0", s=80, label="healed"),
                    "meeting": dict(marker="o", color="#2e7d32", s=22, label="groups met")}

    def __init__(self, *, width_in: float = 7.5, height_in: float = 3.0, dpi: int = 80) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=(width_in, height_in), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        # Fixed margins: tight_layout would cost more than drawing the plot itself.
        self.fig.subplots_adjust(left=0.09, right=0.98, top=0.9, bottom=0.16)
        ax = self.ax = self.fig.add_subplot()
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        # Fixed label positions: placing them from the tick labels' extents costs a sixth of a frame.
        ax.xaxis.set_label_coords(0.5, -0.12)
        ax.yaxis.set_label_coords(-0.075, 0.5)
        ax.grid(True, alpha=0.3)
        self.heading = self.fig.text(0.5, 0.955, "", ha="center", va="center", fontsize=10)
        self._lines: dict[int, Line2D] = {}
        self._dropped: dict[int, PathCollection] = {}
        (self._global,) = ax.plot([], [], lw=1.6, ls="--", color=GLOBAL_COLOUR, alpha=0.8,
                                  label="committed (global)", zorder=4)
        (self._held_out,) = ax.plot([], [], lw=1.4, ls=":", marker="o", markersize=3, color=GLOBAL_COLOUR,
                                    label="held-out (validator)", zorder=4)
        self._marks = {k: ax.scatter([], [], zorder=5, edgecolors="white", linewidths=0.8, **st)
                       for k, st in self.MARKER_STYLE.items()}
        self._vlines = {k: LineCollection([], colors=st["color"], linewidths=0.7,
                                          alpha=0.25 if k == "meeting" else 0.6,
                                          linestyles="--" if k == "heal" else ":",
                                          transform=ax.get_xaxis_transform())
                        for k, st in self.MARKER_STYLE.items()}
        for lc in self._vlines.values():
            ax.add_collection(lc, autolim=False)
        # Many groups: all lines as one artist (a NaN between groups), all dropped steps as one.
        (self._many,) = ax.plot([], [], lw=0.8, color=MANY_COLOUR, alpha=0.8, label="each group")
        self._many_dropped = ax.scatter([], [], s=10, facecolors="none", edgecolors=MANY_COLOUR, linewidths=0.7)
        self._legend_key: tuple = ()

    def _replica_artists(self, replica: int) -> tuple[Line2D, PathCollection]:
        if replica not in self._lines:
            colour = REPLICA_COLOURS[replica % len(REPLICA_COLOURS)]
            (self._lines[replica],) = self.ax.plot([], [], lw=1.4, color=colour, alpha=0.9, label=f"group {replica}")
            self._dropped[replica] = self.ax.scatter([], [], s=12, facecolors="none", edgecolors=colour,
                                                     linewidths=0.8)
        return self._lines[replica], self._dropped[replica]

    def render(self, data: PlotData, *, dpi: int | None = None, legend: bool = True) -> bytes:
        """Draw and encode as PNG. The live view passes ``legend=False`` and shows the legend as
        HTML (``plot_legend_html``): drawing legend text is half the cost of a frame."""
        import numpy as np

        ax = self.ax
        series = data.committed
        many = many_groups(len(series))
        if many:  # one artist for every group: its cost does not grow with the number of groups
            for line, dropped in zip(self._lines.values(), self._dropped.values()):
                line.set_data([], [])
                dropped.set_offsets(np.empty((0, 2)))
            xy = _flat_xy([pts for pts in series.values() if pts], gap=True)
            self._many.set_data(xy[:, 0], xy[:, 1])
            self._many_dropped.set_offsets(_flat_xy([pts for pts in data.dropped.values() if pts], gap=False))
        else:
            self._many.set_data([], [])
            self._many_dropped.set_offsets(np.empty((0, 2)))
            for replica, committed in series.items():
                line, dropped = self._replica_artists(replica)
                line.set_data(*(zip(*committed) if committed else ([], [])))
                dropped.set_offsets(np.array(data.dropped.get(replica, []), dtype=float).reshape(-1, 2))
        glob = data.global_loss
        self._global.set_data(*(zip(*glob) if glob else ([], [])))
        held = list(data.held_out)
        self._held_out.set_data(*(zip(*held) if held else ([], [])))
        self._update_markers(data)
        kinds = {m.kind for m in data.markers}
        groups = (f"{len(series)} groups",) if many else tuple(sorted(series))
        shown = groups + (("held-out",) if held else ()) + tuple(k for k in self.MARKER_STYLE if k in kinds)
        if not legend:
            shown = ()
        if shown != self._legend_key:
            self._legend_key = shown
            if ax.get_legend() is not None:
                ax.get_legend().remove()
            if shown:
                if many:
                    self._many.set_label(f"each of {len(series)} groups")
                lines = [self._many] if many else [self._lines[r] for r in sorted(series)]
                handles = lines + [self._global] + ([self._held_out] if held else []) + \
                    [self._marks[k] for k in self.MARKER_STYLE if k in shown]
                ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=2, framealpha=0.8)
        ax.relim()
        ax.autoscale_view()
        # The live frame draws no text that changes every frame (its caption, HTML, says it):
        # matplotlib keeps the size of every string it has laid out (4,096 of them), so a new
        # heading per frame filled that cache for an hour of frames, ~3 MB of the kernel's slope.
        self.heading.set_text(heading_text(data) if legend else "")
        return self._png(dpi)

    def _update_markers(self, data: PlotData) -> None:
        import numpy as np

        series = data.committed
        glob = dict(data.global_loss)
        curves: dict[int, tuple[list[float], list[float], bool]] = {}

        def curve(replica: int) -> tuple[list[float], list[float], bool]:
            """The group's steps and losses without the NaN breaks, and whether the steps only
            go up (a run restarted from a checkpoint repeats steps); once per frame."""
            if replica not in curves:
                pts = [(s, l) for s, l in series.get(replica, []) if s == s]
                steps = [s for s, _ in pts]
                curves[replica] = (steps, [l for _, l in pts], all(a <= b for a, b in zip(steps, steps[1:])))
            return curves[replica]

        def y_at(replica: int, step: int, after: bool) -> float | None:
            """The group's loss at its last point up to ``step`` (a fault) or its first point
            from ``step`` on (a heal: the group has no points while it was down). A binary
            search: markers grow with the run (and with the number of groups), points per
            group are capped, so a frame costs O(markers x log points), not their product."""
            steps, losses, ordered = curve(replica)
            if not ordered:
                pts = list(zip(steps, losses))
                if after:
                    best = next((l for s, l in pts if s >= step), None)
                else:
                    best = next((l for s, l in reversed(pts) if s <= step), None)
            elif after:
                i = bisect.bisect_left(steps, step)
                best = losses[i] if i < len(steps) else None
            else:
                i = bisect.bisect_right(steps, step)
                best = losses[i - 1] if i > 0 else None
            return glob.get(step) if best is None else best

        for kind in self.MARKER_STYLE:
            marks = [m for m in data.markers if m.kind == kind and m.step is not None]
            pts = [(m.step, y) for m in marks if (y := y_at(m.replica, m.step, kind == "heal")) is not None]
            self._marks[kind].set_offsets(np.array(pts, dtype=float).reshape(-1, 2))
            self._vlines[kind].set_segments([[(m.step, 0.0), (m.step, 1.0)] for m in marks])

    def _png(self, dpi: int | None) -> bytes:
        from PIL import Image

        buf = io.BytesIO()
        if dpi is not None and dpi != self.fig.dpi:
            self.fig.savefig(buf, format="png", dpi=dpi)
            return buf.getvalue()
        self.canvas.draw()  # one draw; savefig would draw twice
        w, h = self.canvas.get_width_height()
        Image.frombuffer("RGBA", (w, h), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1) \
            .convert("RGB").save(buf, format="png", compress_level=1)
        return buf.getvalue()


def plot_legend_html(data: PlotData) -> str:
    """The plot's legend as HTML (the live view draws none in the image; see LossPlot.render)."""
    items = []
    if many_groups(len(data.committed)):
        items.append(f"<span class='mnb-plot-groups' data-groups='{len(data.committed)}' style='color:{MANY_COLOUR};"
                     f"font-weight:bold'>&#x2501; each of {len(data.committed)} groups</span>")
    else:
        for replica in sorted(data.committed):
            colour = REPLICA_COLOURS[replica % len(REPLICA_COLOURS)]
            items.append(f"<span style='color:{colour};font-weight:bold'>&#x2501; group {replica}</span>")
    items.append(f"<span style='color:{GLOBAL_COLOUR}'>&#x2504; committed (global)</span>")
    kinds = {m.kind for m in data.markers}
    glyphs = {"fault": ("&#x2716;", "fault injected"), "failure": ("&#x25bc;", "failure"),
              "heal": ("&#x25b2;", "healed"), "meeting": ("&#x25cf;", "groups met (LocalSGD / DiLoCo)")}
    for kind, (glyph, label) in glyphs.items():
        if kind in kinds:
            colour = LossPlot.MARKER_STYLE[kind]["color"]
            items.append(f"<span style='color:{colour}'>{glyph} {label}</span>")
    return (f"<span class='mnb-plot-caption' data-points='{data.point_count}' data-markers='{len(data.markers)}' "
            f"style='font-size:11px;color:#555'>{' &nbsp; '.join(items)} &nbsp; "
            f"({data.point_count} points, {len(data.markers)} markers, global step {_step(data)})"
            f"{_hit_html(data)}</span>")


def _hit_html(data: PlotData, last: int = 3) -> str:
    """Which groups the newest faults hit, by step: a wave's markers sit on one step, one over the
    other (the groups' losses are alike), so the plot alone cannot say which groups they were."""
    by_step: dict[int, list[int]] = {}
    for m in data.markers:
        if m.kind == "fault" and m.step is not None:
            by_step.setdefault(m.step, []).append(m.replica)
    if not by_step:
        return ""
    colour = LossPlot.MARKER_STYLE["fault"]["color"]
    rows = [f"step {step}: group{'s' if len(set(hit)) > 1 else ''} {', '.join(map(str, sorted(set(hit))))}"
            for step, hit in sorted(by_step.items())[-last:]]
    return (f"<br><span class='mnb-plot-hits' style='color:{colour}'>&#x2716; faults at "
            + " &middot; ".join(rows) + "</span>")


def heading_text(data: PlotData) -> str:
    """The static image's heading (the live view's caption says the same in HTML)."""
    return f"loss: {data.point_count} points, global step {_step(data)}"


def _step(data: PlotData) -> str:
    return "-" if data.global_step is None else str(data.global_step)


def png_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def live_groups_svg(series: Sequence[tuple[float, int]], t0: float | None, end: float, width: int = 600,
                    height: int = 56) -> str:
    """A strip under the loss plot: how many groups trained, over the run's wall time."""
    if not series or t0 is None:
        return ""
    top = max(n for _, n in series) or 1
    span = max(end - t0, 1e-6)
    x = lambda t: 30 + (width - 36) * (max(t, t0) - t0) / span  # noqa: E731
    y = lambda n: 6 + (height - 18) * (1 - n / top)  # noqa: E731
    points, last = [], None
    for t, n in series:
        if last is not None:
            points.append(f"{x(t):.1f},{y(last):.1f}")
        points.append(f"{x(t):.1f},{y(n):.1f}")
        last = n
    points.append(f"{x(end):.1f},{y(last):.1f}")
    labels: list[int] = []  # 0, the top, and the levels seen, each at least a label's height apart
    for n in [top, 0, *sorted({n for _, n in series}, reverse=True)]:
        if all(abs(y(n) - y(m)) >= 9 for m in labels):
            labels.append(n)
    ticks = "".join(f"<text x='26' y='{y(n) + 3:.1f}' font-size='9' text-anchor='end'>{n}</text>"
                    for n in sorted(labels))
    return (f"<svg class='mnb-live-groups' data-max='{top}' data-now='{series[-1][1]}' width='{width}' "
            f"height='{height}' role='img' aria-label='groups training over time, now {series[-1][1]}'>"
            f"<text x='{width // 2}' y='{height - 2}' font-size='9' text-anchor='middle'>groups training "
            f"over wall time ({span:.0f} s)</text>{ticks}"
            f"<polyline fill='none' stroke='#2e7d32' stroke-width='1.5' points='{' '.join(points)}'/></svg>")
