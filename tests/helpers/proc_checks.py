"""Helpers for tests: process liveness by pid, and bounded polling (never a bare sleep)."""

from __future__ import annotations

import time

from monarch_nb.meshes import pid_alive


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if pid_alive(pid)]


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Processes must exit within ``timeout``; polls process state, not a fixed sleep."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(pids)
    assert not left, f"orphan worker processes still running: {left}"


def wait_for(predicate, timeout: float, what: str, poll: float = 0.02):
    """Poll ``predicate`` until it returns a truthy value or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def processes_of(run_id: str) -> list[int]:
    """Every process whose environment carries the run's id (its host sets it, all it starts inherit it)."""
    from pathlib import Path

    from monarch_nb.ft.control.run_client import RUN_ENV

    found = []
    needle = f"{RUN_ENV}={run_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
