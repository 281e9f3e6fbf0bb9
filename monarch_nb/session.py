"""The single controller: the one object a notebook kernel (or a plain script) holds.

A ``Session`` brings up Monarch process meshes by name, spawns real Monarch actor meshes
on them, keeps per-process health from Monarch supervision, calls endpoints with
deadlines, and shuts everything down without leaving a process behind. It never wraps
Monarch's own objects: ``spawn`` returns the real ``ActorMesh`` and ``up`` exposes the
real ``ProcMesh``, so Monarch's adverbs and slicing work unchanged. What Monarch lacks
for interactive use lives here: names, health, deadlines, failure events, replacement.

``Session`` is the facade users hold; each job is a part with its own state:

- ``mesh_lifecycle.MeshLifecycle`` owns which meshes exist: its lock guards the tables of
  meshes by name, actor mesh -> mesh, log directories, meshes torn down in the last minute,
  and the closed flag. It alone writes a handle's Monarch objects (proc mesh, agent, actors).
- ``failure_watch.FailureWatch`` owns the fault hook, the watcher thread and the
  ``on_failure`` listeners; its lock guards the listeners and the thread. The watcher reads
  the meshes under it (lock order: the watch's lock, then the lifecycle's; never the reverse).
- ``calls.TimeoutReports`` owns the per-endpoint timeout counters, under its own lock.
- Each ``MeshHandle``'s own lock guards its processes' state, reason and accounts (marked
  failed by the watch, stopped by the lifecycle).
Beyond the watcher's read of the live meshes, no lock is held while a listener runs or one
part calls another. The session itself holds only configuration, the event log and the
reaper, which it closes.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from . import _runtime, lifetime, seam, stacks as stacks_, worker_logs
from .calls import (TIMEOUT_EVENT_INTERVAL_S, CallWatch, DeadlineEndpoint, DeadlineMesh, MeshResult,
                    TimeoutReports, gather, raise_for_outcome, receive)
from .errors import CallInterrupted, CallTimeout, MonarchNbError, RemoteError, UnknownMeshError
from .failure_watch import (JOB_SETTLE_S, JOB_WATCH_INTERVAL_S, PID_WATCH_INTERVAL_S, FailureListener,
                            FailureWatch)
from .mesh_lifecycle import RECENT_MESH_MEMORY_S, MeshLifecycle, local_process_limit
from .meshes import ALIVE, ActorSpec, MeshHandle, ProcInfo, coords_of, pid_alive
from .reaper import Reaper
from .telemetry import EventStore
from .telemetry.events import CallTimedOut, MeshDown, MeshUp, WorkerExitReported, WorkerFailed

# The names above that this module does not use are re-exported: they were importable from here
# before the session was split into its parts, and stay so.
__all__ = ["DeadlineMesh", "FailureListener", "Session", "current_session", "local_process_limit", "runs_root"]

log = logging.getLogger(__name__)

_sessions: "list[weakref.ref[Session]]" = []


def runs_root(override: str | Path | None = None) -> Path:
    """Where run and session logs go: ``override``, else ``$MONARCH_NB_RUNS``, else ``./runs``."""
    return Path(override or os.environ.get("MONARCH_NB_RUNS") or "runs").resolve()


class Session:
    """Holds process meshes and actor meshes by name; see the module docstring.

    Args:
        default_timeout: seconds a call (``deadline``) or a mesh's start (``up``) may wait
            when not told otherwise.
        events: the event log to append to; default: a new ``events.jsonl`` in ``log_dir``.
        log_dir: this session's directory (event log, job logs, workers' ``logs/``); default:
            beside ``events`` when given, else ``<runs root>/sessions/<time>-<pid>-<id>``.
    """

    def __init__(self, *, default_timeout: float = 60.0, events: EventStore | None = None,
                 log_dir: str | Path | None = None) -> None:
        _runtime.install_fault_hook()
        self.default_timeout = default_timeout
        if events is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            log_dir = Path(log_dir) if log_dir else runs_root() / "sessions" / f"{stamp}-{os.getpid()}-{id(self):x}"
            events = EventStore(log_dir / "events.jsonl")
        self.events = events
        self._reaper = Reaper()
        self._timeouts = TimeoutReports(events)
        # Where this session's files go (SLURM job logs...): beside its event log.
        self._meshes = MeshLifecycle(
            events=events, reaper=self._reaper,
            log_dir=Path(log_dir) if log_dir else (events.path.parent if events.path else runs_root() / "sessions"),
            on_up=lambda: self._failures.start(), on_down=self._timeouts.forget)
        self._failures = FailureWatch(self._meshes, events)
        lifetime.on_exit(self.shutdown)
        _sessions.append(weakref.ref(self))

    @property
    def meshes(self) -> dict[str, MeshHandle]:
        """The meshes that are up, by name (read it; ``up``, ``down``, ``rename`` change it)."""
        return self._meshes.meshes

    @property
    def log_dir(self) -> Path:
        """This session's directory: job logs, and the workers' ``logs/`` unless ``up`` names another."""
        return self._meshes.log_dir

    @property
    def closed(self) -> bool:
        """True once ``shutdown`` began: no new meshes or actors."""
        return self._meshes.closed

    # ---- meshes -----------------------------------------------------------------------

    def up(self, name: str = "main", procs: int = 1, hosts: int = 1, *, job: Any = None,
           env: dict[str, str] | None = None, host_mesh: Any = None, timeout: float | None = None,
           force: bool = False, log_dir: str | Path | None = None) -> MeshHandle:
        """Start a proc mesh of ``procs`` processes on each of ``hosts`` hosts.

        Args:
            name: the mesh's name in this session (letters, digits, ``_``, ``.``).
            procs: processes per host (Monarch dim ``gpus``).
            hosts: hosts (Monarch dim ``hosts``).
            job: where the hosts come from. None or "local": this machine (``hosts > 1`` runs
                each host as a separate local process through Monarch's ``ProcessJob``);
                "process"; "slurm" or a :class:`monarch_nb.jobs.SlurmSpec` (a SLURM
                allocation of ``hosts`` nodes, released by ``down``); a
                :class:`monarch_nb.jobs.KubernetesSpec`.
            env: environment variables for the worker processes.
            host_mesh: hosts you allocated yourself (a Monarch ``HostMesh``); overrides ``job``.
            timeout: seconds to wait for the workers to answer (default: the session's).
            force: start more processes on this machine than ``local_process_limit()`` allows.
            log_dir: where the workers' output goes, one file per rank (default: ``logs/``
                beside the session's event log); it must be on a filesystem the hosts share.
        """
        return self._meshes.up(name, procs, hosts, job=job, env=env, host_mesh=host_mesh,
                               timeout=timeout or self.default_timeout, force=force, log_dir=log_dir)

    def mesh(self, name: str | None = None) -> MeshHandle:
        """The mesh called ``name``; with no name, the only mesh (or the one called 'main')."""
        return self._meshes.mesh(name)

    def spawn(self, name: str, actor_class: type, *args: Any, mesh: str | None = None, **kwargs: Any) -> Any:
        """Spawn ``actor_class`` on every process of a mesh; returns Monarch's real ActorMesh."""
        return self._meshes.spawn(name, actor_class, args, kwargs, mesh)

    def actors(self, name: str) -> Any:
        return self._meshes.actors(name)

    def rename(self, old: str, new: str) -> MeshHandle:
        """Call mesh ``old`` ``new`` from now on (a warm spare taking a failed group's place)."""
        return self._meshes.rename(old, new)

    # ---- seeing inside the workers ---------------------------------------------------------

    def log_dir_of(self, mesh: str) -> Path:
        """Where mesh ``mesh``'s workers write (also after it went down)."""
        return self._meshes.log_dir_of(mesh)

    def logs(self, mesh: str | None = None, rank: int | None = None, grep: str | None = None,
             tail: int = 40) -> "worker_logs.LogView":
        """The workers' log lines (of one mesh and rank, containing ``grep``), the same line of
        several ranks and the noise of a fault folded into one; the full text is in the files."""
        if mesh is None:
            dirs = self._meshes.log_dirs()
            if len(dirs) > 1:
                raise MonarchNbError(f"the meshes of this session write to {len(dirs)} directories; name one with "
                                     "--mesh NAME")
            return worker_logs.view(dirs[0] if dirs else self.log_dir / "logs", None, rank, grep, tail)
        return worker_logs.view(self.log_dir_of(mesh), mesh, rank, grep, tail)

    def stacks(self, mesh: str | None = None, ranks: list[int] | None = None) -> list["stacks_.Stack"]:
        """Every chosen rank's Python stack, read from outside the process (py-spy; faulthandler
        where py-spy cannot attach), so a rank that holds the GIL or sits in a collective
        answers too. Ranks named in ``ranks`` must exist and be alive; with no ``ranks``, dead
        ones are listed as such."""
        return stacks_.read_mesh(self.mesh(mesh), ranks)

    def interrupt(self, mesh: str | None = None, timeout: float = 5.0) -> list[int]:
        """Interrupt the ``%%monarch`` cell running on a mesh's workers (not a training loop);
        returns the ranks where one was running."""
        handle = self.mesh(mesh)
        result = self.deadline(handle.agent, timeout).interrupt.gather()
        return sorted(rank for rank, was_running in result.values.items() if was_running)

    def debug(self, mesh: str | None, rank: int, command: str | None = None, timeout: float = 30.0) -> Any:
        """One post-mortem pdb command (``p x``, ``up``, ``down``, ``l``, ``q``...) on the last
        exception a ``%%monarch`` cell raised on ``rank``; no command: where it stopped.
        Returns the agent's ``DebugReply``."""
        handle = self.mesh(mesh)
        if not isinstance(rank, int) or not 0 <= rank < handle.size:
            raise ValueError(f"rank {rank} is not in mesh {handle.name!r} (ranks 0..{handle.size - 1})")
        proc = handle.procs[rank]
        if proc.state != ALIVE:
            raise MonarchNbError(f"{handle.name} rank {rank} is {proc.state} ({proc.reason}); its exception died "
                                 "with it")
        try:
            return self.deadline(handle.agent.slice(**proc.coords), timeout).debug.call_one(command)
        except RemoteError as exc:  # the agent's LookupError: nothing stored on that rank
            lines = str(next(iter(exc.errors.values()))).strip().splitlines()
            raise MonarchNbError(lines[-1].removeprefix("LookupError: ") if lines else str(exc)) from None

    def replace(self, name: str, timeout: float | None = None) -> MeshHandle:
        """Stop a (failed) mesh and start a fresh one of the same shape, respawning its actors.

        Monarch cannot spawn onto a damaged proc mesh (it times out), so replacement is
        always a new proc mesh; actor meshes get the same names, class and arguments.
        """
        return self._meshes.replace(name, timeout or self.default_timeout)

    def down(self, name: str | None = None, timeout: float = 10.0, *, kill: bool = False) -> None:
        """Stop one mesh, or every mesh with no name. Idempotent; quick even for dead meshes.

        ``kill=True`` SIGKILLs the mesh's local processes first: a hung process (GIL held)
        cannot answer Monarch's polite stop, which would wait out ``timeout`` on it.
        """
        self._meshes.down(name, timeout, kill=kill)

    def down_many(self, names: list[str], timeout: float = 10.0, *, kill: bool = False) -> None:
        """Stop several meshes at once (each bounded by ``timeout``): N hung meshes cost one
        timeout, not N. Unknown names are skipped."""
        self._meshes.down_many(names, timeout, kill=kill)

    def views(self) -> dict[str, dict[str, str]]:
        """Per mesh, Monarch's own views of its job (dashboard, admin API) where enabled."""
        out = {}
        for handle in self.snapshot():
            urls = handle.allocation.views() if handle.allocation is not None else {}
            if urls:
                out[handle.name] = urls
        return out

    def status(self) -> list[MeshHandle]:
        """Every mesh, with health refreshed (pid checks catch deaths nobody has called into)."""
        return self._failures.check_now()

    def snapshot(self) -> list[MeshHandle]:
        """Every mesh as last known, without checking anything (what views draw: no side effects)."""
        return self._meshes.snapshot()

    # ---- calls with deadlines ----------------------------------------------------------

    def deadline(self, actors: Any, timeout: float | None = None, *, on_interrupt: Callable[[], None] | None = None,
                 watch: CallWatch | None = None,
                 while_waiting: Callable[[set[int]], None] | None = None) -> DeadlineMesh:
        """A view of ``actors`` whose endpoints take Monarch's adverbs but never wait past ``timeout``.

        ``session.deadline(trainers, 5).step.call(batch)`` returns a ``MeshResult`` or
        raises ``CallTimeout`` naming the ranks that did not answer. Ctrl-C ends the wait at
        once with ``CallInterrupted`` (``on_interrupt`` runs first, to stop the ranks too);
        ``watch`` (a ``CallWatch``) follows which ranks answered; ``while_waiting(pending ranks)``
        runs every second of a ``gather`` (its time is not counted against the deadline).
        """
        return DeadlineMesh(actors, self.default_timeout if timeout is None else timeout,
                            owner_of=self._meshes.owner_of, on_timeout=self._timeouts.record,
                            on_interrupt=on_interrupt, watch=watch, while_waiting=while_waiting)

    def owner_of(self, actors: Any) -> MeshHandle | None:
        """The mesh an actor mesh (or a slice of one) was spawned on, if this session spawned it."""
        return self._meshes.owner_of(actors)

    # ---- failures ----------------------------------------------------------------------

    def on_failure(self, listener: FailureListener) -> Callable[[], None]:
        """Call ``listener(WorkerFailed)`` on every newly failed rank, and ``listener(WorkerExitReported)``
        on Monarch's late account of a process already torn down (on Monarch's thread: be quick)."""
        return self._failures.on_failure(listener)

    def report_failure(self, mesh: str, rank: int | None, cause: str, action: str | None = None) -> bool:
        """A rank of ``mesh`` failed, found by the caller's own check (a training run's
        supervisor, ``%monarch kill``): marked failed and announced with ``cause``, unless it
        already was (one report per failed rank: the first detector's). False if not announced."""
        return self._failures.report_failure(mesh, rank, cause, action)

    # ---- lifecycle ---------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every mesh and the reaper; safe to call twice (it also runs at interpreter exit)."""
        if not self._meshes.close():
            return
        try:
            self.down()
        finally:
            self._failures.stop()
            self._reaper.close()
            self.events.close()
            lifetime.cancel(self.shutdown)

    close = shutdown

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        handles = self.snapshot()
        if not handles:
            return "<Session: no meshes are up>"
        lines = []
        for h in handles:
            dims = ", ".join(f"{k}={v}" for k, v in h.shape.items())
            lines.append(f"mesh {h.name} ({dims}) {h.state}")
            for p in h.procs:
                extra = f"  {p.reason}" if p.reason else ""
                job = f" job {p.job_id} node {p.node}" if p.job_id else ""
                lines.append(f"  rank {p.rank:<3} {p.label:<18} {p.state:<8} pid {p.pid} host {p.host}{job}{extra}")
        return "\n".join(lines)


def current_session(create: bool = True) -> Session | None:
    """The session the notebook magics use: the newest open one, created on first use."""
    live = [s for s in (ref() for ref in list(_sessions)) if s is not None and not s.closed]
    if live:
        return live[-1]
    return Session() if create else None
