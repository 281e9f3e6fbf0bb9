"""``%monarch`` and ``%%monarch``: one-line moves over the controller API.

Magics only parse arguments and call the ``Session`` (or the fault-tolerant run); every
one of them has a one-call Python equivalent, named in its help. Wrong arguments raise
IPython's ``UsageError`` carrying the usage text.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

from .. import seam
from ..calls import CallWatch, gather
from ..errors import CallInterrupted, Interrupted, MonarchNbError, RemoteError, format_ranks
from ..live_debug import LiveDebugger, drive
from ..session import Session, current_session
from .args import (
    HelpShown,
    MagicArgumentParser,
    dim_selector,
    key_value,
    non_negative_int,
    positive_float,
    positive_int,
)
from . import notices
from .html import MONARCH_VIEWS_HINT, cell_outputs_html, register_views, run_status_html, views_html
from .progress import Progress, call_line
from .slicing import validate_slice
from .train_magics import TrainingCommands, add_training_commands

KILL_WAIT_S = 5.0  # how long %monarch kill waits for the signalled process to exit

SUBCOMMANDS = ("up", "status", "down", "replace", "kill", "logs", "stacks", "debug", "train", "inject", "schedule",
               "scale", "drain", "wait", "check", "restart", "stop", "dashboard", "attach", "runs")


def _line_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(prog="%monarch", description="Drive Monarch meshes from the notebook.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    sub._parser_class = MagicArgumentParser  # subcommand errors raise UsageError too

    up = sub.add_parser("up", help="start a process mesh (Session.up)")
    up.add_argument("--procs", type=positive_int, default=1, help="processes per host (dim 'gpus')")
    up.add_argument("--hosts", type=positive_int, default=1, help="hosts; >1 uses Monarch's ProcessJob locally")
    up.add_argument("--name", default="main", help="mesh name (default: main)")
    up.add_argument("--env", type=key_value, action="append", default=[], metavar="NAME=VALUE",
                    help="environment variable for the workers (repeatable)")
    up.add_argument("--timeout", type=positive_float, default=None, help="seconds to wait for the workers")
    up.add_argument("--force", action="store_true", help="start more local processes than the machine's limit")
    up.add_argument("--slurm", action="store_true", help="hosts from a SLURM allocation (released by down)")
    up.add_argument("--partition", default=None, help="with --slurm: SLURM partition")
    up.add_argument("--time", default=None, dest="time_limit", metavar="HH:MM:SS", help="with --slurm: time limit")
    up.add_argument("--k8s", action="store_true",
                    help="hosts on Kubernetes pods, one pod set per mesh (deleted by down); without --image/"
                         "--kubeconfig/--context: the one-machine cluster of ./run.sh k8s up")
    up.add_argument("--namespace", default=None, help="with --k8s: namespace (default monarch)")
    up.add_argument("--image", default=None, help="with --k8s: worker image (default: the local cluster's)")
    up.add_argument("--kubeconfig", default=None, help="with --k8s: kubeconfig path (default $KUBECONFIG or ~/.kube/config)")
    up.add_argument("--context", default=None, help="with --k8s: kubeconfig context (default monarch-nb)")

    sub.add_parser("status", help="every mesh with per-process health (Session.status)")

    down = sub.add_parser("down", help="stop one mesh, or all (Session.down)")
    down.add_argument("name", nargs="?", default=None)

    replace = sub.add_parser("replace", help="stop a mesh and start a fresh one with the same actors (Session.replace)")
    replace.add_argument("name")

    kill = sub.add_parser("kill", help="send a signal to one worker process (a fault for demos and drills)")
    kill.add_argument("--mesh", default=None)
    kill.add_argument("--rank", type=int, required=True)
    kill.add_argument("--signal", default="KILL", choices=["KILL", "SEGV", "TERM"])

    logs = sub.add_parser("logs", help="the workers' output, the same line of many ranks once (Session.logs)",
                          description="Every worker's stdout, stderr and logging, read from its log file (one per "
                                      "mesh and rank). The same line from several ranks is shown once with a "
                                      "count; the noise of a fault (gloo connection-closed tracebacks, flight "
                                      "recorder notices) becomes one line. The full text stays in the files.")
    _add_target(logs)
    logs.add_argument("--grep", default=None, metavar="TEXT", help="only lines containing TEXT")
    logs.add_argument("--tail", type=positive_int, default=40, metavar="N", help="the last N lines (default 40)")

    stacks = sub.add_parser("stacks", help="every rank's Python stack, identical ones once (Session.stacks)",
                            description="Python stacks read from outside the processes with py-spy (faulthandler "
                                        "where py-spy may not attach): works on a rank that holds the GIL or waits "
                                        "in a collective.")
    _add_target(stacks)

    debug = sub.add_parser("debug", help="post-mortem pdb on one rank (--rank K), or live breakpoints (--live)",
                           description="--rank K: pdb on the exception the last %%monarch cell raised on rank K "
                                       "(p, pp, up, down, l, ll, w, args, q). --live: Monarch's own debugger, where "
                                       "ranks that called breakpoint() wait (list, attach ACTOR RANK, pdb commands, "
                                       "detach, cast ACTOR ranks(...) CMD, continue, quit). With COMMANDs they run in "
                                       "order (headless notebooks); without, commands come from the notebook's input "
                                       "box until q (post-mortem) or quit (live).")
    debug.add_argument("--rank", type=non_negative_int, default=None)
    debug.add_argument("--mesh", default=None)
    debug.add_argument("--live", action="store_true", help="Monarch's debugger on live breakpoints")
    debug.add_argument("commands", nargs="*", metavar="COMMAND", help="pdb commands, e.g. 'p x' up l q")
    add_training_commands(sub)
    return parser


def _add_target(parser: Any) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--mesh", default=None, help="a mesh of the session")
    where.add_argument("--replica", type=non_negative_int, default=None, metavar="R",
                       help="replica group R of the fault-tolerant run")
    parser.add_argument("--rank", type=non_negative_int, default=None, metavar="K", help="only rank K")


def _cell_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(prog="%%monarch", description="Run the cell's code on every process of a mesh.")
    parser.add_argument("--mesh", default=None, help="mesh name (default: the only mesh, or 'main')")
    parser.add_argument("--on", type=dim_selector, action="append", default=[], metavar="DIM=INDEX",
                        help="slice by a named dim: hosts=1, gpus=0:2 (repeatable)")
    parser.add_argument("--timeout", type=positive_float, default=None, help="seconds before silent ranks are reported")
    parser.add_argument("--ignore-errors", action="store_true", help="do not raise when some ranks raised")
    parser.add_argument("--debug", nargs="+", default=None, metavar="COMMAND",
                        help="Monarch debugger commands for ranks that stop at breakpoint() (headless notebooks), "
                             "e.g. list 'attach AGENT 0' n c; without, they come from the notebook's input box")
    return parser


@magics_class
class MonarchMagics(Magics):
    def __init__(self, shell: Any, session: Session | None = None) -> None:
        super().__init__(shell)
        self._session = session
        self._line = _line_parser()
        self._cell = _cell_parser()
        self.training = TrainingCommands()
        if shell is not None:
            register_views(shell)

    @property
    def session(self) -> Session:
        if self._session is None or self._session.closed:
            self._session = current_session()
            notices.watch_session(self._session)
        return self._session

    @line_cell_magic
    def monarch(self, line: str, cell: str | None = None) -> Any:
        """%monarch {up,status,down,replace,kill} ... | %%monarch [--mesh M] [--on DIM=I] [--timeout S]"""
        try:
            if cell is not None:
                return self._run_cell(self._cell.parse_line(line), cell)
            args = self._line.parse_line(line)
            if args.command is None:
                raise UsageError("%monarch needs a command\n\n" + self._line.format_help())
            return getattr(self, f"_cmd_{args.command}")(args)
        except HelpShown as shown:
            print(shown.args[0])
        except (Interrupted, CallInterrupted):
            raise
        except KeyboardInterrupt:
            what = "%%monarch" if cell is not None else f"%monarch {line.strip()}"
            raise Interrupted(f"{what}: stopped waiting; nothing on the workers was stopped") from None
        except MonarchNbError as exc:
            if isinstance(exc, RemoteError):
                raise
            usage = self._cell.format_usage() if cell is not None else self._line.usage_for(line)
            raise UsageError(f"{exc}\n\n{usage}") from None
        except ValueError as exc:
            raise UsageError(f"{exc}\n\n{self._line.usage_for(line)}") from None

    # ---- line commands -----------------------------------------------------------------

    def _cmd_up(self, args: Any) -> Any:
        handle = self.session.up(args.name, procs=args.procs, hosts=args.hosts, job=_job_of(args),
                                 env=dict(args.env) or None, timeout=args.timeout, force=args.force)
        display(handle)
        return None

    def _cmd_status(self, args: Any) -> None:
        display(self.session)
        run = self.training.run
        if run is not None and not run.stopped:
            display(HTML(run_status_html(run.run_id, run.status())))
        lighthouse = run.lighthouse.address if run is not None and not run.stopped and run.lighthouse else None
        views = self.session.views()
        # The hint is for meshes of a Monarch job without its views; local meshes have none to enable.
        hint = any(h.allocation is not None and h.name not in views for h in self.session.snapshot())
        if lighthouse or views or hint:
            display({"text/plain": _views_text(lighthouse, views, hint),
                     "text/html": views_html(lighthouse, views, hint)}, raw=True)

    def _cmd_logs(self, args: Any) -> None:
        run = self.training.run
        if args.replica is not None:
            view = self.training.current().logs(args.replica, args.rank, args.grep, args.tail)
        elif args.mesh is None and run is not None:
            view = run.logs(None, args.rank, args.grep, args.tail)
        else:
            view = self.session.logs(args.mesh, args.rank, args.grep, args.tail)
        print(view.text())

    def _cmd_stacks(self, args: Any) -> None:
        from ..stacks import grouped

        ranks = [args.rank] if args.rank is not None else None
        if args.replica is not None:
            stacks = self.training.current().stacks(args.replica, ranks)
        else:
            stacks = self.session.stacks(args.mesh, ranks)
        for labels, stack in grouped(stacks):
            head = ", ".join(labels)
            how = f" (pid {stack.pid}, {stack.how})" if stack.how != "unavailable" else ""
            print(f"=== {head}{how}" + (f"  [{len(labels)} ranks, same stack]" if len(labels) > 1 else ""))
            print(stack.text.rstrip("\n"))

    def _cmd_debug(self, args: Any) -> None:
        from IPython.core.error import StdinNotImplementedError

        if args.live:
            if args.rank is not None:
                raise UsageError("--live drives every stopped rank (attach ACTOR RANK picks one); drop --rank")
            self._live_debug(args.commands or None)
            return
        if args.rank is None:
            raise UsageError("give --rank K (post-mortem of the exception a %%monarch cell raised there), "
                             "or --live (ranks stopped at breakpoint())")
        reply = self.session.debug(args.mesh, args.rank)
        print(f"post-mortem of rank {args.rank}: " + reply.output.rstrip("\n"))
        for command in args.commands:
            print(f"(Pdb) {command}")
            reply = self.session.debug(args.mesh, args.rank, command)
            if reply.output.strip():
                print(reply.output.rstrip("\n"))
            if reply.done:
                return
        if args.commands:
            return
        while True:
            try:
                command = input("(Pdb) ")
            except StdinNotImplementedError:
                print("this frontend cannot read input; give the commands on the line, e.g. "
                      f"%monarch debug --rank {args.rank} 'p x' up l q")
                return
            except EOFError:
                return
            reply = self.session.debug(args.mesh, args.rank, command)
            if reply.output.strip():
                print(reply.output.rstrip("\n"))
            if reply.done:
                return

    def _live_debug(self, commands: list[str] | None, done: Callable[[], bool] = lambda: False) -> bool:
        """Monarch's debugger, fed ``commands`` or the notebook's input box; False if the user
        quit (or there is no input box) while ranks may still be stopped."""
        from IPython.core.error import StdinNotImplementedError

        with LiveDebugger() as dbg:
            print(dbg.send("list").rstrip("\n"))  # who waits where, in Monarch's own table
            try:
                return drive(dbg, commands, input, print, done)
            except StdinNotImplementedError:
                print("this frontend has no input box: give the debugger's commands on the line, e.g. "
                      "%monarch debug --live 'attach ACTOR 0' n 'p x' c   (or %%monarch --debug ... for a cell)")
                return False

    def _cmd_down(self, args: Any) -> None:
        names = [args.name] if args.name else list(self.session.meshes)
        self.session.down(args.name)
        print(f"stopped: {', '.join(names) if names else 'nothing was up'}")

    def _cmd_replace(self, args: Any) -> None:
        display(self.session.replace(args.name))

    def _cmd_kill(self, args: Any) -> None:
        handle = self.session.mesh(args.mesh)
        if not 0 <= args.rank < handle.size:
            raise UsageError(f"rank {args.rank} is outside mesh {handle.name!r} (ranks 0..{handle.size - 1})")
        proc = handle.procs[args.rank]
        if not (handle.local or proc.host == socket.gethostname()) or not proc.pid:
            raise UsageError(f"rank {args.rank} of {handle.name!r} runs on {proc.host}; kill only reaches local workers")
        cause = f"SIG{args.signal} sent by %monarch kill (pid {proc.pid} is gone)"
        proc.expected = cause  # whichever check finds the pid gone first gives this cause
        os.kill(proc.pid, getattr(signal, f"SIG{args.signal}"))
        print(f"sent SIG{args.signal} to mesh {handle.name!r} rank {args.rank} (pid {proc.pid})")
        # The status that follows must show it: once the pid is gone the rank is reported failed
        # with its cause, without waiting for the session's watcher (a quarter second).
        if _wait_gone(proc.pid, KILL_WAIT_S):
            self.session.report_failure(handle.name, args.rank, cause)

    def _cmd_train(self, args: Any) -> None:
        self.training.train(args, self.session, self.shell)

    def _cmd_inject(self, args: Any) -> None:
        self.training.inject(args)

    def _cmd_schedule(self, args: Any) -> None:
        self.training.schedule(args)

    def _cmd_scale(self, args: Any) -> None:
        self.training.scale(args)

    def _cmd_drain(self, args: Any) -> None:
        self.training.drain(args)

    def _cmd_wait(self, args: Any) -> None:
        self.training.wait(args)

    def _cmd_check(self, args: Any) -> None:
        self.training.check(args)

    def _cmd_restart(self, args: Any) -> None:
        self.training.restart(args)

    def _cmd_stop(self, args: Any) -> None:
        self.training.stop()

    def _cmd_dashboard(self, args: Any) -> None:
        display(self.training.dashboard())

    def _cmd_attach(self, args: Any) -> None:
        self.training.attach(args, self.shell)

    def _cmd_runs(self, args: Any) -> None:
        self.training.runs()

    # ---- cell ----------------------------------------------------------------------------

    def _run_cell(self, args: Any, code: str) -> None:
        handle = self.session.mesh(args.mesh)
        selectors = validate_slice(handle.name, handle.shape, dict(args.on))
        agent = handle.agent.slice(**selectors) if selectors else handle.agent
        watch = CallWatch()
        stops = _CellBreakpoints(self, agent, args.debug)
        # Ctrl-C: the cell stops on the workers too (the agent's interrupt), the mesh stays up.
        view = self.session.deadline(agent, args.timeout, on_interrupt=lambda: agent.interrupt.broadcast(),
                                     watch=watch, while_waiting=stops.look)
        try:
            with Progress(lambda: call_line(watch)):
                result = view.run_cell.gather(code, None, _cell_name(self.shell))
        except CallInterrupted as exc:
            self._show_cell(handle, exc.result)
            stopped = sorted(r for r, out in exc.result.values.items() if out.interrupted)
            late = sorted(set(exc.result.missing) - set(handle.failed_ranks))
            still = (f"; ranks {format_ranks(late)} did not stop within 1 s (blocked in native code?) and finish "
                     "the cell on their own") if late else ""
            raise Interrupted(f"%%monarch on mesh {handle.name!r} interrupted: the cell stopped on ranks "
                              f"{format_ranks(stopped)}{still}; the mesh is up for the next cell") from None
        outputs = self._show_cell(handle, result)
        failed = sorted([o.rank for o in outputs if o.error] + result.missing)
        if failed and not args.ignore_errors:
            errors = {o.rank: RuntimeError(o.error) for o in outputs if o.error}
            errors.update({r: TimeoutError("no answer") for r in result.missing})
            raise RemoteError(f"%%monarch on mesh {handle.name!r}", errors,
                              {o.rank: o.result for o in outputs if not o.error})


    def _show_cell(self, handle: Any, result: Any) -> list:
        """Each rank's output of a cell (keyed by the mesh's global rank: the agent may have
        been reached through a slice); returns the outputs."""
        from ..agent import CellOutput

        outputs = [dataclasses.replace(out, rank=rank) for rank, out in result.values.items()]
        for rank, err in result.errors.items():  # the agent itself failed (not the user's code)
            outputs.append(CellOutput(rank=rank, error=f"{type(err).__name__}: {err}"))
        coords = {p.rank: p.label for p in handle.procs}
        display({"text/plain": _cell_text(outputs, result.missing, coords),
                 "text/html": cell_outputs_html(outputs, result.missing, coords)}, raw=True)
        return outputs


class _CellBreakpoints:
    """While a cell runs: when every rank it waits on is stopped at ``breakpoint()``, say where
    and hand the notebook Monarch's debugger (``--debug`` commands, else the input box) until
    they run on; the cell then goes on waiting for them."""

    def __init__(self, magics: "MonarchMagics", agent: Any, commands: list[str] | None) -> None:
        self.magics, self.agent, self.commands = magics, agent, commands
        self.given_up = False  # quit, or no way to give commands: wait like any cell

    def stopped(self, pending: set[int]) -> dict[int, Any]:
        """Ranks of ``pending`` (global) stopped in the debugger. Asked with a short deadline
        and not recorded as a timeout: a cell that holds the GIL cannot answer, and is simply
        not stopped at a breakpoint. A Ctrl-C meanwhile is the cell's interrupt."""
        ranks = seam.actor_mesh_ranks(self.agent)
        try:
            result = gather(self.agent.paused, "paused", (), {}, list(range(len(ranks))), 1.0, size=len(ranks))
        except CallInterrupted:
            raise KeyboardInterrupt from None
        return {ranks[i]: p for i, p in result.values.items() if p is not None and ranks[i] in pending}

    def look(self, pending: set[int]) -> None:
        if self.given_up or not pending:
            return
        stopped = self.stopped(pending)
        if set(stopped) != pending:
            return
        print(f"ranks {format_ranks(sorted(stopped))} stopped at breakpoint():")
        for rank, at in sorted(stopped.items()):
            print(f"  rank {rank} ({'attach ' + at.actor + ' ' + str(rank) if at.actor else ''}): {at.where}: {at.line}")
        commands, self.commands = self.commands, None  # given commands are used once
        ok = self.magics._live_debug(commands, done=lambda: not self.stopped(pending))
        if not ok or (commands is not None and self.stopped(pending)):
            self.given_up = True
            print(f"ranks {format_ranks(sorted(pending))} still wait in the debugger; this cell waits for them "
                  "(interrupt it to stop them)")


def _cell_name(shell: Any) -> str | None:
    """``In [12]``: what tracebacks and pdb call the cell's code, the same on every rank."""
    count = getattr(shell, "execution_count", None)
    return f"In [{count}]" if isinstance(count, int) else None


def _views_text(lighthouse: str | None, views: dict[str, dict[str, str]], hint: bool = False) -> str:
    lines = [f"torchft Lighthouse status page: {lighthouse}"] if lighthouse else []
    for mesh, urls in views.items():
        lines += [f"mesh {mesh}: Monarch {kind} {url}" for kind, url in urls.items()]
    if hint:
        lines.append(MONARCH_VIEWS_HINT)
    return "\n".join(lines)


def _job_of(args: Any) -> Any:
    """The ``job=`` of ``Session.up`` for the SLURM flags (they need --slurm) or the Kubernetes
    ones (they need --k8s)."""
    k8s_flags = [f"--{name}" for name in ("namespace", "image", "kubeconfig", "context") if getattr(args, name)]
    if args.k8s:
        if args.slurm:
            raise ValueError("--k8s and --slurm: give one")
        from ..jobs import local_k8s

        return local_k8s.spec_for(namespace=args.namespace, image=args.image, kubeconfig=args.kubeconfig,
                                  context=args.context)
    if k8s_flags:
        raise ValueError(f"{', '.join(k8s_flags)} need --k8s")
    if not args.slurm:
        if args.partition or args.time_limit:
            raise ValueError("--partition and --time need --slurm")
        return None
    from ..jobs.slurm import SlurmSpec

    return SlurmSpec(partition=args.partition, time_limit=args.time_limit)


def _cell_text(outputs: list, missing: list[int], coords: dict[int, str]) -> str:
    lines = []
    for out in sorted(outputs, key=lambda o: o.rank):
        lines.append(f"[rank {out.rank}] {coords.get(out.rank, '')}")
        for text in (out.stdout, out.stderr):
            if text:
                lines.append(text.rstrip("\n"))
        if out.result is not None:
            lines.append(f"Out: {out.result}")
        if out.error:
            lines.append((out.traceback or out.error).rstrip("\n"))
    for rank in missing:
        lines.append(f"[rank {rank}] no answer (failed or past the deadline)")
    return "\n".join(lines)


def _wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (or is a zombie) within ``timeout`` seconds."""
    import psutil

    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        from ..meshes import pid_alive

        return not pid_alive(pid)
    return True
