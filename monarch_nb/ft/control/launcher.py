"""Bringing a replica group's processes and trainers up, and taking them down.

The launcher owns what it starts: every worker pid (none may outlive the run), the warm spares
(a failed group's replacement, built in advance) and where workers write their logs. It spawns a
group's proc mesh and trainer actors (or hands it a ready spare), waits until the trainers are
built, starts their training loop, and tears a group down (killing it: a hung process cannot
answer a polite stop). The supervisor decides *when*; failure responses call these means
through :class:`~.responses.ResponseMeans`. Controller side: runs in the kernel's threads.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ...calls import MeshResult
from ...telemetry.events import Acquired, Event, TornDown
from ..settings.config import RunConfig
from ..settings.faults import ENDS_PROCESS
from ..settings.platform import DEVICE_SLOT_ENV
from .groups import GroupTable, ReplicaGroup
from .placement import Placement
from .spares import Spare, SparePool

if TYPE_CHECKING:
    from ...session import Session

log = logging.getLogger(__name__)
SPAWN_THREADS = 32  # groups brought up at once by spawn_all

# Environment of worker processes (on top of the controller's, which they inherit): torchft's
# Rust side logs every quorum and commit at INFO; one intra-op thread per process on CPU.
WORKER_ENV = {"RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Launcher:
    """Spawns, adopts, starts and tears down groups (see the module docstring)."""

    def __init__(self, config: RunConfig, session: "Session", groups: GroupTable, placement: Placement,
                 emit: Callable[[Event], None], trainer_args: Callable[[ReplicaGroup | None, int | None], tuple],
                 lighthouse: Callable[[], str], poll: Callable[[ReplicaGroup, float], MeshResult],
                 failure_action: Callable[[str], str], stopping: threading.Event,
                 fired_by: Callable[[int], str | None] = lambda pid: None) -> None:
        """``trainer_args(group, store_port)``: TrainerActor's arguments (group None: a spare);
        ``lighthouse()``: the Lighthouse's address now; ``poll(group, timeout)``: one telemetry
        poll of a group; ``failure_action(mesh)``: what a failure of that mesh leads to;
        ``fired_by(pid)``: the kind of fault a process recorded firing (the fault log)."""
        self.config, self.session, self.groups, self.placement = config, session, groups, placement
        self._emit, self._trainer_args, self._lighthouse = emit, trainer_args, lighthouse
        self._poll, self._failure_action, self._stopping, self._fired_by = poll, failure_action, stopping, fired_by
        self.log_dir: str | None = None  # where the workers write (the run's logs/); None: the session's
        self.spawned_pids: list[int] = []  # every worker process started (orphan checks)
        self.spares: SparePool | None = None
        if config.spares:
            self.spares = SparePool(config.spares, self.build_spare, self.teardown_spare, emit)

    def bring_up(self, mesh: str, actor: str, kwargs: dict[str, Any], trainer_args: Callable[[int | None], tuple]
                  ) -> tuple[Any, list[tuple[int, str]], float]:
        """Processes on a new mesh and trainer actors on them (they build the model in __init__,
        in the background): (actors, (pid, host) per rank, seconds the processes took)."""
        cfg = self.config
        t0 = time.monotonic()
        slot = int(mesh[len("replica"):]) if mesh.startswith("replica") else cfg.replicas + int(mesh[len("spare"):])
        env = {**WORKER_ENV, DEVICE_SLOT_ENV: str(slot), **cfg.env}
        handle = self.session.up(mesh, procs=cfg.group_size, env=env, timeout=60.0,
                                 log_dir=self.log_dir, **kwargs)
        acquired_s = time.monotonic() - t0
        handle.failure_action, handle.fired_fault = self._failure_action(mesh), self.fired_fault
        handle.pid_watch = mesh.startswith("spare")  # a group's pids: _dead_rank checks them, naming the fault
        store_port = _free_port() if cfg.group_size > 1 else None
        actors = self.session.spawn(actor, _trainer_class(), *trainer_args(store_port), mesh=mesh)
        # (pid, host) per rank; a host of this machine (a virtual SLURM node too) as this host's
        # name, so the pid checks and the load figures below take it as running here.
        here = socket.gethostname()
        procs = [(p.pid, here if handle.local else p.host) for p in handle.procs if p.pid]
        self.spawned_pids.extend(pid for pid, _ in procs)
        return actors, procs, acquired_s

    def spawn(self, g: ReplicaGroup) -> float:
        """Fresh processes and trainers for ``g``; returns how long the processes took to come up."""
        actors, procs, acquired_s = self.bring_up(g.name, f"trainer{g.index}", self.placement.up_kwargs(g.index),
                                                   lambda port: self._trainer_args(g, port))
        self.groups.attach(g, actors, procs, time.monotonic())
        return acquired_s

    def spawn_all(self, groups: list[ReplicaGroup]) -> dict[int, float]:
        """Processes and trainers for every group at once: the groups' start-ups (process spawn,
        SLURM allocation, imports) overlap instead of queueing, so starting R groups costs about
        the slowest one's time, not the sum (on a cluster each group's node does its own work).
        Returns each group's acquisition time by index; the first error is raised once every
        spawn has ended."""
        return self.at_once(groups, self.spawn, "ft-spawn")

    def at_once(self, groups: list[ReplicaGroup], fn: Callable[[ReplicaGroup], Any], name: str) -> dict[int, Any]:
        """``fn`` for every group in parallel threads (see ``in_parallel``)."""
        return in_parallel(groups, fn, name)

    def build_spare(self, spare: Spare) -> None:
        """A spare: processes and built trainers with no torchft Manager (see spares.py)."""
        spare.actors, spare.procs, _ = self.bring_up(spare.mesh, f"trainer_{spare.mesh}",
                                                      self.placement.spare_kwargs(),
                                                      lambda port: self._trainer_args(None, port))
        deadline = time.monotonic() + self.config.init_timeout_s
        while time.monotonic() < deadline and not self._stopping.is_set():
            result = self.session.deadline(spare.actors, 10.0).poll.gather()
            if result.errors:
                rank, err = next(iter(result.errors.items()))
                raise RuntimeError(f"{spare.mesh} rank {rank}: {err}")
            if len(result.values) == self.config.group_size and \
                    all(v.get("state") == "spare" for v in result.values.values()):
                return
        raise TimeoutError(f"{spare.mesh}: not built within {self.config.init_timeout_s:g} s")

    def teardown_spare(self, spare: Spare) -> None:
        try:
            self.session.down(spare.mesh, kill=True)
        except Exception as exc:  # already gone
            log.debug("tearing down %s: %s", spare.mesh, exc)

    def adopt(self, g: ReplicaGroup, spare: Spare) -> None:
        """A ready spare takes ``g``'s place: its mesh becomes ``g``'s and it joins as ``g``."""
        handle = self.session.rename(spare.mesh, g.name)
        handle.failure_action, handle.pid_watch = self._failure_action(g.name), False
        self.groups.attach(g, spare.actors, spare.procs, time.monotonic())
        self.call(g, "activate", g.index, self._lighthouse(), g.attempts, timeout=30.0)

    def wait_ready(self, g: ReplicaGroup, deadline: float) -> None:
        """Poll until every rank's actor is constructed (a poll waits for the constructor).
        A rank that died while starting ends the wait at once: it would never answer."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{g.name}: trainer actors not ready within {self.config.init_timeout_s:g} s")
            if self._stopping.is_set():
                raise RuntimeError(f"{g.name}: the run is stopping")
            failure = self.groups.take_failure(g)
            if failure is not None:
                raise RuntimeError(f"{g.name} failed while starting: {failure.reason}")
            dead = [p for p in self.session.mesh(g.name).procs if p.state == "failed"]
            if dead:
                raise RuntimeError(f"{g.name} rank {dead[0].rank} died while starting: {dead[0].reason}")
            result = self._poll(g, min(left, 10.0))
            if result.errors:
                rank, err = next(iter(result.errors.items()))
                raise RuntimeError(f"{g.name} rank {rank} failed to start: {err}")
            if not result.missing and len(result.values) == self.config.group_size:
                return

    def call(self, g: ReplicaGroup, endpoint: str, *args: Any, timeout: float = 10.0) -> Any:
        return getattr(self.session.deadline(g.actors, timeout), endpoint).call(*args)

    def repair(self, g: ReplicaGroup, timeout: float) -> float:
        """The ladder's in-place rungs: every rank of ``g`` gets a new communicator and drops the
        step that broke; raises unless all did within ``timeout``. Its stalled ranks, reported
        failed, are alive in the session's view first (calls skip ranks known failed; a repair
        that fails escalates to replacing the processes). Returns the slowest rank's seconds."""
        handle = self.session.mesh(g.name)
        for rank in range(len(g.procs)):
            handle.mark_repaired(rank)
        result = self.call(g, "repair", timeout=timeout)
        if result.errors or result.missing:
            what = (f"rank {min(result.errors)}: {result.errors[min(result.errors)]}" if result.errors
                    else f"ranks {result.missing} did not answer")
            raise RuntimeError(f"repair of {g.name}: {what}")
        return max(result.values.values(), default=0.0)

    def allocation_gone(self, g: ReplicaGroup) -> bool:
        """The scheduler no longer runs ``g``'s allocation (preempted, cancelled, node down): the
        ladder enters at ``hosts``. False for processes on this machine."""
        try:
            allocation = self.session.mesh(g.name).allocation
            status = allocation.status() if allocation is not None else None
        except Exception as exc:  # the scheduler did not answer: not known to be gone
            log.debug("allocation of %s: %s", g.name, exc)
            return False
        return status is not None and not status.running

    def start_training(self, g: ReplicaGroup, min_step: int = 0, resume_from: str | None = None) -> None:
        """Start ``g``'s training loop. ``min_step``: it may not train below the run's progress
        without a heal or a checkpoint; ``resume_from``: a durable checkpoint to load first.
        The group has just answered: its silence is counted from here, not from its spawn (a
        run's start takes minutes with 16 groups on two cores, and a slow first poll after it
        must not read as minutes of silence)."""
        self.call(g, "start", min_step, resume_from, timeout=120.0 if resume_from else 30.0)
        self.groups.touch(g, time.monotonic())

    def acquire(self, g: ReplicaGroup, t0: float) -> None:
        """Processes and built trainers for ``g``: a ready spare if there is one, else fresh ones
        (spawned, or a new allocation). Records the ``acquired`` phase."""
        spare = self.spares.take(g.name) if self.spares is not None else None
        if spare is not None:
            self.adopt(g, spare)
            self._emit(Acquired(replica=g.index, how="spare", seconds=time.time() - t0))
            return
        acquired_s = self.spawn(g)
        how = "allocation" if self.placement.name == "slurm" else "spawn"
        self._emit(Acquired(t=t0 + acquired_s, replica=g.index, how=how, seconds=acquired_s))
        self.wait_ready(g, time.monotonic() + self.config.init_timeout_s)

    def teardown(self, g: ReplicaGroup) -> None:
        """The failed group's processes gone: a hung process (GIL held) cannot answer a polite
        stop, so they are killed first."""
        t0 = time.monotonic()
        try:
            self.session.down(g.name, kill=True)
        except Exception as exc:
            log.debug("tearing down %s: %s", g.name, exc)
        self._emit(TornDown(replica=g.index, seconds=time.monotonic() - t0))

    def fired_fault(self, pid: int) -> str | None:
        """How process ``pid`` ended if it recorded firing a fault that ends a process (the fault
        log), in the pid check's words; None otherwise."""
        kind = self._fired_by(pid)
        how = ENDS_PROCESS.get(kind or "")
        return f"process {pid} {how} (it fired an injected {kind} fault, per the fault log)" if how else None

    def teardown_all(self, groups: list[ReplicaGroup], failed: ReplicaGroup) -> None:
        """Every group's processes gone at once (a restart of the whole job); the teardown phase
        is recorded for the group whose failure caused it."""
        t0 = time.monotonic()
        self.session.down_many([h.name for h in groups], kill=True)
        self._emit(TornDown(replica=failed.index, seconds=time.monotonic() - t0))

    def stop_spares(self) -> None:
        """No more spares; the ones still held are killed (they hold no state worth keeping)."""
        if self.spares is not None:
            held = self.spares.stop()
            if held:
                self.session.down_many([s.mesh for s in held], kill=True)


def in_parallel(groups: list[ReplicaGroup], fn: Callable[[ReplicaGroup], Any], name: str) -> dict[int, Any]:
    """``fn`` for every group at once, by group index: their start-ups and checkpoint loads
    overlap instead of queueing (on a cluster each group's node does its own work). The first
    error is raised once every call has ended."""
    if len(groups) <= 1:
        return {g.index: fn(g) for g in groups}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(groups), SPAWN_THREADS), thread_name_prefix=name) as pool:
        futures = {g.index: pool.submit(fn, g) for g in groups}
    errors = [f.exception() for f in futures.values() if f.exception() is not None]
    if errors:
        raise errors[0]
    return {index: f.result() for index, f in futures.items()}


def _trainer_class() -> type:
    from ..worker.trainer_actor import TrainerActor  # imports monarch and torch; kept out of module import time

    return TrainerActor
