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
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

from ..errors import MonarchNbError, RemoteError
from ..session import Session, current_session
from .args import HelpShown, MagicArgumentParser, dim_selector, key_value, positive_float, positive_int
from . import notices
from .html import cell_outputs_html, register_views, run_status_html
from .slicing import validate_slice
from .train_magics import TrainingCommands, add_training_commands

SUBCOMMANDS = ("up", "status", "down", "replace", "kill", "train", "inject", "schedule", "scale", "wait", "check",
               "stop", "dashboard")


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

    sub.add_parser("status", help="every mesh with per-process health (Session.status)")

    down = sub.add_parser("down", help="stop one mesh, or all (Session.down)")
    down.add_argument("name", nargs="?", default=None)

    replace = sub.add_parser("replace", help="stop a mesh and start a fresh one with the same actors (Session.replace)")
    replace.add_argument("name")

    kill = sub.add_parser("kill", help="send a signal to one worker process (a fault for demos and drills)")
    kill.add_argument("--mesh", default=None)
    kill.add_argument("--rank", type=int, required=True)
    kill.add_argument("--signal", default="KILL", choices=["KILL", "SEGV", "TERM"])
    add_training_commands(sub)
    return parser


def _cell_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(prog="%%monarch", description="Run the cell's code on every process of a mesh.")
    parser.add_argument("--mesh", default=None, help="mesh name (default: the only mesh, or 'main')")
    parser.add_argument("--on", type=dim_selector, action="append", default=[], metavar="DIM=INDEX",
                        help="slice by a named dim: hosts=1, gpus=0:2 (repeatable)")
    parser.add_argument("--timeout", type=positive_float, default=None, help="seconds before silent ranks are reported")
    parser.add_argument("--ignore-errors", action="store_true", help="do not raise when some ranks raised")
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
        if self._session is None or self._session._closed:
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
        except MonarchNbError as exc:
            if isinstance(exc, RemoteError):
                raise
            parser = self._cell if cell is not None else self._line
            raise UsageError(f"{exc}\n\n{parser.format_usage()}") from None
        except ValueError as exc:
            raise UsageError(f"{exc}\n\n{self._line.format_usage()}") from None

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
        if proc.host != socket.gethostname() or not proc.pid:
            raise UsageError(f"rank {args.rank} of {handle.name!r} runs on {proc.host}; kill only reaches local workers")
        os.kill(proc.pid, getattr(signal, f"SIG{args.signal}"))
        print(f"sent SIG{args.signal} to mesh {handle.name!r} rank {args.rank} (pid {proc.pid})")

    def _cmd_train(self, args: Any) -> None:
        self.training.train(args, self.session, self.shell)

    def _cmd_inject(self, args: Any) -> None:
        self.training.inject(args)

    def _cmd_schedule(self, args: Any) -> None:
        self.training.schedule(args)

    def _cmd_scale(self, args: Any) -> None:
        self.training.scale(args)

    def _cmd_wait(self, args: Any) -> None:
        self.training.wait(args)

    def _cmd_check(self, args: Any) -> None:
        self.training.check(args)

    def _cmd_stop(self, args: Any) -> None:
        self.training.stop()

    def _cmd_dashboard(self, args: Any) -> None:
        display(self.training.dashboard())

    # ---- cell ----------------------------------------------------------------------------

    def _run_cell(self, args: Any, code: str) -> None:
        handle = self.session.mesh(args.mesh)
        selectors = validate_slice(handle.name, handle.shape, dict(args.on))
        agent = handle.agent.slice(**selectors) if selectors else handle.agent
        view = self.session.deadline(agent, args.timeout)
        result = view.run_cell.gather(code)
        # Key by the mesh's global rank (the agent may have been reached through a slice).
        outputs = [dataclasses.replace(out, rank=rank) for rank, out in result.values.items()]
        for rank, err in result.errors.items():  # the agent itself failed (not the user's code)
            from ..agent import CellOutput

            outputs.append(CellOutput(rank=rank, error=f"{type(err).__name__}: {err}"))
        coords = {p.rank: p.label for p in handle.procs}
        display({"text/plain": _cell_text(outputs, result.missing, coords),
                 "text/html": cell_outputs_html(outputs, result.missing, coords)}, raw=True)
        failed = sorted([o.rank for o in outputs if o.error] + result.missing)
        if failed and not args.ignore_errors:
            errors = {o.rank: RuntimeError(o.error) for o in outputs if o.error}
            errors.update({r: TimeoutError("no answer") for r in result.missing})
            raise RemoteError(f"%%monarch on mesh {handle.name!r}", errors,
                              {o.rank: o.result for o in outputs if not o.error})


def _job_of(args: Any) -> Any:
    """The ``job=`` of ``Session.up`` for the SLURM flags; they need --slurm."""
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
