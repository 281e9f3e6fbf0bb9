"""The health grid's HTML: one cell per process (replica group x rank), or a tile per process
with the groups that are not training listed in words once there are many.

Rendered from ``HealthCell``s (plain data, see ``dashboard_groups``); state is shown by colour,
glyph *and* word, with ``mnb-*`` classes and ``data-*`` attributes for tests and users' CSS. The
live widget and the static fallback's plain table (``health_table_html``) both live here.
"""

from __future__ import annotations

from ..ft.control.groups import GROUP_STATES
from .dashboard_format import esc
from .dashboard_groups import HealthCell
from .palette import STATE_STYLES, StateStyle, style_of

SPARE_STATES = ("building", "ready")  # a warm spare waiting outside the quorum (monarch_nb.ft.control.spares)


def _cell_html(c: HealthCell) -> str:
    st = c.style
    step = "-" if c.last_committed_step is None else str(c.last_committed_step)
    age = "-" if c.heartbeat_age_s is None else f"{c.heartbeat_age_s:.0f} s ago" if c.heartbeat_age_s >= 10 \
        else f"{c.heartbeat_age_s:.1f} s ago"
    detail = f"<div class='mnb-cell-detail' style='font-size:11px;opacity:.9'>{esc(c.detail)}</div>" if c.detail else ""
    inner = f"<div class='mnb-cell-inner' style='font-size:11px'>{esc(c.inner)}</div>" if c.inner else ""
    return (f"<div class='mnb-cell mnb-state-{esc(c.state)}' data-replica='{c.replica}' data-rank='{c.rank}' "
            f"data-state='{esc(c.state)}' data-step='{step}' title='{esc(c.text)}' role='status' "
            f"aria-label='{esc(c.text)}' style='background:{st.background};color:{st.foreground};"
            f"border-radius:4px;padding:2px 6px;min-width:112px;font-family:sans-serif;font-size:12px;line-height:1.35'>"
            f"<div class='mnb-cell-id' style='font-size:11px'>group {c.replica} &middot; rank {c.rank}</div>"
            f"<div class='mnb-cell-state' style='font-weight:bold'>{esc(st.glyph)} {esc(st.label)}</div>"
            f"<div class='mnb-cell-step'>step {step} &middot; <span class='mnb-cell-age'>{esc(age)}</span></div>"
            f"{inner}{detail}</div>")


def legend_html() -> str:
    """The states a group (or a warm spare) can be in; process and call states are not shown here."""
    items = []
    for state in (*GROUP_STATES, *SPARE_STATES):
        st = style_of(state)
        items.append(f"<span style='background:{st.background};color:{st.foreground};padding:0 4px;"
                     f"border-radius:3px;margin-right:4px;white-space:nowrap'>{esc(st.glyph)} {esc(st.label)}</span>")
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
        items.append(f"<span class='mnb-spare' data-spare='{index}' data-state='{esc(state)}' title='{esc(detail)}' "
                     f"style='background:{st.background};color:{st.foreground};padding:0 5px;border-radius:3px;"
                     f"margin-right:4px;white-space:nowrap'>{esc(st.glyph)} spare {index} {esc(st.label)}</span>")
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
    text = esc(c.text)
    return (f"<div class='mnb-cell mnb-state-{esc(c.state)}' data-replica='{c.replica}' data-rank='{c.rank}' "
            f"data-state='{esc(c.state)}' data-step='{step}' title='{text}' role='status' aria-label='{text}' "
            f"style='background:{st.background};color:{st.foreground};border-radius:3px;padding:1px 3px;"
            f"min-width:38px;text-align:center;white-space:nowrap;font-family:sans-serif;font-size:12px;"
            f"line-height:1.5'>{esc(st.glyph)} {name}</div>")


def _badge(st: StateStyle, text: str) -> str:
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
    line = " ".join(_badge(style_of(s), f"{esc(style_of(s).glyph)} {counts[s]} {esc(style_of(s).label)}")
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
        items.append(f"<div class='mnb-down' data-replica='{replica}' data-state='{esc(c.state)}'>"
                     f"{_badge(st, f'{esc(st.glyph)} {esc(st.label)}')} group {replica} &middot; step {step}"
                     + "".join(f" &middot; {esc(d)}" for d in details) + "</div>")
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


def health_table_html(cells: list[HealthCell]) -> str:
    """Health as a plain table (static fallback: readable in any HTML viewer, no CSS grid)."""
    rows = []
    for c in cells:
        st = c.style
        step = "-" if c.last_committed_step is None else str(c.last_committed_step)
        age = "-" if c.heartbeat_age_s is None else f"{c.heartbeat_age_s:.1f} s"
        rows.append(f"<tr class='mnb-row' data-replica='{c.replica}' data-rank='{c.rank}' data-state='{esc(c.state)}'>"
                    f"<td>{c.replica}</td><td>{c.rank}</td>"
                    f"<td style='background:{st.background};color:{st.foreground};font-weight:bold'>"
                    f"{esc(st.glyph)} {esc(st.label)}</td><td>{step}</td><td>{age}</td><td>{esc(c.detail)}</td></tr>")
    return ("<table class='mnb-health-table' border='1' style='border-collapse:collapse;font-size:12px'>"
            "<thead><tr><th>group</th><th>rank</th><th>state</th><th>last committed step</th>"
            "<th>heartbeat age</th><th>detail</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
