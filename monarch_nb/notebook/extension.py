"""IPython extension: registers the magics, HTML views, and failure notices.

Loaded by the Monarch kernelspec at start (``--IPKernelApp.extensions=monarch_nb``) or by
``%load_ext monarch_nb`` in any IPython kernel. A worker failure is shown as a notice in
the running cell; one that happens while no cell runs is shown at the top of the next
cell's output (a frontend drops output addressed to a cell that already finished).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from IPython.display import display

from .html import actor_mesh_html, failure_html, proc_mesh_html, value_mesh_html
from .magics import MonarchMagics


class FailureNotices:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = False
        self._pending: list[Any] = []
        self._watched: set[int] = set()
        self._unsubscribe: list[Any] = []

    def watch(self, session: Any) -> None:
        if id(session) not in self._watched:
            self._watched.add(id(session))
            self._unsubscribe.append(session.on_failure(self.notify))

    def notify(self, event: Any) -> None:
        with self._lock:
            if not self._running:
                self._pending.append(event)
                return
        _show(event)

    def _watch_current(self) -> None:
        from ..session import current_session

        session = current_session(create=False)
        if session is not None:
            self.watch(session)

    def pre_run_cell(self, *_: Any) -> None:
        self._watch_current()
        with self._lock:
            self._running = True
            pending, self._pending = self._pending, []
        for event in pending:
            _show(event)

    def post_run_cell(self, *_: Any) -> None:
        self._watch_current()
        with self._lock:
            self._running = False


def watch_session(session: Any) -> None:
    """Route a session's failures to notebook notices (also for a session made mid-cell)."""
    if _notices is not None:
        _notices.watch(session)


def _show(event: Any) -> None:
    text = f"monarch: mesh {event.mesh!r} rank {event.rank} failed: {event.reason}"
    display({"text/plain": text, "text/html": failure_html(event.mesh, event.rank, event.reason)}, raw=True)


_notices: FailureNotices | None = None
_BLOCKING_GET = "Future.get() called from within an active event loop"


class _DropBlockingGetNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _BLOCKING_GET


def quiet_blocking_get() -> None:
    """Silence Monarch's "blocking get() inside an event loop" notices in the kernel.

    A notebook cell is synchronous code run from ipykernel's asyncio loop, so every
    ``.get()`` typed in a cell trips them. Monarch futures resolve on Monarch's own Tokio
    runtime, never on the kernel's loop, so blocking a cell on them cannot deadlock; the
    notices would only bury the cell's real output.
    """
    warnings.filterwarnings("ignore", message=r"(Blocking get\(\)|Future\.get\(\)) (was called|called)", category=UserWarning)
    logging.getLogger("monarch._src.actor.telemetry").addFilter(_DropBlockingGetNotice())


def load_ipython_extension(ipython: Any) -> None:
    global _notices
    quiet_blocking_get()
    ipython.register_magics(MonarchMagics(ipython))
    html = ipython.display_formatter.formatters["text/html"]
    html.for_type_by_name("monarch._src.actor.actor_mesh", "ValueMesh", value_mesh_html)
    html.for_type_by_name("monarch._src.actor.proc_mesh", "ProcMesh", proc_mesh_html)
    html.for_type_by_name("monarch._src.actor.actor_mesh", "ActorMesh", actor_mesh_html)
    if _notices is None:
        _notices = FailureNotices()
        ipython.events.register("pre_run_cell", _notices.pre_run_cell)
        ipython.events.register("post_run_cell", _notices.post_run_cell)


def unload_ipython_extension(ipython: Any) -> None:
    global _notices
    if _notices is not None:
        ipython.events.unregister("pre_run_cell", _notices.pre_run_cell)
        ipython.events.unregister("post_run_cell", _notices.post_run_cell)
        for unsubscribe in _notices._unsubscribe:
            unsubscribe()
        _notices = None
