"""HTML views of controller objects for the notebook: meshes, health, per-rank results.

Plain HTML strings (no JavaScript) so they render the same in JupyterLab, in a saved
notebook, and in a CI artifact. Health is shown by colour *and* by a word, for readers
who cannot tell the colours apart.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Iterable

from .. import seam
from .palette import style_of

if TYPE_CHECKING:
    from ..agent import CellOutput
    from ..calls import MeshResult
    from ..meshes import MeshHandle
    from ..session import Session

_FAILED = style_of("failed").background
_TABLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
_CELL = "border:1px solid #ccc;padding:2px 6px;text-align:left"


def esc(value: Any) -> str:
    return html.escape(str(value))


def badge(state: str) -> str:
    st = style_of(state)
    return (f'<span class="mnb-state mnb-{esc(state)}" style="color:{st.foreground};background:{st.background};'
            f'padding:0 6px;border-radius:3px">{esc(st.glyph)} {esc(state)}</span>')


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    head = "".join(f'<th style="{_CELL}">{esc(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}" style="{_TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def mesh_html(handle: "MeshHandle") -> str:
    dims = " × ".join(f"{k}={v}" for k, v in handle.shape.items())
    scheduled = any(p.job_id for p in handle.procs)  # SLURM: which job and node holds each process
    rows = [
        [esc(p.rank), esc(p.label), badge(p.state), esc(p.pid or "?"), esc(p.host or "?")]
        + ([esc(p.job_id or "-"), esc(p.node or "-")] if scheduled else []) + [esc(p.reason)]
        for p in handle.procs
    ]
    actors = ", ".join(esc(a) for a in handle.actors if not a.startswith("_nb_")) or "none"
    allocation = handle.allocation
    where = (f' &middot; {esc(allocation.kind)} job <b>{esc(allocation.job_id)}</b>'
             if allocation is not None and allocation.job_id else "")
    headers = ["rank", "coords", "health", "pid", "host"] + (["job", "node"] if scheduled else []) + ["reason"]
    return (f'<div class="mnb-mesh"><b>mesh {esc(handle.name)}</b> ({esc(dims)}) {badge(handle.state)}{where}'
            f' &middot; actors: {actors}' + table(headers, rows, "mnb-procs") + "</div>")


def session_html(session: "Session") -> str:
    handles = session.snapshot()
    if not handles:
        return '<div class="mnb-session">no meshes are up; start one with <code>%monarch up --procs 4</code></div>'
    return '<div class="mnb-session">' + "".join(mesh_html(h) for h in handles) + "</div>"


def mesh_result_html(result: "MeshResult") -> str:
    rows = []
    for rank in result.ranks:
        if rank in result.values:
            rows.append([esc(rank), badge("ok"), esc(_short(repr(result.values[rank])))])
        elif rank in result.errors:
            err = result.errors[rank]
            rows.append([esc(rank), badge("error"), esc(f"{type(err).__name__}: {err}")])
        else:
            rows.append([esc(rank), badge("missing"), "no answer before the deadline"])
    return (f'<div class="mnb-result"><b>{esc(result.endpoint)}</b> &middot; {len(result.values)}/{len(result.ranks)} '
            f'answered in {result.seconds * 1000:.1f} ms' + table(["rank", "outcome", "value"], rows) + "</div>")


def value_mesh_html(value_mesh: Any) -> str:
    rows = []
    for point, value in value_mesh.items():
        coords = ", ".join(f"{k}={point[k]}" for k in point.keys()) if hasattr(point, "keys") else str(point)
        rows.append([esc(point.rank if hasattr(point, "rank") else "?"), esc(coords), esc(_short(repr(value)))])
    dims = " × ".join(f"{k}={v}" for k, v in value_mesh.sizes.items()) if hasattr(value_mesh, "sizes") else ""
    return f'<div class="mnb-valuemesh"><b>ValueMesh</b> ({esc(dims)})' + table(["rank", "coords", "value"], rows) + "</div>"


def proc_mesh_html(proc_mesh: Any) -> str:
    from ..session import current_session

    session = current_session(create=False)
    if session is not None:
        for handle in session.snapshot():
            if handle.proc_mesh is proc_mesh:
                return mesh_html(handle)
    extent = proc_mesh.extent
    dims = " × ".join(f"{k}={v}" for k, v in zip(extent.labels, extent.sizes))
    return f'<div class="mnb-mesh"><b>ProcMesh</b> ({esc(dims)})</div>'


def actor_mesh_html(actor_mesh: Any) -> str:
    from ..session import current_session

    extent = actor_mesh.extent
    dims = " × ".join(f"{k}={v}" for k, v in zip(extent.labels, extent.sizes))
    name = seam.actor_mesh_name(actor_mesh)
    cls = getattr(seam.actor_mesh_class(actor_mesh), "__name__", "?")
    health = ""
    session = current_session(create=False)
    if session is not None:
        owner = session.owner_of(actor_mesh)
        if owner is not None:
            ranks = seam.actor_mesh_ranks(actor_mesh)
            failed = [r for r in ranks if r in owner.failed_ranks]
            health = " " + badge("degraded" if failed else "healthy") + (f" failed ranks {failed}" if failed else "")
            health += f" on mesh <b>{esc(owner.name)}</b>"
    return f'<div class="mnb-actormesh"><b>ActorMesh {esc(name)}</b> [{esc(cls)}] ({esc(dims)}){health}</div>'


def cell_outputs_html(outputs: "list[CellOutput]", missing: list[int], coords: dict[int, str]) -> str:
    parts = []
    for out in sorted(outputs, key=lambda o: o.rank):
        state = "error" if out.error else "ok"
        body = ""
        if out.stdout:
            body += f'<pre class="mnb-stdout" style="margin:0">{esc(out.stdout)}</pre>'
        if out.stderr:
            body += f'<pre class="mnb-stderr" style="margin:0;background:#fdd">{esc(out.stderr)}</pre>'
        if out.result is not None:
            body += f'<pre class="mnb-value" style="margin:0">Out: {esc(out.result)}</pre>'
        if out.error:
            body += f'<pre class="mnb-error" style="margin:0;color:{_FAILED}">{esc(out.traceback or out.error)}</pre>'
        parts.append(f'<div class="mnb-rank" data-rank="{out.rank}"><b>[rank {out.rank}]</b> '
                     f'<span style="color:#666">{esc(coords.get(out.rank, ""))}</span> {badge(state)}{body}</div>')
    for rank in missing:
        parts.append(f'<div class="mnb-rank" data-rank="{rank}"><b>[rank {rank}]</b> {badge("missing")} '
                     "no answer (failed or past the deadline)</div>")
    return '<div class="mnb-cell">' + "".join(parts) + "</div>"


def run_status_html(run_id: str, status: dict) -> str:
    """A fault-tolerant run's groups and warm spares: state, the recovery ladder's rung a
    recovering group is on, step, restarts, pids."""
    rows = []
    semi = any("inner" in st for st in status.values())  # LocalSGD / DiLoCo: steps since the groups met
    for key, st in status.items():
        who = f"group {key}" if isinstance(key, int) else str(key)
        inner = [esc(st.get("inner", "-"))] if semi else []
        state = badge(st["state"]) + (f" slow {esc(st['slow'])}x" if st.get("slow") else "")  # a named straggler
        rows.append([esc(who), state, esc(st.get("rung") or "-"), esc(st.get("step", "-")), *inner,
                     esc(st.get("attempts", "-")), esc(", ".join(str(p) for p in st.get("pids", [])) or "-")])
    heads = ["group", "state", "rung", "step", *(["inner loop"] if semi else []), "restarts", "pids"]
    return (f'<div class="mnb-run-status"><b>run {esc(run_id)}</b>' + table(heads, rows, "mnb-run-groups") + "</div>")


def failure_html(mesh: str, rank: int | None, reason: str, action: str | None = None) -> str:
    """A failure notice: the fault, then what the controller does (or what the user can do)."""
    then = (esc(action) if action else
            f'<code>%monarch replace {esc(mesh)}</code> starts a fresh mesh')
    return (f'<div class="mnb-failure" style="border-left:4px solid {_FAILED};padding:2px 8px">'
            f'{badge("failed")} mesh <b>{esc(mesh)}</b> rank <b>{esc(rank)}</b>: {esc(reason)} '
            f'&middot; {then} &middot; what the workers '
            f'wrote: <code>%monarch logs --mesh {esc(mesh)}</code></div>')


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def register_views(ipython: Any) -> None:
    """Make IPython draw controller objects and Monarch's meshes with the views above.

    Registered as display formatters, so the controller never imports this module."""
    from ..calls import MeshResult
    from ..meshes import MeshHandle
    from ..session import Session

    formatter = ipython.display_formatter.formatters["text/html"]
    formatter.for_type(Session, session_html)
    formatter.for_type(MeshHandle, mesh_html)
    formatter.for_type(MeshResult, mesh_result_html)
    views = {"ValueMesh": value_mesh_html, "ProcMesh": proc_mesh_html, "ActorMesh": actor_mesh_html}
    for name, view in views.items():
        module, cls = seam.DISPLAY_TYPES[name]
        formatter.for_type_by_name(module, cls, view)


MONARCH_VIEWS_HINT = ("Monarch's dashboard and admin TUI: not enabled for these meshes. They come with a Monarch "
                      "job: job.enable_telemetry(include_dashboard=True) and job.enable_admin() before "
                      "job.state(), then Session.up(host_mesh=job.state().hosts); open the TUI with "
                      "`monarch-tui --addr ADMIN_URL`.")


def views_html(lighthouse: str | None, views: dict[str, dict[str, str]], hint: bool = False) -> str:
    """Links to the ecosystem's own views: torchft's Lighthouse page, Monarch's dashboard/TUI."""
    parts = []
    if lighthouse:
        parts.append(f'torchft Lighthouse: <a class="mnb-lighthouse" href="{esc(lighthouse)}" target="_blank">'
                     f"{esc(lighthouse)}</a> (quorum, heartbeats)")
    for mesh, urls in views.items():
        links = " &middot; ".join(f'{esc(kind)}: <a href="{esc(url)}" target="_blank">{esc(url)}</a>'
                                  for kind, url in urls.items())
        parts.append(f"mesh {esc(mesh)}: Monarch {links}")
    if hint:  # meshes of a Monarch job whose views are not enabled
        parts.append(f'<span style="color:#666">{esc(MONARCH_VIEWS_HINT)}</span>')
    return '<div class="mnb-views" style="font-size:12px">' + "<br>".join(parts) + "</div>"
