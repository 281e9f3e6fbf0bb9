"""Python stacks of worker processes, read from outside the process, grouped.

A hung rank - holding the GIL, or stuck in a collective - cannot answer a call, so its stack
is read from outside: ``py-spy dump`` (installed with torchmonarch) attaches to the pid and
reads the interpreter's memory, which needs no cooperation from the process. Where py-spy
cannot attach (not installed, or ptrace forbidden), the fallback asks the process itself:
every worker registers Python's ``faulthandler`` on SIGUSR1 (``worker_logs.capture``), which
writes every thread's stack to the worker's log file from a signal handler - it works with
the GIL held. Identical stacks of several ranks are printed once, with the ranks.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import MonarchNbError
from .meshes import ALIVE, MeshHandle, ProcInfo, pid_alive
from .worker_logs import STACK_SIGNAL, log_path


class StackError(MonarchNbError):
    """No stack could be read; the message says why and what to do."""


@dataclass(frozen=True)
class Stack:
    label: str  # "replica1 rank 0"
    pid: int
    text: str
    how: str  # "py-spy" or "faulthandler"


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def py_spy_dump(pid: int, timeout: float = 10.0, exe: str | None = None) -> str:
    exe = exe or _py_spy()
    if exe is None:
        raise StackError("py-spy is not installed (pip install py-spy)")
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StackError(f"py-spy did not read pid {pid} within {timeout:g} s") from None
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["unknown error"]
        if "ermission" in why[0] or "ptrace" in why[0].lower():
            raise StackError(f"py-spy may not attach to pid {pid}: {why[0]}. Allow ptrace: run as root or with "
                             "CAP_SYS_PTRACE, or `echo 0 > /proc/sys/kernel/yama/ptrace_scope`")
        raise StackError(f"py-spy could not read pid {pid}: {why[0]}")
    return _ANSI.sub("", out.stdout)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def faulthandler_dump(pid: int, log_file: str | Path, timeout: float = 5.0) -> str:
    """Ask the process for its stacks (SIGUSR1 -> faulthandler writes them to its log file)."""
    path = Path(log_file)
    start = path.stat().st_size if path.exists() else 0
    os.kill(pid, STACK_SIGNAL)
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            text = f.read()
        if "Thread 0x" in text or "Current thread" in text or "Stack (most recent" in text:
            time.sleep(0.2)  # faulthandler writes thread after thread; let it finish the last one
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(start)
                return f.read()
        time.sleep(0.05)
    raise StackError(f"pid {pid} wrote no stack to {path} within {timeout:g} s")


def read_stack(label: str, pid: int, log_file: str | Path | None = None) -> Stack:
    """py-spy first; faulthandler through the log file when py-spy cannot attach."""
    try:
        return Stack(label, pid, without_idle_loops(py_spy_dump(pid)), "py-spy")
    except StackError as first:
        if log_file is None:
            raise
        try:
            return Stack(label, pid, faulthandler_dump(pid, log_file), "faulthandler")
        except (StackError, OSError) as second:
            raise StackError(f"{first}; the fallback failed too: {second}") from None


def read_mesh(handle: MeshHandle, ranks: list[int] | None = None) -> list[Stack]:
    """Every chosen rank's stack (``Session.stacks``), read in parallel. Ranks named in
    ``ranks`` must exist and be alive; with no ``ranks``, dead ones are listed as such."""
    chosen = list(range(handle.size)) if ranks is None else list(ranks)
    local = socket.gethostname()
    plan: list[tuple[str, ProcInfo]] = []
    out: dict[int, Stack] = {}
    for rank in chosen:
        if not isinstance(rank, int) or not 0 <= rank < handle.size:
            raise ValueError(f"rank {rank} is not in mesh {handle.name!r} (ranks 0..{handle.size - 1})")
        proc = handle.procs[rank]
        label = f"{handle.name} rank {rank}"
        why = None
        if proc.state != ALIVE or (proc.pid and proc.host == local and not pid_alive(proc.pid)):
            why = f"{label} is {proc.state if proc.state != ALIVE else 'gone'}" + (
                f" ({proc.reason})" if proc.reason else "") + ": a dead process has no stack"
        elif proc.host != local:
            why = (f"{label} runs on host {proc.host}: stacks are read from this machine's processes; on "
                   f"{proc.host} run `py-spy dump --pid {proc.pid}`")
        if why is not None:
            if ranks is not None:
                raise StackError(why)
            out[rank] = Stack(label, proc.pid or 0, why, "unavailable")
            continue
        plan.append((label, proc))
    errors: dict[int, BaseException] = {}

    def read(label: str, proc: ProcInfo) -> None:
        try:
            out[proc.rank] = read_stack(label, proc.pid or 0, log_path(handle.log_dir, handle.name, proc.rank))
        except StackError as exc:
            errors[proc.rank] = exc

    threads = [threading.Thread(target=read, args=item, daemon=True) for item in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors and len(errors) == len(plan):
        raise next(iter(errors.values()))
    for rank, exc in errors.items():
        out[rank] = Stack(f"{handle.name} rank {rank}", handle.procs[rank].pid or 0, str(exc), "unavailable")
    return [out[r] for r in sorted(out)]


_NOISE = re.compile(r"(Process \d+:.*|Python v[\d.]+.*|\(idle\)|0x[0-9a-f]+|pid \d+|Thread \d+)")


def _shape(text: str) -> str:
    """The stack without what differs between identical stacks (pids, thread ids, addresses)."""
    return "\n".join(_NOISE.sub("", line).rstrip() for line in text.splitlines() if line.strip())


_IDLE_LOOP = re.compile(r"^Thread [^\n]*\(idle\)[^\n]*\n\s+EpollSelector\.select[^\n]*\n(?:\s+[^\n]*\n?)*?(?=^Thread |\Z)",
                        re.M)


def without_idle_loops(text: str) -> str:
    """A py-spy dump without the threads that only wait in an asyncio event loop (Monarch's
    plumbing, in every process), counted in one line instead."""
    idle = _IDLE_LOOP.findall(text)
    if not idle:
        return text
    kept = _IDLE_LOOP.sub("", text).rstrip("\n")
    return f"{kept}\n(+ {len(idle)} idle event-loop thread{'s' if len(idle) > 1 else ''})\n"


def grouped(stacks: list[Stack]) -> list[tuple[list[str], Stack]]:
    """Identical stacks once, with the labels (ranks) that share them."""
    groups: dict[str, tuple[list[str], Stack]] = {}
    for stack in stacks:
        key = _shape(stack.text)
        if key in groups:
            groups[key][0].append(stack.label)
        else:
            groups[key] = ([stack.label], stack)
    return list(groups.values())


def innermost_functions(text: str, limit: int = 3) -> list[str]:
    """The innermost frames' function names of the main training or endpoint threads."""
    names = re.findall(r"^\s+(\w[\w.<>]*) \(", text, re.M)
    return names[:limit]
