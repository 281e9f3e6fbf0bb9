"""IPython extension: registers the magics, HTML views, and failure notices.

Loaded by the Monarch kernelspec at start (``--IPKernelApp.extensions=monarch_nb``) or by
``%load_ext monarch_nb`` in any IPython kernel. Views of controller objects (sessions,
meshes, call results) and of Monarch's own meshes are registered here as IPython display
formatters, so the controller never imports the notebook layer; drawing an object reads
it and changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from typing import Any

from .. import lifetime, seam
from ..errors import CallInterrupted, Interrupted
from . import notices
from .magics import MonarchMagics


_BLOCKING_GET = "Future.get() called from within an active event loop"


class _DropBlockingGetNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Monarch's own filters may prefix the message ("[actor=<root>] ...").
        return not record.getMessage().endswith(_BLOCKING_GET)


def quiet_blocking_get() -> None:
    """Silence Monarch's "blocking get() inside an event loop" notices in the kernel.

    A notebook cell is synchronous code run from ipykernel's asyncio loop, so every
    ``.get()`` typed in a cell trips them. Monarch futures resolve on Monarch's own Tokio
    runtime, never on the kernel's loop, so blocking a cell on them cannot deadlock; the
    notices would only bury the cell's real output.
    """
    warnings.filterwarnings("ignore", message=r"(Blocking get\(\)|Future\.get\(\)) (was called|called)", category=UserWarning)
    logging.getLogger(seam.TELEMETRY_LOGGER).addFilter(_DropBlockingGetNotice())


def own_debug_port() -> None:
    """A debug-server port of this kernel's own: Monarch's debugger listens on 27000 by default,
    so a second kernel on the machine could not serve its ranks' breakpoints. Chosen free now
    (``MONARCH_DEBUG_SERVER_PORT`` set by the user wins); only this process reads it."""
    if "MONARCH_DEBUG_SERVER_PORT" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MONARCH_DEBUG_SERVER_PORT"] = str(s.getsockname()[1])


def load_ipython_extension(ipython: Any) -> None:
    quiet_blocking_get()
    own_debug_port()
    # a kernel's shutdown or restart stops its runs and sessions before ipykernel SIGTERMs their processes
    seam.call_before_kernel_shutdown(getattr(ipython, "kernel", None), lambda restart: lifetime.release_all(
        "kernel restart" if restart else "kernel shutdown"))
    ipython.register_magics(MonarchMagics(ipython))  # registers the HTML views too
    seam.show_interrupts_in_one_line(ipython, (Interrupted, CallInterrupted))
    if notices.current is None:
        notices.current = notices.FailureNotices()
        ipython.events.register("pre_run_cell", notices.current.pre_run_cell)
        ipython.events.register("post_run_cell", notices.current.post_run_cell)


def unload_ipython_extension(ipython: Any) -> None:
    if notices.current is not None:
        ipython.events.unregister("pre_run_cell", notices.current.pre_run_cell)
        ipython.events.unregister("post_run_cell", notices.current.post_run_cell)
        notices.current.close()
        notices.current = None
