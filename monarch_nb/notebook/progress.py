"""A progress line for anything the notebook blocks on for more than a moment.

A ``%%monarch`` cell, ``%monarch train`` bringing groups up, ``%monarch wait``: after
``SHOW_AFTER_S`` with no answer a line appears in the cell and says what is awaited (ranks
done of total and the ones still out; groups built; steps committed), refreshed from a
background thread until the wait ends. Quick calls show nothing. Outside IPython it does
nothing.
"""

from __future__ import annotations

import html
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import format_ranks

SHOW_AFTER_S = 2.0
REFRESH_S = 0.5


@dataclass(frozen=True)
class Line:
    """What a wait has to show: ``done`` of ``total`` and a few words on what is still out."""

    done: int
    total: int
    text: str


def _render(line: Line, seconds: float, ended: str = "") -> dict[str, str]:
    width = 20
    filled = round(width * line.done / line.total) if line.total else 0
    state = ended or f"{seconds:.0f} s"
    plain = f"[{'#' * filled}{'.' * (width - filled)}] {line.done}/{line.total} {line.text} ({state})"
    body = (f'<div class="monarch-progress" style="font-family:monospace">'
            f'<progress value="{line.done}" max="{max(line.total, 1)}" style="width:12em"></progress> '
            f"{line.done}/{line.total} {html.escape(line.text)} <span style='color:#888'>({html.escape(state)})</span>"
            "</div>")
    return {"text/plain": plain, "text/html": body}


class Progress:
    """``with Progress(describe):`` around a blocking call; ``describe()`` is read every
    ``REFRESH_S`` from another thread, so it must only read."""

    def __init__(self, describe: Callable[[], Line], show_after: float = SHOW_AFTER_S) -> None:
        self._describe, self._show_after = describe, show_after
        self._stop = threading.Event()
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self.shown = False

    def __enter__(self) -> "Progress":
        try:
            from IPython import get_ipython
        except ImportError:
            return self
        if get_ipython() is None:
            return self
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="monarch_nb-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        if self._stop.wait(self._show_after):
            return
        from IPython.display import display

        self._handle = display(self._data(), raw=True, display_id=True)
        self.shown = True
        while not self._stop.wait(REFRESH_S):
            self._handle.update(self._data(), raw=True)

    def _data(self, ended: str = "") -> dict[str, str]:
        try:
            line = self._describe()
        except Exception as exc:  # a view must never break the wait it describes
            line = Line(0, 0, f"(progress unavailable: {exc})")
        return _render(line, time.monotonic() - self._started, ended)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._handle is not None:
            took = time.monotonic() - self._started
            ended = f"interrupted after {took:.1f} s" if exc_type is not None and issubclass(
                exc_type, KeyboardInterrupt) else f"{'failed' if exc_type else 'done'} in {took:.1f} s"
            self._handle.update(self._data(ended), raw=True)


def call_line(watch: Any, what: str = "ranks") -> Line:
    """A ``CallWatch`` as a line: ranks done of total, and the ones still out (the slowest)."""
    pending = sorted(watch.pending)
    text = f"{what} done; waiting on {format_ranks(pending)}" if pending else f"{what} done"
    return Line(len(watch.answered), watch.total, text)
