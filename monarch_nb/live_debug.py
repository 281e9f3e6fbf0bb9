"""Live breakpoints, driven from the notebook through Monarch's own debugger.

A ``breakpoint()`` on a worker (in actor code, or in a ``%%monarch`` cell: see
:mod:`.agent`) stops that rank in Monarch's remote pdb, which Monarch's ``DebugController`` in
this process serves over TCP (what ``monarch debug`` reaches through netcat): ``list``,
``attach <actor> <rank>``, pdb commands while attached, ``detach``, ``cast <actor> ranks(...)
<command>``, ``continue`` (every rank), ``quit``. :class:`LiveDebugger` is a client of that
line protocol: each command is sent as one line, and its output is read up to the next prompt
(``monarch_dbg> `` or, attached to a rank, pdb's ``(Pdb) ``). :func:`drive` feeds it commands
from a list (headless notebooks) or from the notebook's input box.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Callable, Iterable, Iterator

from . import seam

PROMPTS = ("monarch_dbg> ", "(Pdb) ")
QUIET_S = 0.05  # a prompt at the end of what came, then nothing for this long: the command is done


class LiveDebugger:
    """One connection to Monarch's debug server (spawned here first if no rank started it)."""

    def __init__(self, address: tuple[str, int] | None = None, timeout: float = 30.0) -> None:
        self.address = address or seam.debug_server_address()
        self.timeout = timeout
        self.prompt = ""
        self._sock: socket.socket | None = None

    def connect(self) -> str:
        """Connect; returns Monarch's banner (the server starts with the first breakpoint, or here)."""
        deadline = time.monotonic() + self.timeout
        started = False
        while True:
            try:
                self._sock = socket.create_connection(self.address, timeout=2.0)
                break
            except OSError as exc:
                if not started:
                    seam.start_debug_server()
                    started = True
                elif time.monotonic() > deadline:
                    host, port = self.address
                    raise ConnectionError(f"Monarch's debug server at {host}:{port} did not answer within "
                                          f"{self.timeout:g} s ({exc}); MONARCH_DEBUG_SERVER_PORT picks its port") from None
                time.sleep(0.2)
        return self._read()

    def send(self, line: str, timeout: float = 60.0) -> str:
        """Send one command; what it printed, up to the next prompt (kept in ``prompt``)."""
        assert self._sock is not None, "connect() first"
        self._sock.sendall((line.rstrip("\n") + "\n").encode())
        return self._read(timeout)

    def _read(self, timeout: float | None = None) -> str:
        assert self._sock is not None
        deadline = time.monotonic() + (timeout or self.timeout)
        data = b""
        while True:
            text = data.decode(errors="replace")
            prompt = next((p for p in PROMPTS if text.endswith(p)), None)
            wait = QUIET_S if prompt else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], wait)
            if not ready:
                if prompt:
                    self.prompt = prompt
                    return text[: -len(prompt)]
                raise TimeoutError(f"Monarch's debugger gave no prompt within {timeout or self.timeout:g} s; "
                                   f"it printed: {text[-500:]!r}")
            chunk = self._sock.recv(65536)
            if not chunk:  # the server closed the connection (after quit)
                self.prompt = ""
                return text
            data += chunk

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.sendall(b"quit\n")  # ranks stay stopped where they are; a new connection finds them
        except OSError:
            pass
        sock.close()

    def __enter__(self) -> "LiveDebugger":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drive(dbg: LiveDebugger, commands: Iterable[str] | None, read: Callable[[str], str],
          show: Callable[[str], None], done: Callable[[], bool] = lambda: False) -> bool:
    """Run debugger commands: the given ones in order (echoed after their prompt, as a terminal
    would show them), else each line ``read(prompt)`` returns (the notebook's input box) until
    ``quit``. ``done()`` is asked when back at ``monarch_dbg>``: True (e.g. no rank is stopped
    any more) ends it. Returns False if the user quit while ranks may still be stopped."""
    given: Iterator[str] | None = iter(commands) if commands is not None else None
    while True:
        if given is not None:
            line = next(given, None)
            if line is None:
                return True
            show(f"{dbg.prompt}{line}")
        else:
            line = read(dbg.prompt)
        if line.strip() in ("quit", "exit"):
            return False
        out = dbg.send(line)
        if out.strip():
            show(out.rstrip("\n"))
        if dbg.prompt == PROMPTS[0] and done():
            return True
