"""The dashboard rendered: the header and quorum panels, and the whole dashboard as one static page.

Each widget's HTML lives in its own module (``render_health``, ``render_plot``, ``render_timeline``)
and is re-exported here, the one place the live widgets and the static fallback import from; both
render the same plain data the model's views return, and rendering never changes the model. The
static page is self-contained (no JavaScript, the plot as an embedded PNG) so a notebook run
headless in CI shows the same health table, recoveries and curves without a kernel.
"""

from __future__ import annotations

from .dashboard_format import esc, fmt_bytes, wall
from .dashboard_groups import run_meeting_period
from .dashboard_model import DashboardModel, QuorumSummary
from .palette import style_of
from .render_health import (
    COMPACT_CELLS,
    DOWN_LISTED,
    SPARE_STATES,
    TILES_PER_ROW,
    health_html,
    health_summary_html,
    health_table_html,
    legend_html,
    spares_html,
)
from .render_plot import (
    GLOBAL_COLOUR,
    MANY_COLOUR,
    REPLICA_COLOURS,
    LossPlot,
    live_groups_svg,
    many_groups,
    plot_legend_html,
    png_data_url,
)
from .render_timeline import PHASE_COLOURS, PHASE_NOTES, events_html, logs_html, recoveries_html, timeline_html

__all__ = ["LossPlot", "run_status", "header_html", "health_html", "health_table_html", "quorum_html",
           "recoveries_html", "events_html", "timeline_html", "static_html", "png_data_url", "style_of",
           "logs_html", "live_groups_svg", "plot_legend_html", "health_summary_html", "legend_html", "spares_html",
           "many_groups", "fmt_bytes", "SPARE_STATES", "COMPACT_CELLS", "TILES_PER_ROW",
           "DOWN_LISTED", "REPLICA_COLOURS", "GLOBAL_COLOUR", "MANY_COLOUR", "PHASE_COLOURS", "PHASE_NOTES"]


# ---- header -----------------------------------------------------------------------------


def run_status(model: DashboardModel) -> tuple[str, str, str]:
    """The run's state as a key (the header's ``data-status``), in words, and its colour.
    A reopened run whose log ends without run_stopped is "interrupted" at its last event,
    never "running"."""
    if model.stopped_t is not None:
        reason = f" ({model.stop_reason})" if model.stop_reason and model.stop_reason != "stopped" else ""
        return "stopped", f"stopped{reason}", "#616161"
    if model.interrupted:
        return ("interrupted", f"interrupted (no run_stopped; last event at {wall(model.last_event_t)})",
                "#b26a00")
    if model.run_id is None:
        if model.reopened:  # a log read back without run_started will never get one
            return "not-started", "no run started in this log", "#616161"
        return "waiting", "waiting for run", "#616161"
    return "running", "running", "#2e7d32"


SYNC_NAMES = {"local_sgd": "LocalSGD", "diloco": "DiLoCo"}


def header_html(model: DashboardModel, now: float) -> str:
    key, status, colour = run_status(model)
    elapsed = ""
    if model.started_t is not None:
        end = model.reference_time(now)
        elapsed = f" &middot; {max(0.0, end - model.started_t):.0f} s"
    ident = ""
    if model.identical is not None:
        step, same = model.identical
        ident = (f" &middot; <span class='mnb-identical' data-identical='{str(same).lower()}'>"
                 f"step {step}: replicas {'bit-identical' if same else 'DIFFER'}</span>")
    meets = run_meeting_period(model.config or {})
    sync = (f" &middot; <span class='mnb-sync'>{esc(SYNC_NAMES.get(str(model.config.get('sync')), 'semi-sync'))}: "
            f"the groups meet every {meets} steps</span>") if meets else ""
    lighthouse = ""
    if model.lighthouse and model.lighthouse.startswith("http"):
        lighthouse = (f" &middot; <a class='mnb-lighthouse' href='{esc(model.lighthouse)}' target='_blank' "
                      f"title='torchft Lighthouse status page: quorum and heartbeats'>Lighthouse</a>")
    return (f"<div class='mnb-header' data-status='{esc(key)}' "
            f"style='font-size:14px;padding:2px 0'>"
            f"<b>monarch_nb run</b> <code>{esc(model.run_id or '-')}</code> "
            f"<span style='color:{colour};font-weight:bold'>{esc(status)}</span>{elapsed}{sync}{ident}{lighthouse}</div>")


# ---- quorum -----------------------------------------------------------------------------


def quorum_html(q: QuorumSummary) -> str:
    qid = "-" if q.quorum_id is None else str(q.quorum_id)
    part = "-" if q.participants is None else str(q.participants)
    pct = f" ({100.0 * q.steps_committed / q.steps_attempted:.1f}%)" if q.steps_attempted else ""
    gstep = "-" if q.global_step is None else str(q.global_step)
    degraded = q.participants is not None and q.participants < q.total_groups
    colour = "#b26a00" if degraded else "inherit"
    return (f"<div class='mnb-quorum' data-quorum-id='{qid}' data-participants='{part}' "
            f"data-total='{q.total_groups}' data-committed='{q.steps_committed}' data-attempted='{q.steps_attempted}' "
            f"style='font-family:sans-serif;font-size:13px;padding:2px 0;white-space:normal;line-height:1.5'>"
            f"<b>quorum</b> {qid} &middot; <span style='color:{colour}'><b>{part}/{q.total_groups}</b> groups "
            f"participating</span><br><b>steps committed</b> {q.steps_committed} / {q.steps_attempted} "
            f"attempted{pct}<br>global step {gstep}{_cost(q)}</div>")


def _cost(q: QuorumSummary) -> str:
    if not q.pace_s:
        return ""
    return (f"<br><span class='mnb-fault-cost' data-stalled-s='{q.stalled_s:.2f}'><b>faults cost</b> "
            f"{q.stalled_s:.1f} s (&asymp; {q.stalled_s / q.pace_s:.0f} steps at its own median of "
            f"{q.pace_s * 1000:.0f} ms)</span>")


# ---- the static page -------------------------------------------------------------------


def static_html(model: DashboardModel, png: bytes | None, now: float, logs: str = "") -> str:
    """The whole dashboard as one self-contained HTML block (no JavaScript, no widgets).

    With ``png`` the loss plot is embedded as a data URL; without, only the tables.
    """
    cells = model.health_cells(now)
    img = f"<img class='mnb-static-plot' alt='loss curves' src='{png_data_url(png)}'/>" if png else ""
    img += live_groups_svg(model.live_series, model.started_t, model.reference_time(now))
    return ("<div class='mnb-static' style='font-family:sans-serif'>"
            + header_html(model, now)
            + quorum_html(model.quorum_summary())
            + img
            + "<h4 style='margin:4px 0'>health</h4>" + health_table_html(cells)
            + "<h4 style='margin:4px 0'>recoveries</h4>" + recoveries_html(model.recoveries, model.started_t, bars=False,
                                                                            dropped=model.tracker.dropped)
            + "<h4 style='margin:4px 0'>events</h4>" + events_html(sorted(model.event_log(100), key=lambda line: line.t), model.started_t, scroll=False)
            + ("<h4 style='margin:4px 0'>worker logs</h4>" + logs if logs else "")
            + "</div>")
