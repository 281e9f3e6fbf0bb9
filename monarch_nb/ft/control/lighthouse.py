"""A real torchft Lighthouse, in its own process, owned by the run.

The Lighthouse decides quorum membership from the Managers' heartbeats. It runs as a child
process (``lighthouse_server.py``, run by path: it loads no torch) rather than inside the notebook kernel so
that a busy kernel cannot delay quorum ticks. The child prints its address as one JSON line
and then waits on its stdin: when the controller closes the pipe - ``stop()``, or the
kernel dying for any reason - the child shuts the server down and exits, so it can never
outlive its controller. Bound to 127.0.0.1 by default (``bind``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SERVER_SCRIPT = Path(__file__).with_name("lighthouse_server.py")


MAX_JOIN_STRETCH = 8.0


def join_timeout_for(base_ms: int, processes_here: int, cpus: int) -> int:
    """The Lighthouse's join timeout for groups that share this host's ``cpus``: each process
    gets cpus/processes of a core, so noticing a failure, rebuilding and asking for the next
    quorum take that many times longer, and with the base timeout the slowest survivors were
    left out and healed needlessly (153 heals for 2 faults at 32 groups on two cores, each heal
    a new quorum for everyone). Stretched by processes per core, at most 8x. A dead group is
    not waited for: it stops heartbeating and leaves the quorum after ``heartbeat_timeout_ms``."""
    return int(base_ms * min(MAX_JOIN_STRETCH, max(1.0, processes_here / max(cpus, 1))))


MAX_MEETING_JOIN_MS = 60_000


def meeting_join_timeout(join_ms: int, steps_between: int) -> int:
    """LocalSGD / DiLoCo: the groups ask for a quorum only at meetings, each after its own inner
    loop, so they arrive spread by up to a loop's worth of work. A group that missed a meeting's
    quorum keeps its request at the Lighthouse through the others' whole next loop; with a join
    timeout shorter than that loop, the next quorum formed as soon as one other group came (the
    waiter's request was old enough), leaving out the third - at every meeting, a new group out
    each time, each then healed (CI: 2 of 3 groups at 10 meetings in a row). Waiting
    ``steps_between`` join timeouts (at most 60 s) lets every live group come. A dead one is not
    waited for (its heartbeats stop); a hung one is ended by the hang watch."""
    return min(MAX_MEETING_JOIN_MS, join_ms * steps_between)


@dataclass(frozen=True)
class LighthouseSettings:
    bind: str = "127.0.0.1:0"
    min_replicas: int = 1
    join_timeout_ms: int = 1000
    quorum_tick_ms: int = 20
    heartbeat_timeout_ms: int = 1000


class Lighthouse:
    """Start with :meth:`start`; ``address`` is what Managers connect to (http://host:port)."""

    def __init__(self, settings: LighthouseSettings | None = None) -> None:
        self.settings = settings or LighthouseSettings()
        self.address: str | None = None
        self.pid: int | None = None  # kept after stop(), to check that it is gone
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Lighthouse":
        """Start the server; a restart binds the port the first start got, so Managers that
        know the address find it again."""
        s = self.settings
        bind = s.bind
        if self.address is not None:  # a restart: same host and port as before
            bind = f"{s.bind.rsplit(':', 1)[0]}:{self.address.rsplit(':', 1)[1]}"
        # -P: the script's folder is not put on sys.path (its platform.py would shadow the stdlib's)
        cmd = [sys.executable, "-P", str(SERVER_SCRIPT), "--bind", bind,
               "--min-replicas", str(s.min_replicas), "--join-timeout-ms", str(s.join_timeout_ms),
               "--quorum-tick-ms", str(s.quorum_tick_ms), "--heartbeat-timeout-ms", str(s.heartbeat_timeout_ms)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.pid = self._proc.pid
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                line = self._proc.stdout.readline()
                break
            if self._proc.poll() is not None:
                break
        sel.close()
        if not line:
            self.stop()
            raise RuntimeError(f"torchft Lighthouse did not start within {timeout:g} s (bind {bind})")
        self.address = advertised(json.loads(line)["address"], bind)
        return self

    def exit_status(self) -> str | None:
        """None while the server runs; else how it ended, in words."""
        proc = self._proc
        if proc is None or proc.poll() is None:
            return None
        code = proc.returncode
        return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()  # the child's cue to shut down
            proc.wait(timeout=timeout)
        except Exception:
            proc.kill()
            proc.wait(timeout=timeout)
        finally:
            if proc.stdout:
                proc.stdout.close()


def advertised(address: str, bind: str) -> str:
    """torchft's Lighthouse names itself by this machine's hostname; a server bound to one address
    is reached at that address (a pod cannot resolve the host's name), one bound to all
    interfaces by its name."""
    host = bind.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        return address
    scheme, _, rest = address.partition("://")
    port = rest.rsplit(":", 1)[1]
    return f"{scheme}://{host}:{port}"
