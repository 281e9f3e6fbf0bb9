"""Bringing process meshes up and down by name: the one owner of which meshes exist.

``MeshLifecycle`` starts a proc mesh (on this machine, or on hosts a job allocates), spawns
the ``ProcAgent`` and the user's actor meshes on it, renames and replaces meshes, and stops
them without leaving a process behind: Monarch's polite stop where the mesh can answer it,
SIGKILL for what lingers, the allocation released. It keeps the tables the rest of the
session looks meshes up in - mesh by name, actor mesh -> its mesh, where each mesh's workers
write (kept after it went down), the meshes torn down in the last minute (to place Monarch's
late reports about them) - all under its one lock. Health is ``failure_watch``'s job, calls
with deadlines ``calls``'; this module tells them through two callables when a mesh came up
or went down.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import _runtime, seam
from .calls import gather, raise_for_outcome
from .errors import MonarchNbError, UnknownMeshError
from .meshes import ALIVE, ActorSpec, MeshHandle, ProcInfo, coords_of, pid_alive
from .reaper import Reaper
from .telemetry import EventStore
from .telemetry.events import MeshDown, MeshUp

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_AGENT_PREFIX = "_nb_agent_"
RECENT_MESH_MEMORY_S = 60.0


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


class MeshLifecycle:
    """The session's meshes by name, and starting, renaming, replacing and stopping them.

    Args:
        events: where ``mesh_up`` / ``mesh_down`` go.
        reaper: the watchdog told every worker pid and allocation, so nothing outlives the kernel.
        log_dir: the session's directory: allocations' job logs go here, workers' logs to its
            ``logs/`` unless ``up`` names another.
        on_up: called (with no lock held) after each mesh came up: the failure watcher starts.
        on_down: called with the names of meshes taken down: their timeout counters go.
    """

    def __init__(self, *, events: EventStore, reaper: Reaper, log_dir: Path, on_up: Callable[[], None],
                 on_down: Callable[[set[str]], None]) -> None:
        self.events, self.log_dir = events, log_dir
        self._reaper, self._on_up, self._on_down = reaper, on_up, on_down
        self._lock = threading.RLock()  # guards every table below and _closed
        self._meshes: dict[str, MeshHandle] = {}
        self._actor_owner: dict[str, str] = {}  # actor mesh name -> its mesh's name
        self._recent: dict[str, tuple[MeshHandle, float]] = {}  # unique actor mesh name -> (mesh, torn down at)
        self._log_dirs: dict[str, Path] = {}  # mesh name -> where its workers' logs are (kept after down)
        self._closed = False

    @property
    def meshes(self) -> dict[str, MeshHandle]:
        """The live table of meshes by name (``Session.meshes``); changed only under the lock."""
        return self._meshes

    # ---- open / closed ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> bool:
        """Refuse new meshes and actors from now on; False if that was already so."""
        with self._lock:
            was_open, self._closed = not self._closed, True
        return was_open

    def check_open(self) -> None:
        if self._closed:
            raise MonarchNbError("this session is shut down; create a new monarch_nb.Session()")

    # ---- up -----------------------------------------------------------------------------

    def up(self, name: str, procs: int, hosts: int, *, job: Any, env: dict[str, str] | None, host_mesh: Any,
           timeout: float, force: bool, log_dir: str | Path | None) -> MeshHandle:
        """``Session.up`` (see there), with ``timeout`` already resolved to seconds."""
        self.check_open()
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
            if name in self._meshes:
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
            self._meshes[name] = handle
            self._log_dirs[name] = handle.log_dir
        try:
            bootstrap = functools.partial(_apply_env, worker_env) if worker_env else None
            handle.proc_mesh = host_mesh.spawn_procs(per_host={"gpus": procs}, bootstrap=bootstrap, name=name)
            extent = handle.proc_mesh.extent
            handle.shape = {k: int(v) for k, v in zip(extent.labels, extent.sizes)}
            handle.procs = [ProcInfo(rank=r, coords=coords_of(r, handle.shape)) for r in range(handle.size)]
            from .agent import ProcAgent

            handle.agent = self._spawn_on(handle, _AGENT_PREFIX + name, ProcAgent, (), {})
            ids = raise_for_outcome(gather(handle.agent.identity, f"{name}.identity", (), {},
                                           list(range(handle.size)), timeout, size=handle.size), timeout)
            for rank, ident in ids:
                proc = handle.procs[rank]
                proc.pid, proc.host, proc.job_id, proc.node = ident.pid, ident.host, ident.job_id, ident.node
            self._capture_logs(handle, timeout)
        except BaseException:
            self.down(name, kill=True)
            raise
        if local:
            self._reaper.guard([p.pid for p in handle.procs if p.pid])
        if allocation is not None:
            self._reaper.guard(allocation.pids(), commands=allocation.reaper_commands())
        self._on_up()
        self.events.append(MeshUp(mesh=name, shape=handle.shape, seconds=time.monotonic() - started))
        return handle

    def _capture_logs(self, handle: MeshHandle, timeout: float) -> None:
        """Every rank's stdout, stderr and logging to ``<log_dir>/<mesh>-rank<k>.log``."""
        raise_for_outcome(gather(handle.agent.capture_logs, f"{handle.name}.capture_logs",
                                 (str(handle.log_dir), handle.name), {}, list(range(handle.size)), timeout,
                                 size=handle.size), timeout)

    # ---- actor meshes -------------------------------------------------------------------

    def spawn(self, name: str, actor_class: type, args: tuple, kwargs: dict, mesh: str | None) -> Any:
        """``Session.spawn``: Monarch's real ActorMesh of ``actor_class`` on every process of a mesh."""
        self.check_open()
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

    def actors(self, name: str) -> Any:
        with self._lock:
            if name not in self._actor_owner:
                raise UnknownMeshError(name, [n for n in self._actor_owner if not n.startswith(_AGENT_PREFIX)], "actor mesh")
            return self._meshes[self._actor_owner[name]].actors[name]

    # ---- looking meshes up ----------------------------------------------------------------

    def mesh(self, name: str | None = None) -> MeshHandle:
        """``Session.mesh``: the mesh called ``name``; with no name, the only one (or 'main')."""
        with self._lock:
            if name is None:
                if len(self._meshes) == 1:
                    return next(iter(self._meshes.values()))
                if "main" in self._meshes:
                    return self._meshes["main"]
                if not self._meshes:
                    raise UnknownMeshError("main", [])
                raise MonarchNbError(f"several meshes are up ({', '.join(sorted(self._meshes))}); name one with --mesh NAME")
            if name not in self._meshes:
                raise UnknownMeshError(name, list(self._meshes))
            return self._meshes[name]

    def get(self, name: str) -> MeshHandle | None:
        with self._lock:
            return self._meshes.get(name)

    def snapshot(self) -> list[MeshHandle]:
        with self._lock:
            return list(self._meshes.values())

    def live(self) -> list[MeshHandle]:
        """Meshes not being stopped that have a rank still alive (what the watcher checks)."""
        with self._lock:
            return [h for h in self._meshes.values() if not h.stopped and h.healthy_ranks]

    def owner_of(self, actors: Any) -> MeshHandle | None:
        """The mesh an actor mesh (or a slice of one) was spawned on, if this session spawned it."""
        with self._lock:
            owner = self._actor_owner.get(seam.actor_mesh_name(actors))
            return self._meshes.get(owner) if owner else None

    def holder_of(self, actor_full_name: str) -> MeshHandle | None:
        """The mesh holding the actor mesh Monarch calls ``actor_full_name`` ("trainer-3kEBefMLoHR");
        None for one this session did not spawn or has replaced since."""
        base = actor_full_name.rsplit("-", 1)[0]
        with self._lock:
            owner = self._meshes.get(self._actor_owner.get(base, ""))
            if owner is not None and owner.actor_full_names.get(base) != actor_full_name:
                # A late report about an actor mesh we already replaced - also while the new one's
                # name is not known yet (Monarch names it once spawned): a report from before a
                # same-named mesh came up was once placed on it (notebook 07, a run after a run).
                # The pid watcher still finds a real death of the new one's local processes.
                return None
            return owner

    def torn_down(self, actor_full_name: str) -> MeshHandle | None:
        """The mesh that held ``actor_full_name`` if it was taken down in the last
        ``RECENT_MESH_MEMORY_S`` (Monarch reports how its processes ended after we stopped them)."""
        with self._lock:
            late = self._recent.get(actor_full_name)
        return late[0] if late is not None else None

    def log_dir_of(self, mesh: str) -> Path:
        """Where mesh ``mesh``'s workers write (also after it went down)."""
        with self._lock:
            if mesh in self._log_dirs:
                return self._log_dirs[mesh]
            known = sorted(self._log_dirs)
        raise UnknownMeshError(mesh, known)

    def log_dirs(self) -> list[Path]:
        """Every directory this session's meshes wrote to, sorted."""
        with self._lock:
            return sorted(set(self._log_dirs.values()))

    # ---- rename, replace ----------------------------------------------------------------------

    def rename(self, old: str, new: str) -> MeshHandle:
        """``Session.rename``: call mesh ``old`` ``new`` from now on."""
        if not isinstance(new, str) or not _NAME_RE.match(new):
            raise ValueError(f"mesh name {new!r} is not valid: use letters, digits, '_' or '.'")
        with self._lock:
            if old not in self._meshes:
                raise UnknownMeshError(old, list(self._meshes))
            if new in self._meshes:
                raise MonarchNbError(f"a mesh named {new!r} is already up; stop it first")
            handle = self._meshes.pop(old)
            handle.name = new
            self._meshes[new] = handle
            self._log_dirs[new] = handle.log_dir
            for actor in handle.actors:
                self._actor_owner[actor] = new
        try:  # its workers write on under the new name
            self._capture_logs(handle, 10.0)
        except MonarchNbError as exc:
            log.warning("mesh %s (was %s) keeps writing its logs as %s: %s", new, old, old, exc)
        return handle

    def replace(self, name: str, timeout: float) -> MeshHandle:
        """``Session.replace``: a fresh proc mesh of the same shape, its actor meshes respawned."""
        old = self.mesh(name)
        specs = list(old.actor_specs.values())
        procs = old.shape.get("gpus", 1)
        hosts = old.shape.get("hosts", 1)
        self.down(name, kill=old.state != "healthy")
        new = self.up(name, procs=procs, hosts=hosts, job=old.job, env=old.env, host_mesh=None, timeout=timeout,
                      force=False, log_dir=None)
        for spec in specs:
            self.spawn(spec.name, spec.cls, spec.args, spec.kwargs, mesh=name)
        return new

    # ---- down -------------------------------------------------------------------------------

    def down(self, name: str | None = None, timeout: float = 10.0, *, kill: bool = False) -> None:
        """``Session.down``: stop one mesh, or every mesh with no name."""
        with self._lock:
            names = [name] if name is not None else list(self._meshes)
            if name is not None and name not in self._meshes:
                raise UnknownMeshError(name, list(self._meshes))
        self.down_many(names, timeout=timeout, kill=kill)

    def down_many(self, names: list[str], timeout: float = 10.0, *, kill: bool = False) -> None:
        """``Session.down_many``: stop several meshes at once; unknown names are skipped."""
        handles = []
        with self._lock:
            for mesh_name in names:
                handle = self._meshes.pop(mesh_name, None)
                if handle is not None:
                    handles.append(handle)
                    for actor in handle.actors:
                        self._actor_owner.pop(actor, None)
        self._on_down({h.name for h in handles})  # a downed mesh's timeout counters go with it

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
