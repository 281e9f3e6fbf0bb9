"""Rendering of the dashboard model: HTML fragments for the panels and a matplotlib loss plot.

The same functions feed the live widgets (ipywidgets ``HTML``/``Image`` values) and the static
fallback (one self-contained HTML block with the plot as an embedded PNG), so a notebook run
headless in CI shows the same health table, recoveries and curves without a kernel.

Plotting is matplotlib's Agg renderer on a private ``Figure`` (never pyplot, so it is safe off
the main thread and independent of the notebook's backend), encoded as PNG. Every element
carries ``mnb-*`` classes and ``data-*`` attributes so tests (and users' CSS) can find it.
"""

from __future__ import annotations

import base64
import bisect
import html
import io
import itertools
import math
import time
from typing import Any, Iterable

from ..ft.control.groups import GROUP_STATES
from ..ft.record.recovery import PHASES, Recovery
from .dashboard_model import DashboardModel, HealthCell, LogLine, PlotData, QuorumSummary, fmt_bytes
from .palette import STATE_STYLES, style_of

SPARE_STATES = ("building", "ready")  # a warm spare waiting outside the quorum (monarch_nb.ft.control.spares)
# Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
REPLICA_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
GLOBAL_COLOUR = "#000000"
# More groups than colours: every group is one thin line of this colour (all drawn as one
# artist), the committed global loss stands out on top, markers say which group.
MANY_COLOUR = "#7f9bb3"


def many_groups(n: int) -> bool:
    """Whether ``n`` groups are too many for one colour each (colours would repeat)."""
    return n > len(REPLICA_COLOURS)


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _clock(t: float | None, t0: float | None) -> str:
    if t is None:
        return "-"
    if t0 is not None:
        return f"+{t - t0:.1f} s"
    return time.strftime("%H:%M:%S", time.localtime(t))


def _wall(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# ---- header -----------------------------------------------------------------------------


def run_status(model: DashboardModel) -> tuple[str, str, str]:
    """The run's state as a key (the header's ``data-status``), in words, and its colour.
    A reopened run whose log ends without run_stopped is "interrupted" at its last event,
    never "running"."""
    if model.stopped_t is not None:
        reason = f" ({model.stop_reason})" if model.stop_reason and model.stop_reason != "stopped" else ""
        return "stopped", f"stopped{reason}", "#616161"
    if model.interrupted:
        return ("interrupted", f"interrupted (no run_stopped; last event at {_wall(model.last_event_t)})",
                "#b26a00")
    if model.run_id is None:
        if model.reopened:  # a log read back without run_started will never get one
            return "not-started", "no run started in this log", "#616161"
        return "waiting", "waiting for run", "#616161"
    return "running", "running", "#2e7d32"


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
    lighthouse = ""
    if model.lighthouse and model.lighthouse.startswith("http"):
        lighthouse = (f" &middot; <a class='mnb-lighthouse' href='{_e(model.lighthouse)}' target='_blank' "
                      f"title='torchft Lighthouse status page: quorum and heartbeats'>Lighthouse</a>")
    return (f"<div class='mnb-header' data-status='{_e(key)}' "
            f"style='font-size:14px;padding:2px 0'>"
            f"<b>monarch_nb run</b> <code>{_e(model.run_id or '-')}</code> "
            f"<span style='color:{colour};font-weight:bold'>{_e(status)}</span>{elapsed}{ident}{lighthouse}</div>")


# ---- health grid ------------------------------------------------------------------------


def _cell_html(c: HealthCell) -> str:
    st = c.style
    step = "-" if c.last_committed_step is None else str(c.last_committed_step)
    age = "-" if c.heartbeat_age_s is None else f"{c.heartbeat_age_s:.0f} s ago" if c.heartbeat_age_s >= 10 \
        else f"{c.heartbeat_age_s:.1f} s ago"
    detail = f"<div class='mnb-cell-detail' style='font-size:11px;opacity:.9'>{_e(c.detail)}</div>" if c.detail else ""
    return (f"<div class='mnb-cell mnb-state-{_e(c.state)}' data-replica='{c.replica}' data-rank='{c.rank}' "
            f"data-state='{_e(c.state)}' data-step='{step}' title='{_e(c.text)}' role='status' "
            f"aria-label='{_e(c.text)}' style='background:{st.background};color:{st.foreground};"
            f"border-radius:4px;padding:2px 6px;min-width:112px;font-family:sans-serif;font-size:12px;line-height:1.35'>"
            f"<div class='mnb-cell-id' style='font-size:11px'>group {c.replica} &middot; rank {c.rank}</div>"
            f"<div class='mnb-cell-state' style='font-weight:bold'>{_e(st.glyph)} {_e(st.label)}</div>"
            f"<div class='mnb-cell-step'>step {step} &middot; <span class='mnb-cell-age'>{_e(age)}</span></div>"
            f"{detail}</div>")


def legend_html() -> str:
    """The states a group (or a warm spare) can be in; process and call states are not shown here."""
    items = []
    for state in (*GROUP_STATES, *SPARE_STATES):
        st = style_of(state)
        items.append(f"<span style='background:{st.background};color:{st.foreground};padding:0 4px;"
                     f"border-radius:3px;margin-right:4px;white-space:nowrap'>{_e(st.glyph)} {_e(st.label)}</span>")
    # width:0 + min-width:100%: as wide as the grid above, never widening it; wraps inside.
    return (f"<div class='mnb-legend' style='width:0;min-width:100%;font-size:11px;white-space:normal;"
            f"line-height:1.7;margin-top:3px'>{' '.join(items)}</div>")


def spares_html(spares: dict[int, tuple[str, str]]) -> str:
    """Warm spare groups waiting outside the quorum (built, or still building)."""
    if not spares:
        return ""
    items = []
    for index, (state, detail) in sorted(spares.items()):
        st = style_of(state)
        items.append(f"<span class='mnb-spare' data-spare='{index}' data-state='{_e(state)}' title='{_e(detail)}' "
                     f"style='background:{st.background};color:{st.foreground};padding:0 5px;border-radius:3px;"
                     f"margin-right:4px;white-space:nowrap'>{_e(st.glyph)} spare {index} {_e(st.label)}</span>")
    return f"<div class='mnb-spares' style='margin-top:4px;font-size:12px'>{''.join(items)}</div>"


# More processes than this: the grid shows one small tile per process (state glyph, group
# number, colour; the rest on hover) and lists the groups that are not training in words.
COMPACT_CELLS = 12
TILES_PER_ROW = 8
# Group states the compact grid's list names group by group (the others are only counted).
_QUIET_STATES = ("training", "stopped", "finished", "retired")
DOWN_LISTED = 8  # groups the compact list names; more are counted


def _tile_html(c: HealthCell, group_size: int) -> str:
    st = c.style
    name = f"{c.replica}.{c.rank}" if group_size > 1 else str(c.replica)
    step = "-" if c.last_committed_step is None else str(c.last_committed_step)
    text = _e(c.text)
    return (f"<div class='mnb-cell mnb-state-{_e(c.state)}' data-replica='{c.replica}' data-rank='{c.rank}' "
            f"data-state='{_e(c.state)}' data-step='{step}' title='{text}' role='status' aria-label='{text}' "
            f"style='background:{st.background};color:{st.foreground};border-radius:3px;padding:1px 3px;"
            f"min-width:38px;text-align:center;white-space:nowrap;font-family:sans-serif;font-size:12px;"
            f"line-height:1.5'>{_e(st.glyph)} {name}</div>")


def _badge(st: Any, text: str) -> str:
    return (f"<span style='background:{st.background};color:{st.foreground};padding:0 4px;border-radius:3px;"
            f"white-space:nowrap'>{text}</span>")


def health_summary_html(cells: list[HealthCell]) -> str:
    """Under the compact grid: processes per state, the committed-step spread, the oldest
    heartbeat, and each group that is not training (or stopped/finished) with why, in words."""
    counts: dict[str, int] = {}
    groups: dict[int, list[HealthCell]] = {}
    steps = [c.last_committed_step for c in cells if c.last_committed_step is not None]
    oldest: HealthCell | None = None
    for c in cells:
        counts[c.state] = counts.get(c.state, 0) + 1
        groups.setdefault(c.replica, []).append(c)
        if c.heartbeat_age_s is not None and (oldest is None or c.heartbeat_age_s > oldest.heartbeat_age_s):
            oldest = c
    order = list(STATE_STYLES)
    states = sorted(counts, key=lambda s: order.index(s) if s in order else len(order))
    who = f"{len(groups)} groups" + ("" if len(cells) == len(groups) else f", {len(cells)} processes")
    line = " ".join(_badge(style_of(s), f"{_e(style_of(s).glyph)} {counts[s]} {_e(style_of(s).label)}")
                    for s in states)
    facts = []
    if steps:
        low, high = min(steps), max(steps)
        facts.append(f"committed step {low}" if low == high else f"committed step {low}&ndash;{high}")
    if oldest is not None and oldest.heartbeat_age_s >= 2.0:
        facts.append(f"oldest heartbeat {oldest.heartbeat_age_s:.0f} s ago (group {oldest.replica})")
    elif oldest is not None:
        facts.append("every group heard from within 2 s")
    down = [(r, g) for r, g in groups.items() if g[0].state not in _QUIET_STATES]
    items = []
    for replica, group in down[:DOWN_LISTED]:
        c, st = group[0], group[0].style
        details = list(dict.fromkeys(x.detail for x in group if x.detail))
        if len(details) > 1:  # a failed group: the dead rank says why, the others only that it is down
            details = [d for d in details if not d.startswith("group down")] or details
        step = "-" if c.last_committed_step is None else str(c.last_committed_step)
        items.append(f"<div class='mnb-down' data-replica='{replica}' data-state='{_e(c.state)}'>"
                     f"{_badge(st, f'{_e(st.glyph)} {_e(st.label)}')} group {replica} &middot; step {step}"
                     + "".join(f" &middot; {_e(d)}" for d in details) + "</div>")
    if len(down) > DOWN_LISTED:
        items.append(f"<div class='mnb-down-more'>and {len(down) - DOWN_LISTED} more groups not training "
                     f"(hover a tile for its state)</div>")
    return (f"<div class='mnb-health-summary' data-down='{len(down)}' style='width:0;min-width:100%;"
            f"font-family:sans-serif;font-size:12px;line-height:1.7;margin-top:4px;white-space:normal'>"
            f"<div>{who}: {line}</div>"
            f"<div style='color:#555'>{' &middot; '.join(facts)}</div>{''.join(items)}</div>")


def health_html(cells: list[HealthCell], spares: dict[int, tuple[str, str]] | None = None, *,
                compact: bool | None = None) -> str:
    """The health grid: one cell per process with its state, step and heartbeat; with more
    than ``COMPACT_CELLS`` processes (or ``compact=True``) a tile per process, wrapped
    ``TILES_PER_ROW`` to a row (whole groups to a row), and the groups not training listed."""
    if not cells:
        return "<div class='mnb-health' data-cells='0'><i>no processes yet</i></div>"
    group_size = max(c.rank for c in cells) + 1
    if compact is None:
        compact = len(cells) > COMPACT_CELLS
    if compact:
        columns = group_size * max(1, TILES_PER_ROW // group_size)
        body = "".join(_tile_html(c, group_size) for c in cells)
        gap, extra = "3px", health_summary_html(cells)
    else:
        columns = group_size
        body = "".join(_cell_html(c) for c in cells)
        gap, extra = "4px", ""
    return (f"<div class='mnb-health' data-cells='{len(cells)}' data-compact='{str(compact).lower()}' "
            f"style='display:inline-block;min-width:250px'>"
            f"<div style='display:grid;grid-template-columns:repeat({columns},max-content);gap:{gap}'>{body}</div>"
            f"{extra}{spares_html(spares or {})}{legend_html()}</div>")


def live_groups_svg(series: list[tuple[float, int]], t0: float | None, end: float, width: int = 600,
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


def health_table_html(cells: list[HealthCell]) -> str:
    """Health as a plain table (static fallback: readable in any HTML viewer, no CSS grid)."""
    rows = []
    for c in cells:
        st = c.style
        step = "-" if c.last_committed_step is None else str(c.last_committed_step)
        age = "-" if c.heartbeat_age_s is None else f"{c.heartbeat_age_s:.1f} s"
        rows.append(f"<tr class='mnb-row' data-replica='{c.replica}' data-rank='{c.rank}' data-state='{_e(c.state)}'>"
                    f"<td>{c.replica}</td><td>{c.rank}</td>"
                    f"<td style='background:{st.background};color:{st.foreground};font-weight:bold'>"
                    f"{_e(st.glyph)} {_e(st.label)}</td><td>{step}</td><td>{age}</td><td>{_e(c.detail)}</td></tr>")
    return ("<table class='mnb-health-table' border='1' style='border-collapse:collapse;font-size:12px'>"
            "<thead><tr><th>group</th><th>rank</th><th>state</th><th>last committed step</th>"
            "<th>heartbeat age</th><th>detail</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


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
            f"attempted{pct}<br>global step {gstep}</div>")


# ---- recoveries and event list ----------------------------------------------------------

PHASE_COLOURS = {"detect": "#d32f2f", "teardown": "#8d6e63", "acquire": "#f9a825", "build": "#ef6c00",
                 "heal": "#1565c0", "rejoin": "#2e7d32"}
# What the event itself measured, shown under a phase when it differs from the gap.
PHASE_NOTES = {"teardown": "stop", "acquire": "spawn", "heal": "transfer"}


def recoveries_html(recoveries: list[Recovery], t0: float | None, *, bars: bool = True,
                    last: int | None = None, dropped: int = 0) -> str:
    """One row per failure and its recovery; with ``last`` only the last ``last`` rows and
    every recovery still in progress (a run of many groups fails often: the live table, and
    the cost of drawing it, stay bounded; the static copy lists all the model holds).
    ``dropped``: earlier recoveries the model no longer holds (a long run's bounded window)."""
    total = len(recoveries) + dropped
    if not total:
        return "<div class='mnb-recoveries' data-count='0'><i>no failures so far</i></div>"
    first = 0 if last is None else max(0, len(recoveries) - last)
    shown = [(i + dropped, r) for i, r in enumerate(recoveries) if i >= first or not r.finished]
    rows = []
    if len(shown) < total:
        where = ("<code>run.history().recoveries()</code> reads all from the event log" if dropped else
                 "the static copy, <code>show_static()</code>, lists all")
        rows.append(f"<tr class='mnb-recoveries-earlier'><td colspan='{len(PHASES) + 6 + bool(bars)}' "
                    f"style='color:#666'>{total - len(shown)} earlier recoveries not shown "
                    f"({where} {total})</td></tr>")
    longest = max(((r.total_s or sum(p.duration_s or 0.0 for p in r.phases())) for _, r in shown), default=0.0) or 1.0
    for i, r in shown:
        phases = r.phases()
        cells = "".join(
            f"<td class='mnb-phase' data-phase='{p.name}' data-seconds='{'' if p.duration_s is None else f'{p.duration_s:.3f}'}'>"
            f"{_secs(p.duration_s)}<br><span style='font-size:10px;color:#666'>{_clock(p.t, t0)}"
            + (f" &middot; {PHASE_NOTES[p.name]} {_secs(p.reported_s)}"
               if p.reported_s is not None and p.name in PHASE_NOTES else "")
            + "</span></td>"
            for p in phases)
        bar = ""
        if bars:
            segs = "".join(
                f"<span title='{p.name} {_secs(p.duration_s)}' style='display:inline-block;height:10px;"
                f"width:{max(1.0, 160.0 * (p.duration_s or 0.0) / longest):.0f}px;background:{PHASE_COLOURS[p.name]}'></span>"
                for p in phases if p.duration_s is not None)
            bar = f"<td style='white-space:nowrap'>{segs}</td>"
        fault = r.fault or "unplanned"
        heal = ""
        if r.heal_bytes is not None:
            src = f" from {', '.join(str(d) for d in r.heal_sources)}" if r.heal_sources else ""
            rate = f" at {r.heal_gbps:.2f} GB/s" if r.heal_gbps else ""
            bad = f", {r.heal_corrupt} corrupt refetched" if r.heal_corrupt else ""
            heal = f"{fmt_bytes(r.heal_bytes)}{src}{rate}{bad}"
        rows.append(
            f"<tr class='mnb-recovery' data-index='{i}' data-replica='{r.replica}' data-status='{_e(r.status)}'>"
            f"<td>{r.replica}</td><td>{_e(fault)}</td><td>{_clock(r.start_t, t0)}</td>{cells}"
            f"<td><b>{_secs(r.total_s)}</b></td><td>{_e(r.status)}</td><td>{_e(heal)}</td>{bar}</tr>")
        if r.stack:  # a hang: where the stuck rank was when it was detected
            rows.append(f"<tr class='mnb-recovery-stack' data-index='{i}'><td colspan='{len(phases) + 6 + bool(bars)}'>"
                        f"<details><summary style='font-size:11px'>stack of group {r.replica} rank {r.rank} when the "
                        f"hang was detected</summary><pre style='font-size:10px;max-height:240px;overflow:auto;"
                        f"margin:0'>{_e(r.stack)}</pre></details></td></tr>")
    bar_head = "<th>timeline</th>" if bars else ""
    phase_heads = "".join(f"<th>{name}</th>" for name in PHASES)
    return ("<div class='mnb-recoveries' data-count='%d' data-shown='%d'><table border='1' style='border-collapse:"
            "collapse;font-family:sans-serif;font-size:12px'><thead><tr><th>group</th><th>fault</th><th>at</th>"
            "%s<th>total</th><th>status</th><th>state copied</th>%s</tr></thead><tbody>%s</tbody></table></div>"
            % (total, len(shown), phase_heads, bar_head, "".join(rows)))


def logs_html(lines: list[Any], log_dir: Any, *, scroll: bool = True) -> str:
    """The workers' recent log lines, folded (``worker_logs.aggregate``); where the files are."""
    items = "".join(f"<div class='mnb-log-line' data-count='{line.count}' data-sources='{len(line.where)}'>"
                    f"{_e(line.render())}</div>" for line in lines)
    box = "max-height:180px;overflow:auto;" if scroll else ""
    where = f"<div style='font-size:11px;color:#666'>full text: {_e(log_dir)}</div>" if log_dir else ""
    return (f"<div class='mnb-logs' data-lines='{len(lines)}' style='font-family:monospace;font-size:11px;"
            f"white-space:pre-wrap;{box}'>{items or '<i>no worker output yet</i>'}</div>{where}")


def events_html(lines: Iterable[LogLine], t0: float | None, *, scroll: bool = True) -> str:
    items = "".join(f"<li class='mnb-event' data-kind='{_e(line.kind)}'><code>{_clock(line.t, t0)}</code> "
                    f"{_e(line.text)}</li>" for line in lines)
    box = "max-height:160px;overflow:auto" if scroll else ""
    return (f"<ul class='mnb-events' style='font-family:sans-serif;font-size:12px;margin:2px 0;"
            f"padding-left:18px;{box}'>{items or '<li><i>no events</i></li>'}</ul>")


def timeline_html(model: DashboardModel, last_events: int = 12, last_recoveries: int = 10) -> str:
    t0 = model.started_t
    return (recoveries_html(model.recoveries, t0, last=last_recoveries, dropped=model.tracker.dropped)
            + "<div style='font-size:12px;margin-top:4px'><b>events</b></div>"
            + events_html(sorted(model.event_log(last_events), key=lambda line: line.t, reverse=True), t0))


# ---- loss plot --------------------------------------------------------------------------


def _flat_xy(groups: list[list[tuple[float, float]]], *, gap: bool) -> Any:
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
                    "heal": dict(marker="^", color="#1565c0", s=80, label="healed")}

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
        self._lines: dict[int, Any] = {}
        self._dropped: dict[int, Any] = {}
        (self._global,) = ax.plot([], [], lw=1.6, ls="--", color=GLOBAL_COLOUR, alpha=0.8,
                                  label="committed (global)", zorder=4)
        self._marks = {k: ax.scatter([], [], zorder=5, edgecolors="white", linewidths=0.8, **st)
                       for k, st in self.MARKER_STYLE.items()}
        self._vlines = {k: LineCollection([], colors=st["color"], linewidths=0.7, alpha=0.6,
                                          linestyles="--" if k == "heal" else ":",
                                          transform=ax.get_xaxis_transform())
                        for k, st in self.MARKER_STYLE.items()}
        for lc in self._vlines.values():
            ax.add_collection(lc, autolim=False)
        # Many groups: all lines as one artist (a NaN between groups), all dropped steps as one.
        (self._many,) = ax.plot([], [], lw=0.8, color=MANY_COLOUR, alpha=0.8, label="each group")
        self._many_dropped = ax.scatter([], [], s=10, facecolors="none", edgecolors=MANY_COLOUR, linewidths=0.7)
        self._legend_key: tuple = ()

    def _replica_artists(self, replica: int) -> tuple[Any, Any]:
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
        self._update_markers(data)
        kinds = {m.kind for m in data.markers}
        groups = (f"{len(series)} groups",) if many else tuple(sorted(series))
        shown = groups + tuple(k for k in self.MARKER_STYLE if k in kinds)
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
                handles = lines + [self._global] + [self._marks[k] for k in self.MARKER_STYLE if k in shown]
                ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=2, framealpha=0.8)
        ax.relim()
        ax.autoscale_view()
        self.heading.set_text(f"loss: {data.point_count} points, global step "
                              f"{'-' if data.global_step is None else data.global_step}")
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
              "heal": ("&#x25b2;", "healed")}
    for kind, (glyph, label) in glyphs.items():
        if kind in kinds:
            colour = LossPlot.MARKER_STYLE[kind]["color"]
            items.append(f"<span style='color:{colour}'>{glyph} {label}</span>")
    return (f"<span class='mnb-plot-caption' data-points='{data.point_count}' data-markers='{len(data.markers)}' "
            f"style='font-size:11px;color:#555'>{' &nbsp; '.join(items)} &nbsp; "
            f"({data.point_count} points, {len(data.markers)} markers)</span>")


def png_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


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


__all__ = ["LossPlot", "run_status", "header_html", "health_html", "health_table_html", "quorum_html",
           "recoveries_html", "events_html", "timeline_html", "static_html", "png_data_url", "style_of"]
