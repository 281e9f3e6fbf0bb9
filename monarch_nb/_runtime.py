"""Process-wide Monarch setup that must happen before ``monarch`` is first imported.

Workers inherit the controller's environment, so Monarch's settings are set here once. The
supervision poll stays at Monarch's 10 s: each poll of each mesh leaves ~10 KB in the client
that is never given back (bench/supervision_growth.py: 33 KB/s per mesh at 300 ms), and the
session's own watcher finds a dead process on this machine within ~0.25 s by its pid (see
``FailureWatch.start``). gloo's loopback interface is set per mesh, only for hosts on this machine
(``LOOPBACK_ENV``).
Monarch's default ``unhandled_fault_hook`` exits the client (it would kill the notebook
kernel when any worker dies); we replace it with a dispatcher that fans failures out to
listeners and always returns normally, which tells Monarch the fault was handled.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Callable

DEFAULT_ENV = {
    "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "10s",
    # A proc that reports no state for this long is failed: calls into a cancelled SLURM
    # allocation raise after ~5.5 s instead of ~61 s (Monarch's default).
    "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE": "5s",
    # Monarch's host agent stops every proc whose owner's keepalive has lapsed, checking once per
    # this timeout. At its default (60 s) it stopped the 3 freshly spawned procs of a live
    # controller 9 s after their spawn (bench_goodput, 2026-12-04 06:38:00: "stopping 6 orphaned
    # procs past their keepalive expiry", then Killed(sig=9) while the run started). A dead
    # controller's workers are monarch_nb's reaper's to end (within ~0.25 s); Monarch's own
    # orphan check is kept as a slower backstop.
    "HYPERACTOR_MESH_ORPHAN_TIMEOUT": "10m",
}
# For workers whose hosts are all this machine (set per mesh, never for remote hosts, where
# gloo must use a real interface).
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo"}

FaultListener = Callable[[Any], None]
_listeners: list[FaultListener] = []
_lock = threading.Lock()
_installed = False


def configure_environment() -> None:
    """Set defaults the user has not set; an explicit environment variable wins."""
    late = "monarch" in sys.modules and any(key not in os.environ for key in DEFAULT_ENV)
    for key, value in DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    if late:
        # Monarch reads these settings when it is imported.
        warnings.warn(
            "monarch was imported before monarch_nb, so calls into a lost allocation take ~61 s to fail "
            "instead of ~5.5 s; import monarch_nb first, or set "
            + " ".join(f"{k}={v}" for k, v in DEFAULT_ENV.items()),
            stacklevel=3,
        )


def _dispatch(failure: Any) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(failure)
        except Exception:  # a broken listener must never take the controller down
            pass


def install_fault_hook() -> None:
    global _installed
    configure_environment()
    import monarch.actor

    with _lock:
        if _installed:
            return
        # Monarch looks the hook up on ``monarch.actor`` each time a fault is unhandled.
        monarch.actor.unhandled_fault_hook = _dispatch
        _installed = True


def add_fault_listener(listener: FaultListener) -> Callable[[], None]:
    install_fault_hook()
    with _lock:
        _listeners.append(listener)

    def remove() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


configure_environment()
