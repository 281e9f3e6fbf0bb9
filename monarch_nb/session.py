"""The single controller: the one object a notebook kernel (or a plain script) holds.

A ``Session`` brings up Monarch process meshes by name, spawns real Monarch actor meshes
on them, keeps per-process health from Monarch supervision, calls endpoints with
deadlines, and shuts everything down without leaving a process behind. It never wraps
Monarch's own objects: ``spawn`` returns the real ``ActorMesh`` and ``up`` exposes the
real ``ProcMesh``, so Monarch's adverbs and slicing work unchanged. What Monarch lacks
for interactive use lives here: names, health, deadlines, failure events, replacement.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from . import _runtime, lifetime, seam, stacks as stacks_, worker_logs
from .calls import CallWatch, MeshResult, gather, raise_for_outcome, receive
from .errors import CallInterrupted, CallTimeout, MonarchNbError, RemoteError, UnknownMeshError
from .meshes import ALIVE, ActorSpec, MeshHandle, ProcInfo, coords_of, pid_alive
from .reaper import Reaper
from .telemetry import EventStore
from .telemetry.events import CallTimedOut, MeshDown, MeshUp, WorkerExitReported, WorkerFailed

log = logging.getLogger(__name__)

FailureListener = Callable[["WorkerFailed | WorkerExitReported"], None]
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_AGENT_PREFIX = "_nb_agent_"
JOB_WATCH_INTERVAL_S = 1.0
PID_WATCH_INTERVAL_S = 0.25
JOB_SETTLE_S = 2.0  # how long a COMPLETING job is given to show its final state (CANCELLED, NODE_FAIL, ...)
TIMEOUT_EVENT_INTERVAL_S = 10.0
RECENT_MESH_MEMORY_S = 60.0
_sessions: "list[weakref.ref[Session]]" = []


def runs_root(override: str | Path | None = None) -> Path:
    """Where run and session logs go: ``override``, else ``$MONARCH_NB_RUNS``, else ``./runs``."""
    return Path(override or os.environ.get("MONARCH_NB_RUNS") or "runs").resolve()


def local_process_limit() -> int:
    """The most worker processes one mesh may start on this machine without ``force``:
    ``$MONARCH_NB_MAX_LOCAL_PROCS``, else 8 per CPU (at least 16)."""
    configured = os.environ.get("MONARCH_NB_MAX_LOCAL_PROCS")
    if configured and configured.isdigit():
        return int(configured)
    return max(16, 8 * (os.cpu_count() or 1))


def _apply_env(env: dict[str, str]) -> None:
    """Bootstrap hook run in each new worker process before any actor starts."""
    os.environ.update(env)


def _parse_failure(failure: Any) -> tuple[str, list[int], str]:
    """(unique actor mesh name, crashed ranks, a one-line reason) of a Monarch ``MeshFailure``."""
    name, ranks, reason = seam.failure_details(failure)
    if "Traceback" in reason:
        # An exception escaped the actor: the traceback's "SomeError: message" line says what.
        lines = [ln.strip() for ln in reason.splitlines()]
        raised = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
        reason = "exception escaped the actor: " + (raised[-1] if raised else "see the worker log")
    if reason.endswith(")") and reason.count(")") > reason.count("("):
        reason = reason[:-1]  # the closing parenthesis of "MeshFailure(...)"
    reason = " ".join(reason.split())
    return name, ranks, reason[:500]


class Session:
    """Holds process meshes and actor meshes by name; see the module docstring."""

    def __init__(self, *, default_timeout: float = 60.0, events: EventStore | None = None,
                 log_dir: str | Path | None = None) -> None:
        _runtime.install_fault_hook()
        self.default_timeout = default_timeout
        if events is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            log_dir = Path(log_dir) if log_dir else runs_root() / "sessions" / f"{stamp}-{os.getpid()}-{id(self):x}"
            events = EventStore(log_dir / "events.jsonl")
        self.events = events
        # Where this session's files go (SLURM job logs...): beside its event log.
        self.log_dir = Path(log_dir) if log_dir else (events.path.parent if events.path else runs_root() / "sessions")
        self.meshes: dict[str, MeshHandle] = {}
        self._actor_owner: dict[str, str] = {}
        self._listeners: list[FailureListener] = []
        self._lock = threading.RLock()
        self._reaper = Reaper()
        self._closed = False
        self._watcher: threading.Thread | None = None
        self._timeouts: dict[tuple[str, str], tuple[float, int]] = {}  # (mesh, endpoint) -> (last event, since)
        self._recent: dict[str, tuple[MeshHandle, float]] = {}  # unique actor mesh name -> (mesh, torn down at)
        self._log_dirs: dict[str, Path] = {}  # mesh name -> where its workers' logs are (kept after down)
        self._watch_stop = threading.Event()
        self._remove_hook = _runtime.add_fault_listener(self._on_fault)
        lifetime.on_exit(self.shutdown)
        _sessions.append(weakref.ref(self))

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
        self._check_open()
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"mesh name {name!r} is not valid: use letters, digits, '_' or '.', not starting with a digit")
        if not isinstance(procs, int) or procs < 1:
            raise ValueError(f"procs must be a positive integer, got {procs!r}")
        if not isinstance(hosts, int) or hosts < 1:
            raise ValueError(f"hosts must be a positive integer, got {hosts!r}")
        on_this_machine = host_mesh is None and job in (None, "local", "process")
        limit = local_process_limit()
        if on_this_machine and procs * hosts > limit and not force:
            raise ValueError(f"procs: {procs} x {hosts} host(s) = {procs * hosts} processes on this machine "
                             f"({os.cpu_count()} CPUs) is over the limit of {limit}; pass force=True "
                             "(%monarch up --force) to start them anyway, or set MONARCH_NB_MAX_LOCAL_PROCS")
        with self._lock:
            if name in self.meshes:
                raise MonarchNbError(f"a mesh named {name!r} is already up; stop it with `%monarch down {name}` "
                                     f"or replace it with `%monarch replace {name}`")
        from monarch.actor import this_host

        from . import jobs

        started = time.monotonic()
        allocation = None
        if host_mesh is None:
            allocation = jobs.allocate(job, hosts=hosts, procs=procs, name=name, log_dir=self.log_dir, env=env)
            if allocation is not None:
                allocation.on_submit = lambda commands: self._reaper.guard([], commands=commands)
            host_mesh = allocation.start() if allocation is not None else this_host()
        local = allocation is None or allocation.local
        # Hosts of this machine talk over loopback (gloo would pick an interface by hostname).
        worker_env = {**(_runtime.LOOPBACK_ENV if local else {}), **(env or {})}
        handle = MeshHandle(name=name, shape={}, proc_mesh=None, job=job, allocation=allocation, env=env,
                            log_dir=Path(log_dir).resolve() if log_dir else self.log_dir / "logs", local=local)
        with self._lock:
            self.meshes[name] = handle
            self._log_dirs[name] = handle.log_dir
        try:
            bootstrap = functools.partial(_apply_env, worker_env) if worker_env else None
            handle.proc_mesh = host_mesh.spawn_procs(per_host={"gpus": procs}, bootstrap=bootstrap, name=name)
            extent = handle.proc_mesh.extent
            handle.shape = {k: int(v) for k, v in zip(extent.labels, extent.sizes)}
            handle.procs = [ProcInfo(rank=r, coords=coords_of(r, handle.shape)) for r in range(handle.size)]
            from .agent import ProcAgent

            handle.agent = self._spawn_on(handle, _AGENT_PREFIX + name, ProcAgent, (), {})
            wait = timeout or self.default_timeout
            ids = raise_for_outcome(gather(handle.agent.identity, f"{name}.identity", (), {},
                                           list(range(handle.size)), wait, size=handle.size), wait)
            for rank, ident in ids:
                proc = handle.procs[rank]
                proc.pid, proc.host, proc.job_id, proc.node = ident.pid, ident.host, ident.job_id, ident.node
            self._capture_logs(handle, wait)
        except BaseException:
            self.down(name, kill=True)
            raise
        if local:
            self._reaper.guard([p.pid for p in handle.procs if p.pid])
        if allocation is not None:
            self._reaper.guard(allocation.pids(), commands=allocation.reaper_commands())
        self._watch()
        self.events.append(MeshUp(mesh=name, shape=handle.shape, seconds=time.monotonic() - started))
        return handle

    def mesh(self, name: str | None = None) -> MeshHandle:
        """The mesh called ``name``; with no name, the only mesh (or the one called 'main')."""
        with self._lock:
            if name is None:
                if len(self.meshes) == 1:
                    return next(iter(self.meshes.values()))
                if "main" in self.meshes:
                    return self.meshes["main"]
                if not self.meshes:
                    raise UnknownMeshError("main", [])
                raise MonarchNbError(f"several meshes are up ({', '.join(sorted(self.meshes))}); name one with --mesh NAME")
            if name not in self.meshes:
                raise UnknownMeshError(name, list(self.meshes))
            return self.meshes[name]

    def spawn(self, name: str, actor_class: type, *args: Any, mesh: str | None = None, **kwargs: Any) -> Any:
        """Spawn ``actor_class`` on every process of a mesh; returns Monarch's real ActorMesh."""
        self._check_open()
        if not isinstance(name, str) or not _NAME_RE.match(name) or name.startswith(_AGENT_PREFIX):
            raise ValueError(f"actor name {name!r} is not valid: use letters, digits, '_' or '.'")
        handle = self.mesh(mesh)
        with self._lock:
            if name in self._actor_owner:
                raise MonarchNbError(f"an actor mesh named {name!r} already exists on mesh "
                                     f"{self._actor_owner[name]!r}; pick another name")
        actors = self._spawn_on(handle, name, actor_class, args, kwargs)
        handle.actor_specs[name] = ActorSpec(name, actor_class, args, kwargs)
        return actors

    def actors(self, name: str) -> Any:
        with self._lock:
            if name not in self._actor_owner:
                raise UnknownMeshError(name, [n for n in self._actor_owner if not n.startswith(_AGENT_PREFIX)], "actor mesh")
            return self.meshes[self._actor_owner[name]].actors[name]

    def _spawn_on(self, handle: MeshHandle, name: str, cls: type, args: tuple, kwargs: dict) -> Any:
        actors = handle.proc_mesh.spawn(name, cls, *args, **kwargs)
        with self._lock:
            handle.actors[name] = actors
            self._actor_owner[name] = handle.name
        try:  # Monarch's unique name ("trainer-3kEBefMLoHR") tells stale failure reports apart
            handle.actor_full_names[name] = seam.actor_mesh_unique_name(actors)
        except Exception as exc:
            log.debug("unique name of actor mesh %s: %s", name, exc)
        return actors

    def rename(self, old: str, new: str) -> MeshHandle:
        """Call mesh ``old`` ``new`` from now on (a warm spare taking a failed group's place)."""
        if not isinstance(new, str) or not _NAME_RE.match(new):
            raise ValueError(f"mesh name {new!r} is not valid: use letters, digits, '_' or '.'")
        with self._lock:
            if old not in self.meshes:
                raise UnknownMeshError(old, list(self.meshes))
            if new in self.meshes:
                raise MonarchNbError(f"a mesh named {new!r} is already up; stop it first")
            handle = self.meshes.pop(old)
            handle.name = new
            self.meshes[new] = handle
            self._log_dirs[new] = handle.log_dir
            for actor in handle.actors:
                self._actor_owner[actor] = new
        try:  # its workers write on under the new name
            self._capture_logs(handle, 10.0)
        except MonarchNbError as exc:
            log.warning("mesh %s (was %s) keeps writing its logs as %s: %s", new, old, old, exc)
        return handle

    # ---- seeing inside the workers ---------------------------------------------------------

    def _capture_logs(self, handle: MeshHandle, timeout: float) -> None:
        """Every rank's stdout, stderr and logging to ``<log_dir>/<mesh>-rank<k>.log``."""
        raise_for_outcome(gather(handle.agent.capture_logs, f"{handle.name}.capture_logs",
                                 (str(handle.log_dir), handle.name), {}, list(range(handle.size)), timeout,
                                 size=handle.size), timeout)

    def log_dir_of(self, mesh: str) -> Path:
        """Where mesh ``mesh``'s workers write (also after it went down)."""
        with self._lock:
            if mesh in self._log_dirs:
                return self._log_dirs[mesh]
            known = sorted(self._log_dirs)
        raise UnknownMeshError(mesh, known)

    def logs(self, mesh: str | None = None, rank: int | None = None, grep: str | None = None,
             tail: int = 40) -> "worker_logs.LogView":
        """The workers' log lines (of one mesh and rank, containing ``grep``), the same line of
        several ranks and the noise of a fault folded into one; the full text is in the files."""
        if mesh is None:
            with self._lock:
                dirs = sorted(set(self._log_dirs.values()))
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
        handle = self.mesh(mesh)
        chosen = list(range(handle.size)) if ranks is None else list(ranks)
        local = socket.gethostname()
        plan: list[tuple[str, ProcInfo]] = []
        out: dict[int, stacks_.Stack] = {}
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
                    raise stacks_.StackError(why)
                out[rank] = stacks_.Stack(label, proc.pid or 0, why, "unavailable")
                continue
            plan.append((label, proc))
        errors: dict[int, BaseException] = {}

        def read(label: str, proc: ProcInfo) -> None:
            try:
                out[proc.rank] = stacks_.read_stack(label, proc.pid or 0,
                                                    worker_logs.log_path(handle.log_dir, handle.name, proc.rank))
            except stacks_.StackError as exc:
                errors[proc.rank] = exc

        threads = [threading.Thread(target=read, args=item, daemon=True) for item in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors and len(errors) == len(plan):
            raise next(iter(errors.values()))
        for rank, exc in errors.items():
            out[rank] = stacks_.Stack(f"{handle.name} rank {rank}", handle.procs[rank].pid or 0, str(exc),
                                      "unavailable")
        return [out[r] for r in sorted(out)]

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
        old = self.mesh(name)
        specs = list(old.actor_specs.values())
        procs = old.shape.get("gpus", 1)
        hosts = old.shape.get("hosts", 1)
        self.down(name, kill=old.state != "healthy")
        new = self.up(name, procs=procs, hosts=hosts, job=old.job, env=old.env, timeout=timeout)
        for spec in specs:
            self.spawn(spec.name, spec.cls, *spec.args, mesh=name, **spec.kwargs)
        return new

    def down(self, name: str | None = None, timeout: float = 10.0, *, kill: bool = False) -> None:
        """Stop one mesh, or every mesh with no name. Idempotent; quick even for dead meshes.

        ``kill=True`` SIGKILLs the mesh's local processes first: a hung process (GIL held)
        cannot answer Monarch's polite stop, which would wait out ``timeout`` on it.
        """
        with self._lock:
            names = [name] if name is not None else list(self.meshes)
            if name is not None and name not in self.meshes:
                raise UnknownMeshError(name, list(self.meshes))
        self.down_many(names, timeout=timeout, kill=kill)

    def down_many(self, names: list[str], timeout: float = 10.0, *, kill: bool = False) -> None:
        """Stop several meshes at once (each bounded by ``timeout``): N hung meshes cost one
        timeout, not N. Unknown names are skipped."""
        handles = []
        with self._lock:
            for mesh_name in names:
                handle = self.meshes.pop(mesh_name, None)
                if handle is not None:
                    handles.append(handle)
                    for actor in handle.actors:
                        self._actor_owner.pop(actor, None)
            gone = {h.name for h in handles}  # a downed mesh's timeout counters go with it
            self._timeouts = {k: v for k, v in self._timeouts.items() if k[0] not in gone}

        def stop(handle: MeshHandle) -> None:
            self._stop(handle, timeout, kill)
            self.events.append(MeshDown(mesh=handle.name))

        now = time.monotonic()
        with self._lock:  # remember what was torn down, to place Monarch's late reports about it
            self._recent = {k: v for k, v in self._recent.items() if now - v[1] < RECENT_MESH_MEMORY_S}
            for handle in handles:
                for full_name in handle.actor_full_names.values():
                    self._recent[full_name] = (handle, now)

        if len(handles) == 1:
            stop(handles[0])
            return
        threads = [threading.Thread(target=stop, args=(h,), name=f"monarch_nb-down-{h.name}", daemon=True)
                   for h in handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _stop(self, handle: MeshHandle, timeout: float, kill: bool = False) -> None:
        """Stop a mesh's processes. Monarch's polite stop is asked only of a mesh that can answer
        it: not after a kill, and not when every rank is known dead (it would wait ``timeout``)."""
        handle.stopped = True
        local = socket.gethostname()
        local_pids = [p.pid for p in handle.procs if p.pid and p.host == local]
        allocation = handle.allocation
        can_answer = bool(handle.healthy_ranks) or not handle.procs
        if kill:
            _ensure_gone(local_pids, timeout=0)
            if allocation is not None:
                allocation.release()  # the scheduler takes the processes down with the allocation
        if handle.proc_mesh is not None and can_answer and not kill:
            try:
                handle.proc_mesh.stop().get(timeout=timeout)
            except Exception as exc:  # a damaged mesh may fail to stop cleanly; the pids are checked below
                log.debug("stopping mesh %s: %s", handle.name, exc)
        if allocation is not None:
            try:
                allocation.release()
            except Exception as exc:
                log.warning("releasing the %s allocation of mesh %s: %s", allocation.kind, handle.name, exc)
        _ensure_gone(local_pids, timeout)
        for proc in handle.procs:
            if proc.state == ALIVE:
                proc.state = "stopped"
        if handle.proc_mesh is not None:  # what is left of it is its name, processes and logs
            seam.forget_proc_mesh(handle.proc_mesh)
            handle.proc_mesh, handle.agent, handle.actors = None, None, {}

    # ---- watching health ----------------------------------------------------------------

    def _watch(self) -> None:
        """Start (once) the thread that checks every mesh's health: the pids of processes on this
        machine 4 times a second (a dead process is failed within ~0.25 s, without waiting for
        Monarch's supervision poll, which monarch_nb leaves at Monarch's 10 s: each poll costs the
        client memory it never gives back), and each allocation's scheduler once a second (a
        preempted or cancelled allocation, or a node gone down under it, fails its mesh's ranks
        at once instead of after Monarch's supervision timeouts). It ends with the last mesh."""
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_loop, name="monarch_nb-watch", daemon=True)
                self._watcher.start()

    def _watch_loop(self) -> None:
        next_jobs = time.monotonic() + JOB_WATCH_INTERVAL_S
        while not self._watch_stop.wait(PID_WATCH_INTERVAL_S):
            with self._lock:
                live = [h for h in self.meshes.values() if not h.stopped and h.healthy_ranks]
                if not live:
                    self._watcher = None  # under the lock: the next up() starts a new watcher
                    return
            for handle in live:
                if handle.local and handle.pid_watch and handle.gone_here():
                    # a process of an allocation that its scheduler ended died of that: say so
                    for rank in handle.refresh(self._cause_of_death(handle)):
                        self._record_failure(handle, rank, handle.procs[rank].reason)
            if time.monotonic() >= next_jobs:
                next_jobs = time.monotonic() + JOB_WATCH_INTERVAL_S
                for handle in live:
                    if handle.allocation is not None:
                        self._check_allocation(handle)

    def _scheduler_cause(self, handle: MeshHandle) -> str | None:
        """The scheduler's account of an allocation it no longer runs ("SLURM job 60 is CANCELLED"),
        or None while it runs it or does not answer. A job still COMPLETING (its processes being
        killed) is given up to JOB_SETTLE_S to reach its final state, which names the cause."""
        settle = time.monotonic() + JOB_SETTLE_S
        while True:
            try:
                status = handle.allocation.status()
            except Exception as exc:  # the scheduler did not answer: try again next round
                log.debug("status of %s: %s", handle.name, exc)
                return None
            if status is None or status.running:
                return None
            if status.state != "COMPLETING" or time.monotonic() >= settle:
                return status.describe(handle.allocation.kind.upper())
            time.sleep(0.05)

    def _cause_of_death(self, handle: MeshHandle, fallback: str | None = None) -> str | None:
        """Why a process of ``handle`` died, as the scheduler of its allocation tells it (the
        allocation was cancelled, preempted, its node lost), else ``fallback``: every check
        that finds a death asks this first, so the first to report it names the real cause."""
        cause = self._scheduler_cause(handle) if handle.allocation is not None else None
        return cause or fallback

    def _check_allocation(self, handle: MeshHandle) -> None:
        reason = self._scheduler_cause(handle)
        if reason is None or handle.stopped:
            return
        for rank in list(handle.healthy_ranks):
            if handle.mark_failed(rank, reason):
                self._record_failure(handle, rank, reason)

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
        with self._lock:
            handles = list(self.meshes.values())
        for handle in handles:
            for rank in handle.refresh():
                self._record_failure(handle, rank, handle.procs[rank].reason)
        return handles

    def snapshot(self) -> list[MeshHandle]:
        """Every mesh as last known, without checking anything (what views draw: no side effects)."""
        with self._lock:
            return list(self.meshes.values())

    # ---- calls with deadlines ----------------------------------------------------------

    def deadline(self, actors: Any, timeout: float | None = None, *, on_interrupt: Callable[[], None] | None = None,
                 watch: CallWatch | None = None,
                 while_waiting: Callable[[set[int]], None] | None = None) -> "DeadlineMesh":
        """A view of ``actors`` whose endpoints take Monarch's adverbs but never wait past ``timeout``.

        ``session.deadline(trainers, 5).step.call(batch)`` returns a ``MeshResult`` or
        raises ``CallTimeout`` naming the ranks that did not answer. Ctrl-C ends the wait at
        once with ``CallInterrupted`` (``on_interrupt`` runs first, to stop the ranks too);
        ``watch`` (a ``CallWatch``) follows which ranks answered; ``while_waiting(pending ranks)``
        runs every second of a ``gather`` (its time is not counted against the deadline).
        """
        return DeadlineMesh(self, actors, self.default_timeout if timeout is None else timeout,
                            on_interrupt=on_interrupt, watch=watch, while_waiting=while_waiting)

    def owner_of(self, actors: Any) -> MeshHandle | None:
        """The mesh an actor mesh (or a slice of one) was spawned on, if this session spawned it."""
        with self._lock:
            owner = self._actor_owner.get(seam.actor_mesh_name(actors))
            return self.meshes.get(owner) if owner else None

    # ---- failures ----------------------------------------------------------------------

    def on_failure(self, listener: FailureListener) -> Callable[[], None]:
        """Call ``listener(WorkerFailed)`` on every newly failed rank, and ``listener(WorkerExitReported)``
        on Monarch's late account of a process already torn down (on Monarch's thread: be quick)."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def _on_fault(self, failure: Any) -> None:
        """Monarch's supervision report of a failed actor mesh. A process of an allocation its
        scheduler ended died of that, whichever check saw it first: the scheduler's account
        ("SLURM job 60 is CANCELLED") is asked for before Monarch's ("Killed(sig=9)") is used."""
        actor_full_name, ranks, reason = _parse_failure(failure)
        base = actor_full_name.rsplit("-", 1)[0]
        with self._lock:
            late = self._recent.get(actor_full_name)
        if late is not None:
            # Monarch's account of how a process ended, after we tore its mesh down: our own kill
            # or stop, or the failure already reported (we act on our own checks first). Recorded
            # as an explanation, never as a failure of its own.
            for rank in ranks:
                if self._first_account(late[0], rank, reason):
                    self._announce(WorkerExitReported(mesh=late[0].name, rank=rank, reason=reason))
            return
        with self._lock:
            owner = self.meshes.get(self._actor_owner.get(base, ""))
            if owner is not None:
                known = owner.actor_full_names.get(base)
                if known is not None and known != actor_full_name:
                    owner = None  # a late report about an actor mesh we already replaced
            handles = list(self.meshes.values())
        if owner is not None:
            cause = self._cause_of_death(owner, reason) if set(ranks) & set(owner.healthy_ranks) else reason
            for rank in ranks:
                if owner.mark_failed(rank, cause):
                    self._record_failure(owner, rank, cause)
                elif self._first_account(owner, rank, reason):  # our own check reported it: Monarch's words explain it
                    self._announce(WorkerExitReported(mesh=owner.name, rank=rank, reason=reason))
            return
        # Monarch's internal meshes (e.g. its logger) report too; find the dead pid ourselves.
        for handle in handles:
            cause = self._cause_of_death(handle, reason) if handle.gone_here() else reason
            for rank in handle.refresh(cause):
                self._record_failure(handle, rank, cause)

    def _record_timeout(self, mesh: str, endpoint: str, ranks: list[int], timeout: float) -> None:
        """One ``call_timed_out`` event per mesh and endpoint per ``TIMEOUT_EVENT_INTERVAL_S``;
        the ones in between are counted in the next one's ``repeats`` (a poll loop against a
        silent rank must not grow the event log by an event per poll)."""
        now = time.monotonic()
        with self._lock:
            last, suppressed = self._timeouts.get((mesh, endpoint), (None, 0))
            if last is not None and now - last < TIMEOUT_EVENT_INTERVAL_S:
                self._timeouts[(mesh, endpoint)] = (last, suppressed + 1)
                return
            self._timeouts[(mesh, endpoint)] = (now, 0)
        self.events.append(CallTimedOut(mesh=mesh, endpoint=endpoint, missing_ranks=ranks, timeout_s=timeout,
                                        repeats=suppressed + 1))

    def _first_account(self, handle: MeshHandle, rank: int, reason: str) -> bool:
        """True the first time ``reason`` is given for ``rank`` (Monarch's hook repeats itself)
        when it is not already the reason the rank was reported failed with."""
        if not 0 <= rank < len(handle.procs):
            return False
        proc = handle.procs[rank]
        with self._lock:
            if reason == proc.reason or reason in proc.accounts:
                return False
            proc.accounts.add(reason)
        return True

    def report_failure(self, mesh: str, rank: int | None, cause: str, action: str | None = None) -> bool:
        """A rank of ``mesh`` failed, found by the caller's own check (a training run's
        supervisor, ``%monarch kill``): marked failed and announced with ``cause``, unless it
        already was (one report per failed rank: the first detector's). False if not announced."""
        with self._lock:
            handle = self.meshes.get(mesh)
        if handle is None or rank is None or not handle.mark_failed(rank, cause):
            return False
        self._record_failure(handle, rank, cause, action)
        return True

    def _record_failure(self, handle: MeshHandle, rank: int, reason: str, action: str | None = None) -> None:
        """Record and announce a newly failed rank (callers mark it failed first: once per rank)."""
        self._announce(WorkerFailed(mesh=handle.name, rank=rank, reason=reason,
                                    action=action or handle.failure_action))

    def _announce(self, event: WorkerFailed | WorkerExitReported) -> None:
        self.events.append(event)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("failure listener raised")

    # ---- lifecycle ---------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every mesh and the reaper; safe to call twice (it also runs at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.down()
        finally:
            self._watch_stop.set()
            self._remove_hook()
            self._reaper.close()
            self.events.close()
            lifetime.cancel(self.shutdown)

    close = shutdown

    def _check_open(self) -> None:
        if self._closed:
            raise MonarchNbError("this session is shut down; create a new monarch_nb.Session()")

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


class DeadlineEndpoint:
    """One endpoint of a ``DeadlineMesh``: Monarch's adverbs, each bounded by the deadline."""

    def __init__(self, view: "DeadlineMesh", name: str) -> None:
        self._view, self._name = view, name
        self._endpoint = getattr(view.actors, name)
        self._label = f"{seam.actor_mesh_name(view.actors)}.{name}"

    def _targets(self) -> tuple[list[int], set[int], MeshHandle | None]:
        """(global ranks of the view, those known dead, the owning mesh)."""
        ranks = seam.actor_mesh_ranks(self._view.actors)
        owner = self._view.session.owner_of(self._view.actors)
        failed = set(owner.failed_ranks) & set(ranks) if owner else set()
        return ranks, failed, owner

    def gather(self, *args: Any, **kwargs: Any) -> MeshResult:
        """Per-rank outcome without raising: values, errors, and ranks that stayed silent."""
        view = self._view
        ranks, failed, owner = self._targets()
        local_live = [i for i, r in enumerate(ranks) if r not in failed]
        index = {r: i for i, r in enumerate(ranks)}

        def dead() -> set[int]:  # ranks that died during the call: stop waiting for them
            return {index[r] for r in owner.failed_ranks if r in index} if owner else set()

        try:
            result = gather(self._endpoint, self._label, args, kwargs, local_live, view.timeout, dead,
                            on_interrupt=view.on_interrupt, watch=view.watch, global_ranks=ranks,
                            while_waiting=view.while_waiting, size=len(ranks))
        except CallInterrupted as exc:
            _to_global(exc.result, ranks, failed)
            raise
        _to_global(result, ranks, failed)
        silent = sorted(set(result.missing) - set(owner.failed_ranks if owner else ()))
        if silent:  # ranks known dead are no news: their failure was recorded when they died
            view.session._record_timeout(owner.name if owner else "?", result.endpoint, silent, view.timeout)
        return result

    def call(self, *args: Any, **kwargs: Any) -> MeshResult:
        result = self.gather(*args, **kwargs)
        _, failed, _ = self._targets()
        return raise_for_outcome(result, self._view.timeout, sorted(failed))

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        size = len(seam.actor_mesh_ranks(self._view.actors))
        if size != 1:
            raise ValueError(f"call_one needs a mesh of exactly one actor, this slice has {size}; "
                             "slice it first, e.g. .slice(gpus=0)")
        result = self.call(*args, **kwargs)
        return next(iter(result.values.values()))

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._endpoint.choose(*args, **kwargs).get(timeout=self._view.timeout)
        except TimeoutError:
            raise CallTimeout(f"{self._label} (choose)", [], self._view.timeout) from None

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        self._endpoint.broadcast(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Values in arrival order; raises the first rank's exception as ``RemoteError``, and
        ``CallTimeout`` at the deadline naming the ranks that stayed silent."""
        ranks, failed, _ = self._targets()
        pending = {i for i, r in enumerate(ranks) if r not in failed}
        for rank, ok, value in receive(self._endpoint, args, kwargs, len(pending), self._view.timeout,
                                       size=len(ranks)):
            pending.discard(rank)
            if not ok:
                raise RemoteError(self._label, {ranks[rank]: value}, {})
            yield value
        missing = sorted([ranks[i] for i in pending] + sorted(failed))
        if missing:
            raise CallTimeout(self._label, missing, self._view.timeout, failed_ranks=sorted(failed))


class DeadlineMesh:
    """``actors`` with a deadline on every call; ``on_interrupt`` is called on Ctrl-C during a
    ``gather``/``call`` (to stop the ranks too), ``watch`` follows its progress."""

    def __init__(self, session: Session, actors: Any, timeout: float, *,
                 on_interrupt: Callable[[], None] | None = None, watch: CallWatch | None = None,
                 while_waiting: Callable[[set[int]], None] | None = None) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.session, self.actors, self.timeout = session, actors, timeout
        self.on_interrupt, self.watch, self.while_waiting = on_interrupt, watch, while_waiting

    def __getattr__(self, name: str) -> DeadlineEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return DeadlineEndpoint(self, name)

    def slice(self, **dims: Any) -> "DeadlineMesh":
        return DeadlineMesh(self.session, self.actors.slice(**dims), self.timeout,
                            on_interrupt=self.on_interrupt, watch=self.watch)


def _to_global(result: MeshResult, ranks: list[int], failed: set[int]) -> None:
    """Report in the proc mesh's global ranks, and count known-dead ranks as missing."""
    result.values = {ranks[i]: v for i, v in result.values.items()}
    result.errors = {ranks[i]: e for i, e in result.errors.items()}
    result.missing = sorted(set([ranks[i] for i in result.missing]) | failed)
    result.ranks = ranks


def _ensure_gone(pids: list[int], timeout: float) -> None:
    """Wait for stopped workers to exit; SIGKILL any that linger, so nothing is orphaned.

    A worker that has exited is left to Monarch to reap for a moment: Monarch's allocator reads the
    exit status (``Killed(sig=9)``, ``Failed(...)``) from its own wait, and a reap of ours first
    leaves it "wait failed: No child processes" in place of the fault's cause. psutil's wait()
    reaps our children, so it is only used once Monarch has had its chance."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + min(timeout, 5.0)
    alive = [p for p in procs if pid_alive(p.pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p.pid)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    grace = time.monotonic() + 1.0  # Monarch reaps an exited child within milliseconds
    while time.monotonic() < grace and any(p.is_running() for p in procs):
        time.sleep(0.05)
    psutil.wait_procs([p for p in procs if p.is_running()], timeout=2.0)


def current_session(create: bool = True) -> Session | None:
    """The session the notebook magics use: the newest open one, created on first use."""
    live = [s for s in (ref() for ref in list(_sessions)) if s is not None and not s._closed]
    if live:
        return live[-1]
    return Session() if create else None
