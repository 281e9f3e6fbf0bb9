"""The telemetry store: in-memory event list plus an append-only JSONL file on disk.

Events are appended to ``events.jsonl`` and flushed as they arrive, so a crashed or
restarted kernel loses nothing that was recorded; ``EventStore.open`` rebuilds the same
in-memory history from the file alone. It reads any damaged log (binary bytes, torn or
mistyped lines): lines that are no event are skipped and counted, and a file that is no event
log at all is refused rather than shown as an empty run. Observers (widgets, the CLI) subscribe
and are called on the writer's thread: they must be quick and must not raise (errors are counted,
not propagated, so a broken widget can never stop training telemetry).

A store that writes a file keeps only its last ``MEMORY_EVENTS`` events in memory: a run of days
would otherwise hold every step it ever made in the kernel. Everything is in the file, and a
question about more than the window (``events()``, a replay) reads the file, so the answers are
the same; only their cost differs.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .decode import event_from_dict
from .events import Event

Observer = Callable[[Event], None]


# A line longer than this is no event (the largest, run_started, is a few KB): it is skipped
# without being held in memory, so opening a large binary file by mistake costs no RAM.
MAX_LINE_BYTES = 1 << 20
# How many skipped lines keep their number and reason (all are counted).
SKIPPED_KEPT = 20
# How many of the last events a timed-out ``wait_for`` shows.
WAIT_TAIL = 20
# Events a store with a file keeps in memory (about 0.5 KB each); older ones are read from the file.
MEMORY_EVENTS = 5000
# How far (seconds) event times from different processes may disagree: a replay since t is
# answered from memory only when the window reaches this much further back.
CLOCK_SKEW_S = 60.0
EVENT_LOG_FORMAT = ("expected JSON objects with 'kind' and 't', one per line, "
                    "as runs write to <run_dir>/events.jsonl")


class NotAnEventLog(ValueError):
    """``EventStore.open`` was given a file of which no line is an event."""


class EventStore:
    def __init__(self, path: str | Path | None = None, *, memory_events: int = MEMORY_EVENTS) -> None:
        self.path = Path(path) if path is not None else None
        self._memory_events = memory_events
        # Without a file, memory is the only copy: every event stays. With one, a window.
        self._events: collections.deque[Event] = collections.deque(maxlen=memory_events if path else None)
        self._evicted = 0  # events no longer in memory (all of them in the file)
        self._observers: list[Observer] = []
        self._lock = threading.RLock()
        self._file = None
        self.observer_errors = 0
        # Set by ``open``: True when loaded from disk without ``follow`` (nothing here will
        # append to it, so a run without ``run_stopped`` in it was interrupted).
        self.reopened = False
        # Lines of the file ``open`` could not read as events: how many, and (line number,
        # reason) of the first ``SKIPPED_KEPT``.
        self.skipped_lines = 0
        self.skipped: list[tuple[int, str]] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    @classmethod
    def open(cls, path: str | Path, *, follow: bool = False) -> "EventStore":
        """Load a run's events; with ``follow`` new events are appended to the same file.

        Lines that are no event (binary bytes, broken JSON, a torn last line, a known kind with
        missing or mistyped fields) are skipped and counted in ``skipped_lines`` / ``skipped``.
        Raises ``NotAnEventLog`` when the file has text but not a single event (or is a directory).
        """
        path = Path(path)
        if path.is_dir():
            path = path / "events.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"no event log at {path} (expected a run directory or events.jsonl)")
        if path.is_dir():
            raise NotAnEventLog(f"{path} is a directory, not an event log ({EVENT_LOG_FORMAT}); give a run "
                                "directory or its events.jsonl")
        store = cls(None)
        store.path = path
        store.reopened = not follow
        non_empty = store._load(path)
        if non_empty and not store._events:
            first = f"; line {store.skipped[0][0]}: {store.skipped[0][1]}" if store.skipped else ""
            raise NotAnEventLog(f"no line of {path} is a monarch_nb event ({EVENT_LOG_FORMAT}){first}")
        if follow:
            store._window()
            torn = _ends_mid_line(path)
            store._file = open(path, "a", encoding="utf-8")
            if torn:
                store._file.write("\n")  # never glue the next event onto a torn last line
                store._file.flush()
        return store

    def _window(self) -> None:
        """From now on keep only the last ``memory_events`` in memory (the file has them all)."""
        total = len(self._events)
        self._events = collections.deque(self._events, maxlen=self._memory_events)
        self._evicted = total - len(self._events)

    def _load(self, path: Path, upto: int | None = None) -> int:
        """Read ``path`` (its first ``upto`` bytes) line by line into ``_events``; returns how many
        lines were not blank."""
        non_empty = 0
        with open(path, "rb") as f:
            for line_no, raw in enumerate(_lines(f, upto), 1):
                if raw is None:
                    non_empty += 1
                    self._skip(line_no, f"longer than {MAX_LINE_BYTES} bytes")
                    continue
                text = raw.decode("utf-8", errors="replace").strip()
                if not text:
                    continue
                non_empty += 1
                try:
                    self._events.append(parse_line(text))
                except ValueError as exc:
                    torn = not raw.endswith(b"\n") and isinstance(exc, _BadJson)
                    # A kernel killed mid-write can leave one torn last line.
                    self._skip(line_no, "torn last line (the writer stopped mid-line)" if torn else str(exc))
        return non_empty

    def _skip(self, line_no: int, reason: str) -> None:
        self.skipped_lines += 1
        if len(self.skipped) < SKIPPED_KEPT:
            self.skipped.append((line_no, reason))

    def append(self, event: Event) -> None:
        with self._lock:
            if len(self._events) == self._events.maxlen:
                self._evicted += 1
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
        self._subscribe(observer, replay=replay)
        return self._unsubscriber(observer)

    def _subscribe(self, observer: Observer, *, replay: bool, since: float = 0.0) -> None:
        with self._lock:
            self._observers.append(observer)
            past = self._snapshot(since) if replay else []
        for event in past if isinstance(past, list) else self._read(past):
            observer(event)

    def _snapshot(self, since: float = 0.0) -> list[Event] | int:
        """Under the lock: the events recorded at or after ``since`` when memory holds them all,
        else how many bytes of the file hold every event so far (read them outside the lock)."""
        if not self._evicted or (since and self._events and self._events[0].t < since - CLOCK_SKEW_S):
            return list(self._events)
        assert self.path is not None
        if self._file is None:  # closed (the run stopped): the file holds every event
            return os.path.getsize(self.path)
        self._file.flush()
        return os.fstat(self._file.fileno()).st_size

    def _read(self, upto: int) -> list[Event]:
        """Every event in the first ``upto`` bytes of the file."""
        copy = EventStore(None)
        copy._load(self.path, upto)  # type: ignore[arg-type]
        return list(copy._events)

    def _unsubscriber(self, observer: Observer) -> Callable[[], None]:
        def unsubscribe() -> None:
            with self._lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return unsubscribe

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 60.0, *, since: float = 0.0,
                 what: str | None = None) -> Event:
        """Block until an event satisfying ``predicate`` (recorded at or after ``since``) exists;
        the events already recorded count. Raises ``TimeoutError`` after ``timeout`` seconds naming
        ``what`` it waited for (default: the predicate's source) and the last events, so a failed
        wait says what happened instead."""
        found = threading.Event()
        box: list[Event] = []

        def observer(e: Event) -> None:
            if not found.is_set() and e.t >= since and predicate(e):
                box.append(e)
                found.set()

        self._subscribe(observer, replay=True, since=since)
        unsubscribe = self._unsubscriber(observer)
        try:
            if not found.wait(timeout):
                after = f" (recorded since {_clock(since)})" if since else ""
                raise TimeoutError(f"no event within {timeout:g} s matching {what or _source(predicate)}{after}\n"
                                   f"{self.tail()}")
        finally:
            unsubscribe()
        return box[0]

    def tail(self, n: int = WAIT_TAIL) -> str:
        """The last ``n`` events, one short line each (what a failed wait shows)."""
        with self._lock:
            last = list(self._events)[-n:]
            total = len(self._events) + self._evicted
        lines = [_one_line(e) for e in last]
        return f"last {len(lines)} of {total} events:\n" + "\n".join(lines) if lines else "no events recorded"

    def events(self, kind: str | type[Event] | None = None) -> list[Event]:
        """Every event recorded (of ``kind``): from memory, or the file when memory has dropped some."""
        with self._lock:
            snap = self._snapshot()
        return _of_kind(snap if isinstance(snap, list) else self._read(snap), kind)

    def recent(self, kind: str | type[Event] | None = None) -> list[Event]:
        """The events (of ``kind``) still in memory: the newest ``memory_events``, never the file.
        For questions about the run's present (its last step, its recent saves)."""
        with self._lock:
            items = list(self._events)
        return _of_kind(items, kind)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __len__(self) -> int:
        with self._lock:
            return len(self._events) + self._evicted

    @property
    def held(self) -> int:
        """How many events are in memory now (at most ``memory_events`` with a file)."""
        with self._lock:
            return len(self._events)

    def last(self) -> Event | None:
        """The newest event (from memory)."""
        with self._lock:
            return self._events[-1] if self._events else None

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


def _source(predicate: Callable) -> str:
    """A lambda's source from ``lambda`` on (one line), else the function's name."""
    try:
        src = " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        src = ""
    if "lambda" in src and getattr(predicate, "__name__", "") == "<lambda>":
        return src[src.index("lambda"):][:200]
    return getattr(predicate, "__qualname__", repr(predicate))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f"{t % 1:.3f}"[1:]


def _one_line(event: Event) -> str:
    fields = " ".join(f"{k}={v}" for k, v in event.to_dict().items() if k not in ("t", "kind") and v is not None)
    return f"  {_clock(event.t)} {event.to_dict()['kind']} {fields}"[:160]


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _of_kind(items: list[Event], kind: str | type[Event] | None) -> list[Event]:
    if kind is None:
        return items
    name = kind if isinstance(kind, str) else kind.kind
    return [e for e in items if e.kind == name]


def _lines(f: BinaryIO, upto: int | None = None) -> Iterator[bytes | None]:
    """The file's lines (in its first ``upto`` bytes) as bytes; ``None`` for a line over
    ``MAX_LINE_BYTES`` (read past in chunks, never held whole)."""
    while True:
        room = MAX_LINE_BYTES + 1 if upto is None else min(MAX_LINE_BYTES + 1, upto - f.tell())
        if room <= 0:
            return
        raw = f.readline(room)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(MAX_LINE_BYTES)
            yield None
        else:
            yield raw


class _BadJson(ValueError):
    """A line that does not parse as JSON (the one way a torn last line fails)."""


def parse_line(text: str) -> Event:
    """One line as an event; ``ValueError`` with a short reason when it is none."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if "\ufffd" in text:
            raise _BadJson("binary bytes, not JSON") from None
        raise _BadJson(f"not JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5000 digits, nesting too deep
        raise ValueError(f"not readable JSON ({type(exc).__name__})") from None
    return event_from_dict(data)
