"""Orphan reaper: kills a controller's worker processes if the controller dies uncleanly.

Local Monarch workers die with their controller, but ProcessJob "hosts" run in their own
session (they outlive a SIGKILLed kernel). The Session starts this small watchdog in a
separate session; the controller appends root pids to a file, the reaper tracks them and
their descendants, and SIGKILLs all of them once the controller is gone. A clean shutdown
terminates the reaper first, so it never kills anything in normal operation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil

POLL_S = 0.25


class Reaper:
    """Controller side: starts the watchdog lazily and tells it which pids to guard."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        fd, self.pidfile = tempfile.mkstemp(prefix="monarch_nb_reaper_", suffix=".pids")
        os.close(fd)

    def guard(self, pids: list[int]) -> None:
        if not pids:
            return
        with open(self.pidfile, "a") as f:
            f.write("".join(f"{p}\n" for p in pids))
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "monarch_nb.reaper", str(os.getpid()), self.pidfile],
                start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
        try:
            os.unlink(self.pidfile)
        except OSError:
            pass


def _read_roots(pidfile: str) -> set[int]:
    try:
        with open(pidfile) as f:
            return {int(line) for line in f if line.strip()}
    except OSError:
        return set()


def watch(parent: int, pidfile: str) -> None:
    tracked: dict[int, float] = {}  # pid -> create_time, so a recycled pid is never killed
    while True:
        for root in _read_roots(pidfile):
            try:
                proc = psutil.Process(root)
                for p in [proc, *proc.children(recursive=True)]:
                    tracked.setdefault(p.pid, p.create_time())
            except psutil.NoSuchProcess:
                continue
        if not psutil.pid_exists(parent) or psutil.Process(parent).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(POLL_S)
    for pid, created in tracked.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    try:
        os.unlink(pidfile)
    except OSError:
        pass


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
