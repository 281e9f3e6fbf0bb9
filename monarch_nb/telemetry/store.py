"""The telemetry store: in-memory event list plus an append-only JSONL file on disk.

Events are appended to ``events.jsonl`` and flushed as they arrive, so a crashed or
restarted kernel loses nothing that was recorded; ``EventStore.open`` rebuilds the same
in-memory history from the file alone. Observers (widgets, the CLI) subscribe and are
called on the writer's thread: they must be quick and must not raise (errors are counted,
not propagated, so a broken widget can never stop training telemetry).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

from .events import Event, event_from_dict

Observer = Callable[[Event], None]


class EventStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._events: list[Event] = []
        self._observers: list[Observer] = []
        self._lock = threading.RLock()
        self._file = None
        self.observer_errors = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    @classmethod
    def open(cls, path: str | Path, *, follow: bool = False) -> "EventStore":
        """Load a run's events; with ``follow`` new events are appended to the same file."""
        path = Path(path)
        if path.is_dir():
            path = path / "events.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"no event log at {path} (expected a run directory or events.jsonl)")
        store = cls(path if follow else None)
        store.path = path
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    store._events.append(event_from_dict(json.loads(line)))
                except json.JSONDecodeError:
                    # A kernel killed mid-write can leave one torn last line; skip it.
                    continue
        return store

    def append(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            if self._file is not None:
                self._file.write(json.dumps(event.to_dict(), default=str) + "\n")
                self._file.flush()
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(event)
            except Exception:
                self.observer_errors += 1

    def subscribe(self, observer: Observer, *, replay: bool = False) -> Callable[[], None]:
        """Call ``observer`` for every new event; returns a function that unsubscribes."""
        with self._lock:
            past = list(self._events) if replay else []
            self._observers.append(observer)
        for event in past:
            observer(event)

        def unsubscribe() -> None:
            with self._lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return unsubscribe

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 60.0, *, since: float = 0.0) -> Event:
        """Block until an event satisfying ``predicate`` (recorded at or after ``since``) exists;
        the events already recorded count. Raises ``TimeoutError`` after ``timeout`` seconds."""
        found = threading.Event()
        box: list[Event] = []

        def observer(e: Event) -> None:
            if not found.is_set() and e.t >= since and predicate(e):
                box.append(e)
                found.set()

        unsubscribe = self.subscribe(observer, replay=True)
        try:
            if not found.wait(timeout):
                raise TimeoutError(f"no matching event within {timeout:g} s")
        finally:
            unsubscribe()
        return box[0]

    def events(self, kind: str | type[Event] | None = None) -> list[Event]:
        with self._lock:
            items = list(self._events)
        if kind is None:
            return items
        name = kind if isinstance(kind, str) else kind.kind
        return [e for e in items if e.kind == name]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def sync(self) -> None:
        """Force the log to stable storage (called at run end; per-event fsync is too slow)."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self.sync()
                self._file.close()
                self._file = None
