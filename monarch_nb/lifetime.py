"""What this controller releases when it ends: its runs, then its sessions.

Each is registered with ``atexit`` (interpreter exit) and kept here too, because a kernel ends
before atexit: ipykernel's shutdown (and restart) SIGTERMs every child in its process group
first, so a run's Lighthouse and workers, and a save in flight, died under a run that still
supervised them - the run restarted its Lighthouse and never recorded its stop. The extension
calls ``release_all`` from the kernel's shutdown handler, before ipykernel signals anyone.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pending: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []


def on_exit(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` when the controller ends (interpreter exit or kernel shutdown); a
    first argument is the reason, which ``release_all`` replaces with its own."""
    atexit.register(fn, *args)
    with _lock:
        _pending.append((fn, args))


def cancel(fn: Callable[..., Any]) -> None:
    """``fn`` released its resources itself (a run stopped, a session shut down)."""
    atexit.unregister(fn)
    with _lock:
        _pending[:] = [(f, a) for f, a in _pending if f != fn]


def release_all(reason: str) -> None:
    """Call every pending release now, newest first (a run before the session it runs on), as
    atexit would; ``reason`` replaces a registered reason argument. Each release cancels itself."""
    with _lock:
        pending = list(reversed(_pending))
    for fn, args in pending:
        try:
            fn(*((reason,) + args[1:] if args else ()))
        except Exception:  # one failed release must not keep the others from running
            log.exception("releasing %r at %s failed", fn, reason)
        cancel(fn)
