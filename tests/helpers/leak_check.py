"""What a test must not leave behind, and how long to wait for it to go (see conftest.py for when).

A snapshot holds the pytest process's SIGINT handler (Python's, and the one the kernel calls:
native code can replace Python's C handler, and then Ctrl-C raises nothing while
``signal.getsignal`` still says all is well), its live non-daemon threads, its child processes
(recursively), its listening inet sockets and, where ``squeue`` exists, our SLURM jobs.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from monarch_nb.jobs.local_cluster import CONTROLLER_ADDRS
from monarch_nb.jobs.local_k8s import POD_GATEWAYS

GRACE_S = 5.0  # threads join, processes exit, sockets close and jobs leave squeue within this
POLL_S = 0.05
MONARCH_CLIENT_ADDRS = (*CONTROLLER_ADDRS, *POD_GATEWAYS, "::1")


@dataclass(frozen=True)
class State:
    """One snapshot; keys stay stable across snapshots (a process is (pid, create_time))."""

    sigint: Any
    native_sigint: int | None
    threads: dict[threading.Thread, str]
    children: dict[tuple[int, float], tuple[int, str]]  # key -> (parent pid, command line)
    listening: dict[str, str]
    jobs: dict[str, str]


def take(jobs: bool) -> State:
    return State(signal.getsignal(signal.SIGINT), _native_sigint(), _threads(), _children(), _listening(),
                 _jobs() if jobs else {})


def _native_handler(signum: int) -> int | None:
    """The address of the function the kernel calls on ``signum`` (Linux: ``sa_handler`` is the
    first field of ``struct sigaction``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    action = ctypes.create_string_buffer(256)  # larger than any struct sigaction
    if _libc.sigaction(signum, None, action) != 0:
        return None
    return int.from_bytes(action.raw[:ctypes.sizeof(ctypes.c_void_p)], sys.byteorder)


def _native_sigint() -> int | None:
    return _native_handler(signal.SIGINT)


def _python_c_handler() -> int | None:
    """Python's C handler: one function for every signal with a Python handler, read off
    SIGWINCH (ignored by default) while it briefly has one."""
    previous = signal.signal(signal.SIGWINCH, lambda *_: None)
    try:
        return _native_handler(signal.SIGWINCH)
    finally:
        signal.signal(signal.SIGWINCH, previous if previous is not None else signal.SIG_DFL)


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def native_name(address: int) -> str:
    """``0x7f..: signal_hook_registry::handler in .../_rust_bindings.so``: who installed it."""
    info = _DlInfo()
    if address < 4096 or not _libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return {0: "SIG_DFL", 1: "SIG_IGN"}.get(address, f"{address:#x}")
    where = (info.fname or b"?").decode(errors="replace")
    return f"{address:#x}: {(info.sname or b'?').decode(errors='replace')} in {where}"


_libc = ctypes.CDLL(None, use_errno=True)
PYTHON_NATIVE_SIGINT = _python_c_handler()


def _threads() -> dict[threading.Thread, str]:
    main = threading.main_thread()
    return {t: t.name for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()}


def _children() -> dict[tuple[int, float], tuple[int, str]]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # exited, only not yet reaped by its Popen: nothing runs
            with p.oneshot():
                out[(p.pid, p.create_time())] = (p.ppid(), " ".join(p.cmdline())[:160] or p.name())
        except psutil.Error:
            continue  # gone while we looked
    return out


def _listening() -> dict[str, str]:
    """Listening sockets of this process, except Monarch's client on the netns cluster's controller
    address, on the Kubernetes cluster's pod gateways and on IPv6 loopback: the client listens once per channel transport for the life of the
    process (measured: still listening 60 s after its last mesh, and after Session.shutdown), and
    only it binds there in this process. (In the whole suite the loopback listener is opened before
    the SLURM tests by test_ft_placement's ProcessJob; run alone, test_slurm.py's first test opened
    it and was charged with it.)"""
    conns = psutil.Process().net_connections(kind="inet")
    addrs = (f"{c.laddr.ip}:{c.laddr.port}" for c in conns
             if c.status == psutil.CONN_LISTEN and c.laddr.ip not in MONARCH_CLIENT_ADDRS)
    return {a: a for a in addrs}


def _jobs() -> dict[str, str]:
    """Our SLURM jobs ("monarch_nb-" names); none when SLURM is not installed or does not answer."""
    if shutil.which("squeue") is None or not _slurmctld_runs():
        return {}  # squeue waits ~4 s for a controller that is configured but down (after ./run.sh slurm down)
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [ln.strip() for ln in out.stdout.splitlines() if "monarch_nb-" in ln]
    return {ln.split()[0]: ln for ln in lines}


def _slurmctld_runs() -> bool:
    """A slurmctld process is alive on this machine (the project's SLURM cluster is local)."""
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "slurmctld":
                return True
        except OSError:
            continue
    return False


@dataclass
class Owned:
    """What broader-scoped fixtures created while being set up (or tests grew in them): theirs
    until they are torn down.

    A process counts as owned when it or an ancestor is (a Lab server's kernels, a browser's
    renderers are started later, under the process the fixture started). A SIGINT handler is
    never owned: it changes how every later test is interrupted."""

    threads: set[threading.Thread] = field(default_factory=set)
    pids: set[tuple[int, float]] = field(default_factory=set)
    listening: set[str] = field(default_factory=set)

    def add(self, before: State, after: State) -> None:
        self.threads |= after.threads.keys() - before.threads.keys()
        self.pids |= after.children.keys() - before.children.keys()
        self.listening |= after.listening.keys() - before.listening.keys()

    def __contains__(self, key: Any) -> bool:
        return key in self.threads or key in self.pids or key in self.listening

    def owns_process(self, key: tuple[int, float], children: dict) -> bool:
        by_pid = {pid: (pid, t) for pid, t in children}
        seen = set()
        while key is not None and key not in seen:
            if key in self.pids:
                return True
            seen.add(key)
            key = by_pid.get(children[key][0]) if key in children else None
        return False


def leftovers(before: State, after: State, owned: list[Owned]) -> dict[str, dict[Any, str]]:
    """What is in ``after`` and neither in ``before`` nor owned by an active broader fixture."""
    left = {
        "thread": {t: f"{name}" for t, name in after.threads.items()
                   if t not in before.threads and not any(t in o.threads for o in owned)},
        "child process": {k: f"pid {k[0]}: {cmd}" for k, (_, cmd) in after.children.items()
                          if k not in before.children
                          and not any(o.owns_process(k, after.children) for o in owned)},
        "listening socket": {a: a for a in after.listening
                             if a not in before.listening and not any(a in o.listening for o in owned)},
        "SLURM job": {j: line for j, line in after.jobs.items() if j not in before.jobs},
    }
    handler = after.sigint
    if handler is not before.sigint and handler is not signal.default_int_handler:
        left["SIGINT handler"] = {("sigint", id(handler)): repr(handler)}
    native = after.native_sigint
    if native != before.native_sigint and native != PYTHON_NATIVE_SIGINT:
        left["native SIGINT handler"] = {("native sigint", native): f"{native_name(native)} (not Python's: Ctrl-C may raise nothing)"}
    return {kind: items for kind, items in left.items() if items}


def settle(before: State, owned: list[Owned], jobs: bool) -> dict[str, dict[Any, str]]:
    """Leftovers once threads, processes, sockets and jobs had GRACE_S to go (a handler never goes)."""
    deadline = time.monotonic() + GRACE_S
    while True:
        left = leftovers(before, take(jobs), owned)
        if set(left) <= {"SIGINT handler", "native SIGINT handler"} or time.monotonic() >= deadline:
            return left
        for t in left.get("thread", {}):
            t.join(max(0.0, deadline - time.monotonic()))
        time.sleep(POLL_S)  # polling processes, sockets and squeue, bounded by the deadline


PLURAL = {"thread": "threads", "child process": "child processes", "listening socket": "listening sockets",
          "SLURM job": "SLURM jobs"}


def describe(left: dict[str, dict[Any, str]], where: dict[Any, str] | None = None) -> str:
    """``2 child processes (pid 1: python -m x, ...), SIGINT handler <...>``; ``where`` names the
    test during which an item appeared."""
    parts = []
    for kind, items in left.items():
        labels = [label + (f" [appeared in {where[k]}]" if where and k in where else "") for k, label in items.items()]
        if kind.endswith("SIGINT handler"):
            parts.append(f"{kind} {labels[0]}")
        else:
            parts.append(f"{len(items)} {kind if len(items) == 1 else PLURAL[kind]} ({', '.join(labels)})")
    return ", ".join(parts)
