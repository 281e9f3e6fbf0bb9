"""Worker failures shown in the notebook, in the cell where a person will see them.

A failure reported while a cell runs is shown in that cell. One reported while no cell runs is
held and shown at the top of the next cell's output: a frontend drops output addressed to a
cell that has already finished. Sessions are watched as they appear (the magics' session, or
one a cell creates itself). At most ``HELD`` notices are held between cells (a run left alone
overnight fails many times): the next cell shows the last ``HELD`` and one line counting the rest.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from IPython.display import display

from ..telemetry.events import WorkerFailed
from .html import esc, failure_html

HELD = 20  # notices kept for the next cell; older ones are counted, not kept


class FailureNotices:
    """One notice per failed rank (``WorkerFailed``); Monarch's late accounts of processes
    already torn down (``WorkerExitReported``: our own kills and stops) are never shown."""

    def __init__(self, show: Callable[[Any], None] | None = None) -> None:
        self._show = show or show_failure
        self._lock = threading.Lock()
        self._running = False
        self._pending: list[Any] = []
        self._held_over = 0  # failures between cells beyond HELD (counted only)
        self._watched: set[int] = set()
        self._unsubscribe: list[Any] = []

    def watch(self, session: Any) -> None:
        with self._lock:
            if id(session) in self._watched:
                return
            self._watched.add(id(session))
        self._unsubscribe.append(session.on_failure(self.notify))

    def notify(self, event: Any) -> None:
        if not isinstance(event, WorkerFailed) or event.late:
            return
        with self._lock:
            if not self._running:
                self._pending.append(event)
                if len(self._pending) > HELD:
                    self._pending.pop(0)
                    self._held_over += 1
                return
        self._show(event)

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
            over, self._held_over = self._held_over, 0
        if over:
            show_more(over)
        for event in pending:
            self._show(event)

    def post_run_cell(self, *_: Any) -> None:
        self._watch_current()
        with self._lock:
            self._running = False

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()


def failure_text(event: WorkerFailed) -> str:
    """The notice in words: the fault first, then what the controller does about it."""
    then = f"; {event.action}" if event.action else ""
    return (f"monarch: mesh {event.mesh!r} rank {event.rank} failed: {event.reason}{then} "
            f"(what the workers wrote: %monarch logs --mesh {event.mesh})")


def show_failure(event: WorkerFailed) -> None:
    display({"text/plain": failure_text(event),
             "text/html": failure_html(event.mesh, event.rank, event.reason, event.action)}, raw=True)


def show_more(count: int) -> None:
    text = (f"monarch: {count} earlier failures while no cell ran are not shown one by one; "
            f"`%monarch status` and run.history().recoveries() list them")
    display({"text/plain": text, "text/html": f"<div class='mnb-failures-more'>{esc(text)}</div>"}, raw=True)


# The notices of this kernel (set while the extension is loaded).
current: FailureNotices | None = None


def watch_session(session: Any) -> None:
    """Route a session's failures to notebook notices (also for a session made mid-cell)."""
    if current is not None:
        current.watch(session)
