"""The timeline panel's HTML: the recoveries table (one row per failure, its phases and a bar),
the events list, and the workers' folded log lines.

A run of many groups fails often, so the live table shows only the newest recoveries and every
one still in progress (its cost to draw stays bounded); the static copy lists all the model holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .. import worker_logs
from ..ft.record.recovery import PHASES, Recovery
from .dashboard_format import clock, esc, fmt_bytes, secs
from .dashboard_model import DashboardModel
from .dashboard_timeline import LogLine

PHASE_COLOURS = {"detect": "#d32f2f", "repair": "#ff8f00", "teardown": "#8d6e63", "acquire": "#f9a825",
                 "build": "#ef6c00", "heal": "#1565c0", "rejoin": "#2e7d32"}
# A recovery is coloured by the ladder's rung that brought it back (ft/control/ladder.py RUNGS):
# the lower the rung, the cheaper the recovery.
RUNG_COLOURS = {"communicator": "#2e7d32", "step": "#558b2f", "process": "#ef6c00", "hosts": "#c62828",
                "checkpoint": "#6a1b9a"}
# What the event itself measured, shown under a phase when it differs from the gap.
PHASE_NOTES = {"detect": "noticed after", "teardown": "stop", "acquire": "spawn", "heal": "transfer"}


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
        held = [(i + dropped, r) for i, r in enumerate(recoveries) if i < first and r.finished]
        where = ("<code>run.history().recoveries()</code> reads all from the event log" if dropped else
                 "the static copy, <code>show_static()</code>, lists all")
        earlier = "".join(f"<li data-earlier='{i}'>group {r.replica} &middot; {esc(r.fault or 'unplanned')} at "
                          f"{clock(r.start_t, t0)} &middot; {esc(' → '.join(r.rungs or []) or '-')} &middot; "
                          f"{secs(r.total_s)} &middot; {esc(r.status)}</li>" for i, r in held)
        rows.append(f"<tr class='mnb-recoveries-earlier'><td colspan='{len(PHASES) + 7 + bool(bars)}' "
                    f"style='color:#666'><details><summary>{total - len(shown)} earlier recoveries "
                    f"({where} {total})</summary><ul style='margin:2px 0;font-size:11px'>{earlier}</ul>"
                    f"</details></td></tr>")
    longest = max(((r.total_s or sum(p.duration_s or 0.0 for p in r.phases())) for _, r in shown), default=0.0) or 1.0
    for i, r in shown:
        phases = r.phases()
        had = {p.name: p for p in phases}  # a phase this recovery did not have is an empty cell
        cells = "".join(
            f"<td class='mnb-phase' data-phase='{p.name}' data-seconds='{'' if p.duration_s is None else f'{p.duration_s:.3f}'}'>"
            f"{secs(p.duration_s)}<br><span style='font-size:10px;color:#666'>{clock(p.t, t0)}"
            + (f" &middot; {PHASE_NOTES[p.name]} {secs(p.reported_s)}"
               if p.reported_s is not None and p.name in PHASE_NOTES
               and (p.name != "detect" or p.duration_s is None or p.reported_s - p.duration_s > 0.01) else "")
            + "</span></td>" if (p := had.get(name)) is not None else
            f"<td class='mnb-phase-none' data-phase='{name}' style='color:#bbb'>&ndash;</td>"
            for name in PHASES)
        bar = ""
        if bars:
            segs = "".join(
                f"<span title='{p.name} {secs(p.duration_s)}' style='display:inline-block;height:10px;"
                f"width:{max(1.0, 160.0 * (p.duration_s or 0.0) / longest):.0f}px;background:{PHASE_COLOURS[p.name]}'></span>"
                for p in phases if p.duration_s is not None)
            most = max((p for p in phases if p.duration_s is not None), key=lambda p: p.duration_s or 0.0,
                       default=None)  # what the bar's length is, in words: a long bar says where it went
            why = (f" <span class='mnb-bar-most' style='font-size:10px'>{esc(most.name)} {secs(most.duration_s)}</span>"
                   if most is not None else "")
            bar = f"<td style='white-space:nowrap'>{segs}{why}</td>"
        fault = r.fault or "unplanned"
        heal = ""
        if r.heal_bytes is not None:
            src = f" from {', '.join(str(d) for d in r.heal_sources)}" if r.heal_sources else ""
            rate = f" at {r.heal_gbps:.2f} GB/s" if r.heal_gbps else ""
            bad = f", {r.heal_corrupt} corrupt refetched" if r.heal_corrupt else ""
            heal = f"{fmt_bytes(r.heal_bytes)}{src}{rate}{bad}"
        rung = r.rung or ""
        rung_cell = (f"<td class='mnb-rung' title='{esc(' | '.join(r.escalations or []))}' style='background:"
                     f"{RUNG_COLOURS.get(rung, '#e0e0e0')};color:{'#fff' if rung in RUNG_COLOURS else '#000'}'>"
                     f"{esc(' → '.join(r.rungs or []) or '-')}</td>")
        rows.append(
            f"<tr class='mnb-recovery' data-index='{i}' data-replica='{r.replica}' data-status='{esc(r.status)}' "
            f"data-rung='{esc(rung)}'>"
            f"<td>{r.replica}</td><td>{esc(fault)}</td><td>{clock(r.start_t, t0)}</td>{rung_cell}{cells}"
            f"<td><b>{secs(r.total_s)}</b></td><td>{esc(r.status)}</td><td>{esc(heal)}</td>{bar}</tr>")
        if r.stack:  # a hang: where the stuck rank was when it was detected
            rows.append(f"<tr class='mnb-recovery-stack' data-index='{i}'><td colspan='{len(PHASES) + 7 + bool(bars)}'>"
                        f"<details><summary style='font-size:11px'>stack of group {r.replica} rank {r.rank} when the "
                        f"hang was detected</summary><pre style='font-size:10px;max-height:240px;overflow:auto;"
                        f"margin:0'>{esc(r.stack)}</pre></details></td></tr>")
    bar_head = "<th>timeline</th>" if bars else ""
    phase_heads = "".join(f"<th>{name}</th>" for name in PHASES)
    return ("<div class='mnb-recoveries' data-count='%d' data-shown='%d'><table border='1' style='border-collapse:"
            "collapse;font-family:sans-serif;font-size:12px'><thead><tr><th>group</th><th>fault</th><th>at</th><th>rung</th>"
            "%s<th>total</th><th>status</th><th>state copied</th>%s</tr></thead><tbody>%s</tbody></table></div>"
            % (total, len(shown), phase_heads, bar_head, "".join(rows)))


def logs_html(lines: list[worker_logs.LogLine], log_dir: str | Path | None, *, scroll: bool = True) -> str:
    """The workers' recent log lines, folded (``worker_logs.aggregate``); where the files are."""
    items = "".join(f"<div class='mnb-log-line' data-count='{line.count}' data-sources='{len(line.where)}'>"
                    f"{esc(line.render())}</div>" for line in lines)
    box = "max-height:180px;overflow:auto;" if scroll else ""
    where = f"<div style='font-size:11px;color:#666'>full text: {esc(log_dir)}</div>" if log_dir else ""
    return (f"<div class='mnb-logs' data-lines='{len(lines)}' style='font-family:monospace;font-size:11px;"
            f"white-space:pre-wrap;{box}'>{items or '<i>no worker output yet</i>'}</div>{where}")


def events_html(lines: Iterable[LogLine], t0: float | None, *, scroll: bool = True) -> str:
    items = "".join(f"<li class='mnb-event' data-kind='{esc(line.kind)}'><code>{clock(line.t, t0)}</code> "
                    f"{esc(line.text)}</li>" for line in lines)
    box = "max-height:160px;overflow:auto" if scroll else ""
    return (f"<ul class='mnb-events' style='font-family:sans-serif;font-size:12px;margin:2px 0;"
            f"padding-left:18px;{box}'>{items or '<li><i>no events</i></li>'}</ul>")


def timeline_html(model: DashboardModel, last_events: int = 12, last_recoveries: int = 10) -> str:
    t0 = model.started_t
    return (recoveries_html(model.recoveries, t0, last=last_recoveries, dropped=model.tracker.dropped)
            + "<div style='font-size:12px;margin-top:4px'><b>events</b></div>"
            + events_html(sorted(model.event_log(last_events), key=lambda line: line.t, reverse=True), t0))
