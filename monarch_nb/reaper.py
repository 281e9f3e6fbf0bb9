"""Orphan reaper: releases what a controller holds if the controller dies uncleanly.

Local Monarch workers die with their controller, but ProcessJob "hosts" run in their own
session (they outlive a SIGKILLed kernel), and a SLURM allocation lives until it is
cancelled. The Session starts this small watchdog in a separate session; the controller
appends what to guard to a file - root pids (killed with their descendants) and commands
(``scancel JOB``) - and once the controller is gone the reaper kills the pids and runs the
commands. A clean shutdown terminates the reaper first, so it never acts in normal operation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil

POLL_S = 0.25  # how soon the controller's death is noticed
RESCAN_S = 2.0  # how often the guarded processes' descendants are looked for


class Reaper:
    """Controller side: starts the watchdog lazily and tells it what to guard."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        # Groups start in parallel (one thread per mesh): without it two threads could each
        # start a watchdog, and the one not kept would outlive the session.
        self._lock = threading.Lock()
        fd, self.pidfile = tempfile.mkstemp(prefix="monarch_nb_reaper_", suffix=".jsonl")
        os.close(fd)

    def guard(self, pids: list[int], commands: list[list[str]] | None = None) -> None:
        """Kill ``pids`` (and their children) and run ``commands`` if this process dies."""
        lines = [{"pid": p} for p in pids] + [{"run": c} for c in commands or []]
        if not lines:
            return
        with self._lock:
            with open(self.pidfile, "a") as f:
                f.write("".join(json.dumps(line) + "\n" for line in lines))
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "monarch_nb.reaper", str(os.getpid()), self.pidfile],
                    start_new_session=True, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            os.unlink(self.pidfile)
        except OSError:
            pass


class GuardFile:
    """The controller's guard file, read incrementally: each round parses only the lines appended
    since the last (the file grows by a line per process started, over a run of days)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset = path, 0
        self.pids: set[int] = set()
        self.commands: list[list[str]] = []

    def read_new(self) -> set[int]:
        """Parse what was appended; returns the pids new in it."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return set()
        end = data.rfind(b"\n") + 1  # a line being written is read next round, whole
        self.offset += end
        new: set[int] = set()
        for line in data[:end].decode(errors="replace").splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "pid" in item and int(item["pid"]) not in self.pids:
                new.add(int(item["pid"]))
            elif "run" in item and item["run"] not in self.commands:
                self.commands.append([str(a) for a in item["run"]])
        self.pids |= new
        return new


def _descendants(roots: set[int]) -> dict[int, float]:
    """pid -> create_time of every live root and its descendants, from ONE scan of the process
    table (psutil's ``children(recursive=True)`` scans it once per root: R scans for R groups)."""
    children: dict[int, list[int]] = {}
    created: dict[int, float] = {}
    for p in psutil.process_iter(["ppid", "create_time"]):
        children.setdefault(p.info["ppid"], []).append(p.pid)
        created[p.pid] = p.info["create_time"]
    out: dict[int, float] = {}
    stack = [r for r in roots if r in created]
    while stack:
        pid = stack.pop()
        if pid not in out:
            out[pid] = created[pid]
            stack.extend(children.get(pid, ()))
    return out


def watch(parent: int, pidfile: str) -> None:
    tracked: dict[int, float] = {}  # pid -> create_time, so a recycled pid is never killed
    guard = GuardFile(pidfile)
    rescan_at = 0.0
    while True:
        if guard.read_new() or time.monotonic() >= rescan_at:
            # Descendants (a worker's own children) are looked for every RESCAN_S, and at once
            # when new roots come; dead roots drop out, so a long run's scan stays its size.
            for pid, created in _descendants(guard.pids).items():
                tracked.setdefault(pid, created)
            guard.pids = {p for p in guard.pids if psutil.pid_exists(p)}
            tracked = {p: c for p, c in tracked.items() if psutil.pid_exists(p)}
            rescan_at = time.monotonic() + RESCAN_S
        if not psutil.pid_exists(parent) or psutil.Process(parent).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(POLL_S)
    commands = guard.commands
    for pid, created in tracked.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    for command in commands:
        try:
            subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        os.unlink(pidfile)
    except OSError:
        pass


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
