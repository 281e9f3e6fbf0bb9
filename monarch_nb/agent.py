"""The controller's own actor on every process of a mesh.

It answers "who are you" (pid, host) for the health view, points the process's output at its
log file (:mod:`.worker_logs`), and runs notebook code for ``%%monarch`` the way
ipyparallel's ``%%px`` does: one persistent namespace per process, stdout/stderr captured,
and the value of a trailing expression returned as its repr.

A cell runs on a thread of its own, not on the actor's: the actor stays free to take
``interrupt`` while the cell runs (``run_cell`` is a Monarch concurrent endpoint), and the
training loop of a run on the same process is never touched by it. An interrupt raises
``KeyboardInterrupt`` in the cell's thread at its next Python instruction and wakes a
``time.sleep`` at once; code blocked in native code (a collective, a lock) stops when that
call returns. The last exception a cell raised is kept, with its frames, for ``debug``:
a post-mortem pdb driven one command at a time from the notebook.
"""

from __future__ import annotations

import ast
import asyncio
import ctypes
import io
import itertools
import linecache
import os
import pdb
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import Actor, concurrent_endpoint, context, current_rank, endpoint

from . import worker_logs


@dataclass(frozen=True)
class ProcIdentity:
    rank: int
    pid: int
    host: str
    job_id: str | None = None  # SLURM_JOB_ID when SLURM started the process
    node: str | None = None  # SLURMD_NODENAME: the scheduler's name for this node


@dataclass(frozen=True)
class CellOutput:
    """What one process produced for a ``%%monarch`` cell."""

    rank: int
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    error: str | None = None
    traceback: str | None = None
    interrupted: bool = False  # the cell ended because the notebook interrupted it
    seconds: float = 0.0


@dataclass(frozen=True)
class DebugReply:
    """What one post-mortem pdb command printed; ``done`` once the session ended (``q``)."""

    rank: int
    output: str
    done: bool = False


@dataclass
class _Namespace:
    values: dict[str, Any] = field(default_factory=lambda: {"__name__": "__monarch_cell__"})


def _compile_cell(code: str, filename: str = "<monarch cell>") -> tuple[Any, Any]:
    """Split a cell into statements and an optional trailing expression, like IPython does.
    The source is put in ``linecache`` under ``filename``, so tracebacks and pdb can show it."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    tail = compile(last, filename, "eval") if last is not None else None
    return body, tail


# ---- cell threads: their own stdout, an interruptible sleep ---------------------------------


@dataclass
class _Cell:
    thread_id: int
    stdout: io.StringIO = field(default_factory=io.StringIO)
    stderr: io.StringIO = field(default_factory=io.StringIO)
    interrupt: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    rank: int = 0
    point: dict[str, int] = field(default_factory=dict)
    actor_id: Any = None  # the agent's, for Monarch's debugger (who is stopped where)
    debug_controller: Any = None  # returns Monarch's DebugController in the client (seam.actor_debug_controller)
    pdb: Any = None  # Monarch's remote pdb, once the cell called breakpoint()
    paused: Paused | None = None  # where it waits for debugger commands now


@dataclass(frozen=True)
class Paused:
    """A cell stopped in Monarch's debugger: where, as the notebook names it."""

    rank: int
    where: str  # "In [7] line 3, in <module>" or "file.py line 12, in f"
    line: str  # the source line it stopped at
    actor: str = ""  # the name Monarch's debugger knows it by: ``attach <actor> <rank>``


def _cell_breakpointhook(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` in a cell's thread stops that rank in Monarch's own debugger, as in an
    endpoint; anywhere else (actor code) Monarch's hook runs as before."""
    from . import seam

    cell = _cells.get(threading.get_ident())
    if cell is None or cell.actor_id is None:
        if seam.is_monarch_breakpointhook(_monarch_breakpointhook):
            return seam.actor_breakpoint(sys._getframe(1))  # stop in the caller, not in this hook
        return _monarch_breakpointhook(*args, **kwargs)

    def on_stop(frame: Any) -> None:
        cell.paused = None if frame is None else _paused_at(cell.rank, frame, seam.actor_name(cell.actor_id))

    if cell.pdb is None:
        cell.pdb = seam.cell_pdb(cell.rank, cell.point, cell.actor_id, cell.debug_controller(), on_stop)
    cell.pdb.set_trace(sys._getframe(1))


def _paused_at(rank: int, frame: Any, actor: str) -> Paused:
    name = frame.f_code.co_filename
    where = name[len("<monarch cell "):-1] if name.startswith("<monarch cell ") else os.path.basename(name)
    return Paused(rank, f"{where} line {frame.f_lineno}, in {frame.f_code.co_name}",
                  linecache.getline(name, frame.f_lineno, frame.f_globals).strip(), actor)


_monarch_breakpointhook: Any = sys.breakpointhook  # replaced by Monarch's at the worker's bootstrap


_cells: dict[int, _Cell] = {}  # thread ident -> the cell running on it
_cell_numbers = itertools.count(1)
_real_sleep = time.sleep


def _sleep(seconds: float) -> None:
    """``time.sleep`` that an interrupt wakes at once in a cell's thread (unchanged elsewhere)."""
    cell = _cells.get(threading.get_ident())
    if cell is None:
        _real_sleep(seconds)
        return
    if cell.interrupt.wait(max(0.0, seconds)):
        raise KeyboardInterrupt("interrupted from the notebook")


class _CellStreams(io.TextIOBase):
    """``sys.stdout``/``sys.stderr``: a cell thread's writes go to that cell's buffer,
    everybody else's (the training loop, Monarch) to the stream underneath (the log file)."""

    def __init__(self, under: Any, which: str) -> None:
        self.under, self._which = under, which

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        cell = _cells.get(threading.get_ident())
        if cell is not None:
            return getattr(cell, self._which).write(text)
        return self.under.write(text)

    def flush(self) -> None:
        if threading.get_ident() not in _cells:
            self.under.flush()

    def fileno(self) -> int:
        return self.under.fileno()


def _route_streams() -> None:
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if not isinstance(current, _CellStreams):
            setattr(sys, name, _CellStreams(current, name))
    time.sleep = _sleep


def _raise_in(thread_id: int) -> None:
    """KeyboardInterrupt in another thread, at its next Python instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(KeyboardInterrupt))


class _PostMortem(pdb.Pdb):
    """pdb on a stored traceback, one command at a time, its output captured."""

    def __init__(self, tb: Any) -> None:
        own = tb
        while own is not None and own.tb_frame.f_code.co_filename == __file__:
            own = own.tb_next  # start at the cell's own frames, not the agent's
        tb = own or tb
        self.buffer = io.StringIO()
        super().__init__(stdin=io.StringIO(), stdout=self.buffer, nosigint=True)
        self.use_rawinput = False
        self.prompt = ""
        self.reset()
        self.setup(None, tb)
        self.done = False

    def run_command(self, line: str) -> str:
        self.buffer.seek(0)
        self.buffer.truncate()
        if self.onecmd(line) or line.strip() in ("q", "quit", "exit"):
            self.done = True
        return self.buffer.getvalue()

    def set_quit(self) -> None:  # "q" ends this session only; there is nothing to resume
        self.done = True

    def where_now(self) -> str:
        self.buffer.seek(0)
        self.buffer.truncate()
        self.print_stack_entry(self.stack[self.curindex])
        return self.buffer.getvalue()


def _install_breakpointhook() -> None:
    global _monarch_breakpointhook
    if sys.breakpointhook is not _cell_breakpointhook:
        _monarch_breakpointhook = sys.breakpointhook
        sys.breakpointhook = _cell_breakpointhook


def _end_debugging(pdb_: Any) -> None:
    """The cell ended: no trace left on its thread, and Monarch's debugger forgets the rank
    (what Monarch does when an endpoint that stopped in it returns)."""
    sys.settrace(None)
    try:
        pdb_.clear_all_breaks()
        pdb_.end_debug_session()
    except Exception:  # the session was never started (the controller was unreachable)
        pass


class ProcAgent(Actor):
    def __init__(self) -> None:
        self._ns = _Namespace()
        self._mesh_rank: int | None = None
        self._mesh_point: dict[str, int] = {}  # its coordinates in the whole mesh, e.g. {"gpus": 1}
        self._running: _Cell | None = None
        self._last_error: BaseException | None = None
        self._debugger: _PostMortem | None = None
        self._log_file: str | None = None
        self._actor_id: Any = None
        self._debug_controller: Any = None
        _route_streams()
        _install_breakpointhook()

    def _rank(self) -> int:
        return self._mesh_rank if self._mesh_rank is not None else current_rank().rank

    @endpoint
    async def identity(self) -> ProcIdentity:
        # The controller asks this once over the whole mesh, so this rank is the global one;
        # later calls may arrive through a slice, where current_rank() is slice-local.
        if self._mesh_rank is None:
            here = current_rank()
            self._mesh_rank, self._mesh_point = here.rank, dict(here)
        return ProcIdentity(rank=self._mesh_rank, pid=os.getpid(), host=socket.gethostname(),
                            job_id=os.environ.get("SLURM_JOB_ID"), node=os.environ.get("SLURMD_NODENAME"))

    @endpoint
    async def capture_logs(self, log_dir: str, mesh: str) -> str:
        """Send this process's output to ``<log_dir>/<mesh>-rank<k>.log``; returns the path."""
        self._log_file = worker_logs.capture(log_dir, mesh, self._rank())
        _route_streams()
        return self._log_file

    @concurrent_endpoint
    async def run_cell(self, code: str, push: dict[str, Any] | None = None, cell: str | None = None) -> CellOutput:
        """Run notebook code here; ``cell`` names it in tracebacks and pdb ("In [12]": the
        controller's numbering, the same on every rank)."""
        rank = self._rank()
        running = self._running
        if running is not None:
            return CellOutput(rank=rank, error="RuntimeError: the previous cell is still running on this rank "
                              f"({time.monotonic() - running.started:.0f} s; it was interrupted but is blocked in "
                              "native code); wait for it, or `%monarch replace` the mesh")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[CellOutput] = loop.create_future()
        if self._actor_id is None:
            from . import seam

            self._actor_id = context().actor_instance.actor_id
            self._debug_controller = seam.actor_debug_controller()

        def work() -> None:
            out = self._execute(rank, code, push, cell or f"#{next(_cell_numbers)}")
            loop.call_soon_threadsafe(done.set_result, out)

        thread = threading.Thread(target=work, name=f"monarch_nb-cell-rank{rank}", daemon=True)
        thread.start()
        return await done

    def _execute(self, rank: int, code: str, push: dict[str, Any] | None, name: str) -> CellOutput:
        cell = self._running = _Cell(threading.get_ident(), rank=rank, point=dict(self._mesh_point),
                                     actor_id=self._actor_id, debug_controller=self._debug_controller)
        _cells[cell.thread_id] = cell
        ns = self._ns.values
        ns["rank"] = rank  # a cell runs in no actor of the user's: current_rank() has nothing to say there
        ns["point"] = dict(self._mesh_point)
        if push:
            ns.update(push)
        result = error = tb = None
        interrupted = False
        try:
            body, tail = _compile_cell(code, f"<monarch cell {name}>")
            exec(body, ns)
            if tail is not None:
                value = eval(tail, ns)
                if value is not None:
                    result = repr(value)
        except BaseException as exc:  # report SystemExit too, but keep the process alive
            interrupted = isinstance(exc, KeyboardInterrupt) and cell.interrupt.is_set()
            if interrupted:  # one line: where the cell was, not a traceback through the agent
                at = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<monarch cell")]
                where = f" at line {at[-1].lineno}: {linecache.getline(at[-1].filename, at[-1].lineno).strip()}" \
                    if at else ""
                error = f"KeyboardInterrupt: stopped by the notebook{where}"
            else:
                error = f"{type(exc).__name__}: {exc}"
                tb = "".join(traceback.format_exception(exc)[1:])
            if not interrupted:
                self._last_error, self._debugger = exc, None
        finally:
            if cell.pdb is not None:
                _end_debugging(cell.pdb)
            _cells.pop(cell.thread_id, None)
            self._running = None
        return CellOutput(rank=rank, stdout=cell.stdout.getvalue(), stderr=cell.stderr.getvalue(), result=result,
                          error=error, traceback=tb, interrupted=interrupted,
                          seconds=time.monotonic() - cell.started)

    @endpoint
    async def paused(self) -> Paused | None:
        """Where this rank's cell waits in Monarch's debugger (None: running, or no cell)."""
        cell = self._running
        return cell.paused if cell is not None else None

    @endpoint
    async def interrupt(self) -> bool:
        """Stop the running cell (True if one was running). The training loop is not touched."""
        cell = self._running
        if cell is None:
            return False
        cell.interrupt.set()
        _raise_in(cell.thread_id)
        return True

    @endpoint
    async def debug(self, command: str | None = None) -> DebugReply:
        """One post-mortem pdb command on the last exception a cell raised here; with no command,
        where it stopped (the innermost frame)."""
        rank = self._rank()
        if self._last_error is None or self._last_error.__traceback__ is None:
            raise LookupError(f"rank {rank} has no stored exception: no %%monarch cell raised here since the "
                              "mesh came up (or the last post-mortem ended with q)")
        if self._debugger is None:
            self._debugger = _PostMortem(self._last_error.__traceback__)
        dbg = self._debugger
        if command is None or not command.strip():
            head = f"{type(self._last_error).__name__}: {self._last_error}\n"
            return DebugReply(rank, head + dbg.where_now())
        output = dbg.run_command(command)
        if dbg.done:
            self._debugger, self._last_error = None, None
        return DebugReply(rank, output, done=dbg.done)
