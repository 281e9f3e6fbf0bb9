"""Worker failures shown in the notebook, in the cell where a person will see them.

A failure reported while a cell runs is shown in that cell. One reported while no cell runs is
held and shown at the top of the next cell's output: a frontend drops output addressed to a
cell that has already finished. Sessions are watched as they appear (the magics' session, or
one a cell creates itself). At most ``HELD`` notices are held between cells (a run left alone
overnight fails many times): the next cell shows the last ``HELD`` and one line counting the rest.

A training run started by the magics is watched too, for what a person would otherwise only
find in its event log: a scheduled wave that could not fire (one notice per streak of skipped
waves, ``fault_skipped``) and the run finishing (``run_finished``: where its final state is).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from IPython.display import display

from ..telemetry.events import Event, FaultInjected, FaultSkipped, RunFinished, WorkerFailed
from .html import esc, failure_html

if TYPE_CHECKING:
    from ..ft import FTRun
    from ..session import Session

HELD = 20  # notices kept for the next cell; older ones are counted, not kept


class FailureNotices:
    """One notice per failed rank (``WorkerFailed``); Monarch's late accounts of processes
    already torn down (``WorkerExitReported``: our own kills and stops) are never shown."""

    def __init__(self, show: Callable[[Any], None] | None = None) -> None:
        self._show = show or show_event
        self._lock = threading.Lock()
        self._running = False
        self._pending: list[Any] = []
        self._held_over = 0  # failures between cells beyond HELD (counted only)
        self._watched: set[int] = set()
        self._unsubscribe: list[Any] = []

    def watch(self, session: Session) -> None:
        with self._lock:
            if id(session) in self._watched:
                return
            self._watched.add(id(session))
        self._unsubscribe.append(session.on_failure(self.notify))

    def watch_run(self, run: FTRun) -> None:
        """Notices from a training run's own events (see the module docstring)."""
        skipping = [False]  # a skipped wave was shown since the last fault went in

        def observe(event: Event) -> None:
            if isinstance(event, FaultInjected):
                skipping[0] = False
            elif isinstance(event, FaultSkipped) and not skipping[0]:
                skipping[0] = True
                self.notify(event)
            elif isinstance(event, RunFinished):
                self.notify(event)

        self._unsubscribe.append(run.events.subscribe(observe))

    def notify(self, event: Any) -> None:
        if isinstance(event, WorkerFailed) and event.late:
            return
        if not isinstance(event, (WorkerFailed, FaultSkipped, RunFinished)):
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


def notice_text(event: FaultSkipped | RunFinished) -> str:
    if isinstance(event, FaultSkipped):
        return f"monarch: {event.reason} (later waves that cannot fire are recorded as fault_skipped events)"
    if event.checkpoint:
        return (f"monarch: the run finished at step {event.step}; its final state is the checkpoint {event.checkpoint}, "
                "and its workers and Lighthouse were released (continue it: %monarch train --resume RUN_DIR --steps N)")
    return (f"monarch: the run reached step {event.step} but no group could save its final state ({event.error}); "
            "the groups stay up: %monarch stop ends them")


def show_event(event: Any) -> None:
    """A failed rank as a failure notice; a skipped wave or a finished run as one line."""
    if isinstance(event, WorkerFailed):
        show_failure(event)
        return
    text = notice_text(event)
    display({"text/plain": text, "text/html": f"<div class='mnb-notice'>{esc(text)}</div>"}, raw=True)


def show_failure(event: WorkerFailed) -> None:
    display({"text/plain": failure_text(event),
             "text/html": failure_html(event.mesh, event.rank, event.reason, event.action)}, raw=True)


def show_more(count: int) -> None:
    text = (f"monarch: {count} earlier failures while no cell ran are not shown one by one; "
            f"`%monarch status` and run.history().recoveries() list them")
    display({"text/plain": text, "text/html": f"<div class='mnb-failures-more'>{esc(text)}</div>"}, raw=True)


# The notices of this kernel (set while the extension is loaded).
current: FailureNotices | None = None


def watch_run(run: FTRun) -> None:
    """Route a training run's notices (skipped waves, its finish) to the notebook."""
    if current is not None:
        current.watch_run(run)


def watch_session(session: Session) -> None:
    """Route a session's failures to notebook notices (also for a session made mid-cell)."""
    if current is not None:
        current.watch(session)
