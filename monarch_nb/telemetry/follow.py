"""A read-only view of an event log another process writes: a run whose controller is not this kernel.

``follow(path)`` loads the log like ``EventStore.open`` and then reads each line the writer
appends, as ``tail -f`` does: observers (the dashboard, waits) are called for every new event,
so a kernel attached to a detached run sees the same typed events, in the same order, as the
run's own controller. Only whole lines are read (a line being written is read once its newline
is there). Nothing is ever written to the file from here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .store import EventStore, parse_line

POLL_S = 0.025  # how soon an appended event is seen: a stat of the file each time, nothing more when idle


class FollowedStore(EventStore):
    """An :class:`EventStore` over a file another process appends to; :meth:`close` stops following."""

    def __init__(self, path: Path) -> None:
        super().__init__(None)
        self.path = path
        self.reopened = False
        self._offset = 0
        self._stop = threading.Event()
        self._read_new()
        self._window()
        self._thread = threading.Thread(target=self._run, name="monarch_nb-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._read_new()
            except OSError:
                continue  # the file is being replaced or is gone for a moment: try again

    def _read_new(self) -> None:
        """Every whole line appended since the last read becomes an event (observers called)."""
        size = os.path.getsize(self.path)
        if size <= self._offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its newline
        self._offset += end
        for raw in chunk[:end].splitlines():
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                event = parse_line(text)
            except ValueError:
                self.skipped_lines += 1
                continue
            self.append(event)

    def close(self) -> None:
        self._stop.set()


def follow(path: str | Path) -> FollowedStore:
    """Follow a run's ``events.jsonl`` (or its run directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "events.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no event log at {path}")
    return FollowedStore(path)
