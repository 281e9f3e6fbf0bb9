"""Worker logs: every worker's stdout, stderr and Python logging in one file per mesh and rank.

In the worker (through the controller's agent actor, right after the mesh comes up), file
descriptors 1 and 2 are pointed at ``<log_dir>/<mesh>-rank<k>.log``: whatever the process
writes - Python, C++ (gloo), Rust (torchft) - lands there, unbuffered, so nothing is lost when
the process is killed. Python's own writes and logging records get a timestamp and a
``[mesh rank k]`` prefix; native writes are kept as they are. Nothing of it is forwarded into
the notebook cell that happens to run, which is what flooded cells with gloo tracebacks on
every fault.

In the controller, :func:`read_logs` reads the files back (filtered by mesh, rank, text),
:func:`aggregate` folds the same line from several ranks into one ("[x 3 ranks]"), and the
known noise of a fault - gloo's "connection closed by peer" tracebacks, NCCL flight-recorder
notices, torchft's "got exception waiting for work" - becomes one summary line per burst. The
full text stays in the files.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import os
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

STACK_SIGNAL = signal.SIGUSR1  # asks a worker for its stacks (see monarch_nb.stacks)
_STAMP = "%Y-%m-%d %H:%M:%S"
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \[([\w.]+) rank (\d+)\] (.*)$")


def log_path(log_dir: str | Path, mesh: str, rank: int) -> Path:
    return Path(log_dir) / f"{mesh}-rank{rank}.log"


# ---- worker side -------------------------------------------------------------------------------


class _PrefixedWriter(io.TextIOBase):
    """A text stream that writes to a file descriptor, prefixing every line."""

    def __init__(self, fd: int, prefix: str) -> None:
        self._fd, self._prefix, self._partial = fd, prefix, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()
        if lines:
            stamp = _now()
            os.write(self._fd, "".join(f"{stamp} {self._prefix} {line}\n" for line in lines).encode("utf-8", "replace"))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            os.write(self._fd, f"{_now()} {self._prefix} {self._partial}\n".encode("utf-8", "replace"))
            self._partial = ""

    def fileno(self) -> int:
        return self._fd


def _now() -> str:
    t = time.time()
    return time.strftime(_STAMP, time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def capture(log_dir: str | Path, mesh: str, rank: int) -> str:
    """Send this process's output to its log file (called in the worker); returns the path.
    Called again (a spare taking a group's name) it continues in the new file."""
    path = log_path(log_dir, mesh, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    prefix = f"[{mesh} rank {rank}]"
    sys.stdout = _PrefixedWriter(1, prefix)
    sys.stderr = _PrefixedWriter(2, prefix)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_monarch_nb", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._monarch_nb = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    # A stack on demand, even with the GIL held: the fallback of monarch_nb.stacks when py-spy
    # cannot attach. faulthandler writes every thread's stack to fd 2 (this file).
    faulthandler.register(STACK_SIGNAL, file=2, all_threads=True, chain=False)
    print(f"--- process {os.getpid()} writes here as {mesh} rank {rank} ---", flush=True)
    return str(path)


# ---- controller side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One line of a worker's log - or, after :func:`aggregate`, several folded into one:
    ``count`` lines of the same shape from ``sources`` (mesh, rank), the last at ``last_t``.
    A traceback is one line: its final ``SomeError: ...`` line, the whole block in ``detail``."""

    t: float | None  # None: a native write before any timestamped line
    mesh: str
    rank: int
    text: str
    detail: str = ""
    count: int = 1
    sources: tuple[tuple[str, int], ...] = ()
    last_t: float | None = None

    @property
    def where(self) -> tuple[tuple[str, int], ...]:
        return self.sources or ((self.mesh, self.rank),)

    def render(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.t)) if self.t else "--:--:--"
        where = self.where
        meshes = sorted({m for m, _ in where})
        if len(where) == 1:
            label = f"{self.mesh} rank {self.rank}"
        elif len(where) <= 3:
            label = ", ".join(f"{m} rank {r}" for m, r in where)
        elif len(meshes) == 1:
            label = f"{meshes[0]} x {len(where)} ranks"
        else:
            label = f"x {len(where)} ranks of {len(meshes)} meshes"
        repeats = ""
        if self.count > len(where):
            since = time.strftime("%H:%M:%S", time.localtime(self.t)) if self.t else "?"
            repeats = f" [x {self.count} since {since}]"
            stamp = time.strftime("%H:%M:%S", time.localtime(self.last_t)) if self.last_t else stamp
        body = self.detail.rstrip("\n") if self.detail and self.count == 1 else self.text
        return f"{stamp} [{label}]{repeats} {body}"


def log_files(log_dir: str | Path, mesh: str | None = None, rank: int | None = None) -> list[Path]:
    root = Path(log_dir)
    pattern = f"{mesh or '*'}-rank{'*' if rank is None else rank}.log"
    return sorted(root.glob(pattern)) if root.is_dir() else []


class _Parser:
    """Lines of one worker's file -> LogLines; keeps its state between feeds (a traceback may
    arrive in two reads, a native line takes the time of the timestamped line before it)."""

    def __init__(self, mesh: str, rank: int) -> None:
        self.mesh, self.rank = mesh, rank
        self.last_t: float | None = None
        self.block: list[str] | None = None  # the lines of a traceback being read
        self.block_t: float | None = None

    def _stamp(self, raw: str) -> str:
        m = _LINE.match(raw)
        if not m:
            return raw  # a native write
        self.last_t = time.mktime(time.strptime(m.group(1)[:19], _STAMP)) + int(m.group(1)[20:]) / 1000
        return m.group(4)

    def feed(self, raws: Iterable[str]) -> list[LogLine]:
        out: list[LogLine] = []
        for raw in raws:
            text = self._stamp(raw.rstrip("\n"))
            if self.block is not None:
                self.block.append(text)
                if text.strip() and text[:1] not in (" ", "\t") and \
                        not text.startswith(("Traceback", "During handling", "The above")):
                    out.append(LogLine(self.block_t, self.mesh, self.rank, text, detail="\n".join(self.block)))
                    self.block = None
                continue
            if text.startswith("Traceback (most recent call last):"):
                self.block, self.block_t = [text], self.last_t
                continue
            out.append(LogLine(self.last_t, self.mesh, self.rank, text))
        return out

    def flush(self) -> list[LogLine]:
        """A traceback cut off (the process died in the middle of writing it)."""
        block, self.block = self.block, None
        return [LogLine(self.block_t, self.mesh, self.rank, block[-1], detail="\n".join(block))] if block else []


def _source(path: Path) -> tuple[str, int]:
    name, _, k = path.stem.rpartition("-rank")
    return name, int(k) if k.isdigit() else 0


def _read_file(path: Path) -> list[LogLine]:
    parser = _Parser(*_source(path))
    with open(path, encoding="utf-8", errors="replace") as f:
        return parser.feed(f) + parser.flush()


def read_logs(log_dir: str | Path, mesh: str | None = None, rank: int | None = None,
              grep: str | None = None) -> list[LogLine]:
    """Every line of the chosen files in time order; a traceback is one line (see LogLine)."""
    out: list[LogLine] = []
    for path in log_files(log_dir, mesh, rank):
        lines = _read_file(path)
        out.extend(ln for ln in lines if not grep or grep in ln.text or grep in ln.detail)
    return sorted(out, key=lambda line: line.t or 0.0)


# What a fault says in every surviving worker's log, and the one line that stands for it.
NOISE = (
    (re.compile(r"Connection closed by peer|Connection reset by peer|Read error \[|pair\.cc|Broken pipe"),
     "gloo: a peer's connection closed (a peer died or aborted)"),
    (re.compile(r"got exception waiting for work|got exception in all reduce|process group not initialized|"
                r"errored=(?!None)"),
     "torchft: a collective failed; the step is not committed and retried at the next quorum"),
    (re.compile(r"NCCL flight recorder|flight recorder|fr recording"), "NCCL flight recorder notices"),
)
_EMPTY = re.compile(r"\s*(?:(?:DEBUG|INFO|WARNING|ERROR) [\w.]+:\s*)?")
_NUMBERS = re.compile(r"0x[0-9a-f]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\d+(\.\d+)?")


def _noise(line: LogLine) -> str | None:
    for pattern, summary in NOISE:
        if pattern.search(line.text) or (line.detail and pattern.search(line.detail)):
            return summary
    return None


def shape(text: str) -> str:
    """A line with its numbers, ids and addresses blanked: lines that say the same thing."""
    return _NUMBERS.sub("#", text)


def aggregate(lines: Iterable[LogLine], window_s: float = 10.0) -> list[LogLine]:
    """Fold lines while they keep coming within ``window_s`` of each other:

    * the same line from several ranks: once, naming the ranks;
    * one rank repeating a line that differs only in numbers (a per-step message): once, with
      the latest text and a count;
    * the noise of a fault (gloo connection-closed tracebacks, failed collectives, flight
      recorder notices), from any rank: one summary line per burst.

    Lines of different ranks that differ in a number (a loss value) are never folded together.
    """
    out: list[LogLine] = []
    open_: dict[str, int] = {}  # key -> index in out of the line still taking repeats
    for line in lines:
        if _EMPTY.fullmatch(line.text):
            continue  # blank lines, and torchft's structured loggers' empty messages
        summary = _noise(line)
        keys = [f"noise:{summary}"] if summary else \
            [f"text:{line.text}", f"shape:{line.mesh}:{line.rank}:{shape(line.text)}"]
        folded = False
        for key in keys:
            idx = open_.get(key)
            if idx is None:
                continue
            first = out[idx]
            last = first.last_t or first.t
            if last is not None and line.t is not None and line.t - last > window_s:
                continue
            same_shape = key.startswith("shape:")
            text, detail = (line.text, line.detail) if same_shape else (first.text, first.detail)
            out[idx] = LogLine(first.t, first.mesh, first.rank, text, detail, first.count + 1,
                               tuple(sorted(set(first.where) | {(line.mesh, line.rank)})), line.t or last)
            if same_shape:
                open_[f"text:{line.text}"] = idx
            folded = True
            break
        if folded:
            continue
        if summary:
            line = LogLine(line.t, line.mesh, line.rank, f"{summary} (full text in the log files)", last_t=line.t)
        out.append(line)
        for key in keys:
            open_[key] = len(out) - 1
    # A folded line stands where its latest member was: a tail shows what is still going on.
    return sorted(out, key=lambda ln: ln.last_t or ln.t or 0.0)


@dataclass
class LogView:
    """What ``%monarch logs`` shows: the aggregated tail and where the files are."""

    log_dir: Path
    lines: list[LogLine] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def text(self) -> str:
        if not self.files:
            return f"no worker logs under {self.log_dir}"
        body = "\n".join(line.render() for line in self.lines) or "(no matching line)"
        return f"{body}\n-- {len(self.files)} log files in {self.log_dir}"


def view(log_dir: str | Path, mesh: str | None = None, rank: int | None = None, grep: str | None = None,
         tail: int = 40) -> LogView:
    lines = aggregate(read_logs(log_dir, mesh, rank, grep))
    return LogView(Path(log_dir), lines[-tail:] if tail else lines, log_files(log_dir, mesh, rank))


class LogFollower:
    """The recent lines of every log file in ``log_dir``, read incrementally: each ``poll()``
    reads only what was appended since the last one (a live view must not re-read files that
    grow for hours). Keeps the last ``keep`` lines."""

    def __init__(self, log_dir: str | Path, keep: int = 400) -> None:
        self.log_dir = Path(log_dir)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._parsers: dict[Path, _Parser] = {}
        self.lines: deque[LogLine] = deque(maxlen=keep)

    def poll(self) -> int:
        """Read what is new; returns how many lines came."""
        new: list[LogLine] = []
        for path in log_files(self.log_dir):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            offset = self._offsets.get(path, 0)
            if size < offset:  # truncated or replaced: start over
                offset, self._partial[path] = 0, b""
            if size == offset:
                continue
            with open(path, "rb") as f:
                f.seek(offset)
                data = self._partial.pop(path, b"") + f.read(size - offset)
            self._offsets[path] = size
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[path] = rest
            if complete or data.endswith(b"\n"):
                parser = self._parsers.setdefault(path, _Parser(*_source(path)))
                new.extend(parser.feed(complete.decode("utf-8", "replace").split("\n")))
        new.sort(key=lambda line: line.t or 0.0)
        self.lines.extend(new)
        return len(new)

    def tail(self, n: int = 12) -> list[LogLine]:
        """The last ``n`` lines after folding (see :func:`aggregate`)."""
        return aggregate(self.lines)[-n:] if n else aggregate(self.lines)
