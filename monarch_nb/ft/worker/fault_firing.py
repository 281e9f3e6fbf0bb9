"""Worker side of fault injection: how a training thread makes each fault kind happen.

The fault itself (kind, target, trigger) and the fault log's format are plain data
(:mod:`monarch_nb.ft.settings.faults`); the trainer actor arms a fault and calls :func:`fire` at its
point in the step, after writing the firing to the fault log (the process may be gone a moment
later).
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from ..settings.faults import EXIT_CODE, FaultKind


class InjectedException(RuntimeError):
    """What the ``exception`` fault raises inside the train step."""


def hold_gil(seconds: float) -> None:
    """Block the whole interpreter: one C call made with the GIL held (ctypes.PyDLL keeps it),
    so no other Python thread of this process - endpoints included - runs until it returns."""
    import ctypes

    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(max(1, int(round(seconds))))


def fire(kind: FaultKind, *, abort_comms: Callable[[], None] | None = None, hang_s: float = 30.0,
         corrupt_heal: Callable[[], None] | None = None) -> None:
    """Make ``kind`` happen in this process, now. Only returns for ``comms``, ``hang`` and ``corrupt``."""
    if kind is FaultKind.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind is FaultKind.SEGFAULT:
        import ctypes

        ctypes.string_at(0)  # NULL read: a genuine SIGSEGV
    elif kind is FaultKind.EXIT:
        os._exit(EXIT_CODE)
    elif kind is FaultKind.EXCEPTION:
        raise InjectedException("injected exception inside the train step")
    elif kind is FaultKind.COMMS:
        if abort_comms is None:
            raise RuntimeError("comms fault needs the cross-replica process group")
        abort_comms()
    elif kind is FaultKind.HANG:
        hold_gil(hang_s)
    elif kind is FaultKind.CORRUPT:
        if corrupt_heal is None:
            raise RuntimeError("corrupt fault needs heal_transport='striped'")
        corrupt_heal()
    else:  # the cluster kinds never reach a worker
        raise ValueError(f"kind: {kind.value!r} is done by the controller through the scheduler, not in a worker")
