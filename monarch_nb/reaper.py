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
import time

import psutil

POLL_S = 0.25


class Reaper:
    """Controller side: starts the watchdog lazily and tells it what to guard."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        fd, self.pidfile = tempfile.mkstemp(prefix="monarch_nb_reaper_", suffix=".jsonl")
        os.close(fd)

    def guard(self, pids: list[int], commands: list[list[str]] | None = None) -> None:
        """Kill ``pids`` (and their children) and run ``commands`` if this process dies."""
        lines = [{"pid": p} for p in pids] + [{"run": c} for c in commands or []]
        if not lines:
            return
        with open(self.pidfile, "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
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


def _read(pidfile: str) -> tuple[set[int], list[list[str]]]:
    pids: set[int] = set()
    commands: list[list[str]] = []
    try:
        with open(pidfile) as f:
            for line in f:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written: read it next round
                if "pid" in item:
                    pids.add(int(item["pid"]))
                elif "run" in item and item["run"] not in commands:
                    commands.append([str(a) for a in item["run"]])
    except OSError:
        pass
    return pids, commands


def watch(parent: int, pidfile: str) -> None:
    tracked: dict[int, float] = {}  # pid -> create_time, so a recycled pid is never killed
    commands: list[list[str]] = []
    while True:
        roots, commands = _read(pidfile)
        for root in roots:
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
