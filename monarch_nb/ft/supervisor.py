"""Supervision of replica groups: bring a group up, watch it, and bring it back when it fails.

One thread per group polls its trainers (events and state) under a deadline and decides the
group has failed in one of five ways (:class:`~monarch_nb.ft.groups.Failure`): Monarch
supervision reports a dead process, our pid check finds one gone, a call to the trainer
raises, the trainer reports a failure it survived (an exception in the step, aborted comms),
or the group stays silent past ``hang_timeout_s``. Recovery happens in that group's thread
only - survivors never restart: tear the mesh down, wait the restart policy's backoff,
bring up fresh processes, build the trainer and start it; torchft heals it from a live peer
at the next quorum, and the first committed step is its rejoin. Each phase is recorded as
an event, so a recovery's phases add up to the time the victim was out.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable

from ..meshes import exit_status, pid_alive
from ..telemetry.events import Acquired, Event, FailureDetected, GaveUp, ReplicaState, Respawned, TornDown
from .config import RunConfig
from .groups import (
    FAILED,
    FINISHED,
    GAVE_UP,
    HEALING,
    RESPAWNING,
    RETIRED,
    RETIRING,
    STARTING,
    TERMINAL,
    TRAINING,
    Failure,
    GroupTable,
    ReplicaGroup,
)
from .identity import IdentityChecks
from .ingest import EventIngest, HashReport
from .placement import Placement
from .spares import Spare, SparePool

log = logging.getLogger(__name__)

# Environment of worker processes (on top of the controller's, which they inherit): torchft's
# Rust side logs every quorum and commit at INFO; one intra-op thread per process on CPU.
WORKER_ENV = {"RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Supervisor:
    """Brings groups up, watches them and recovers them; the run owns one."""

    def __init__(self, config: RunConfig, session: Any, groups: GroupTable, placement: Placement,
                 ingest: EventIngest, identity: IdentityChecks, emit: Callable[[Event], None],
                 fired_time: Callable[[int], float | None],
                 trainer_args: Callable[[ReplicaGroup | None, int | None], tuple],
                 lighthouse: Callable[[], str]) -> None:
        """``trainer_args(group, store_port)`` are TrainerActor's arguments (group None: a spare);
        ``lighthouse()`` is the Lighthouse's address now."""
        self.config, self.session, self.groups, self.placement = config, session, groups, placement
        self.ingest, self.identity, self._emit = ingest, identity, emit
        self._fired_time, self._trainer_args, self._lighthouse = fired_time, trainer_args, lighthouse
        self.spares: SparePool | None = None
        if config.spares:
            self.spares = SparePool(config.spares, self.build_spare, self.teardown_spare, emit)
        self.stopping = threading.Event()
        self.spawned_pids: list[int] = []  # every worker process started (orphan checks)
        self._threads: list[threading.Thread] = []

    # ---- states -----------------------------------------------------------------------

    def set_state(self, g: ReplicaGroup, state: str, detail: str = "") -> None:
        if self.groups.set_state(g, state, detail):
            self._emit(ReplicaState(replica=g.index, state=state, detail=detail))

    # ---- bringing a group up -----------------------------------------------------------

    def _bring_up(self, mesh: str, actor: str, kwargs: dict[str, Any], trainer_args: Callable[[int | None], tuple]
                  ) -> tuple[Any, list[tuple[int, str]], float]:
        """Processes on a new mesh and trainer actors on them (they build the model in __init__,
        in the background): (actors, (pid, host) per rank, seconds the processes took)."""
        cfg = self.config
        t0 = time.monotonic()
        handle = self.session.up(mesh, procs=cfg.group_size, env={**WORKER_ENV, **cfg.env}, timeout=60.0, **kwargs)
        acquired_s = time.monotonic() - t0
        store_port = _free_port() if cfg.group_size > 1 else None
        actors = self.session.spawn(actor, _trainer_class(), *trainer_args(store_port), mesh=mesh)
        procs = [(p.pid, p.host) for p in handle.procs if p.pid]
        self.spawned_pids.extend(pid for pid, _ in procs)
        return actors, procs, acquired_s

    def spawn(self, g: ReplicaGroup) -> float:
        """Fresh processes and trainers for ``g``; returns how long the processes took to come up."""
        actors, procs, acquired_s = self._bring_up(g.name, f"trainer{g.index}", self.placement.up_kwargs(g.index),
                                                   lambda port: self._trainer_args(g, port))
        self.groups.attach(g, actors, procs, time.monotonic())
        return acquired_s

    # ---- warm spares -------------------------------------------------------------------

    def build_spare(self, spare: Spare) -> None:
        """A spare: processes and built trainers with no torchft Manager (see spares.py)."""
        spare.actors, spare.procs, _ = self._bring_up(spare.mesh, f"trainer_{spare.mesh}",
                                                      self.placement.spare_kwargs(),
                                                      lambda port: self._trainer_args(None, port))
        deadline = time.monotonic() + self.config.init_timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set():
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
        self.session.rename(spare.mesh, g.name)
        self.groups.attach(g, spare.actors, spare.procs, time.monotonic())
        self.call(g, "activate", g.index, self._lighthouse(), g.attempts, timeout=30.0)

    def wait_ready(self, g: ReplicaGroup, deadline: float) -> None:
        """Poll until every rank's actor is constructed (a poll waits for the constructor).
        A rank that died while starting ends the wait at once: it would never answer."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{g.name}: trainer actors not ready within {self.config.init_timeout_s:g} s")
            if self.stopping.is_set():
                raise RuntimeError(f"{g.name}: the run is stopping")
            failure = self.groups.take_failure(g)
            if failure is not None:
                raise RuntimeError(f"{g.name} failed while starting: {failure.reason}")
            dead = [p for p in self.session.mesh(g.name).procs if p.state == "failed"]
            if dead:
                raise RuntimeError(f"{g.name} rank {dead[0].rank} died while starting: {dead[0].reason}")
            result = self.poll(g, min(left, 10.0))
            if result.errors:
                rank, err = next(iter(result.errors.items()))
                raise RuntimeError(f"{g.name} rank {rank} failed to start: {err}")
            if not result.missing and len(result.values) == self.config.group_size:
                return

    def call(self, g: ReplicaGroup, endpoint: str, *args: Any, timeout: float = 10.0) -> Any:
        return getattr(self.session.deadline(g.actors, timeout), endpoint).call(*args)

    def start_training(self, g: ReplicaGroup) -> None:
        self.call(g, "start", timeout=30.0)

    # ---- telemetry ---------------------------------------------------------------------

    def poll(self, g: ReplicaGroup, timeout: float) -> Any:
        """One ``poll`` of every rank; its events are translated and recorded."""
        result = self.session.deadline(g.actors, timeout).poll.gather()
        for item in self.ingest.translate(g.index, result.values):
            if isinstance(item, HashReport):
                self.identity.record(item)
            else:
                self._emit(item)
                if item.kind == "rejoined":
                    g.in_a_row = 0
                    self.set_state(g, TRAINING)
                    if self.config.check_identical:
                        threading.Thread(target=self.request_identity, name="ft-hash-check", daemon=True).start()
        if 0 in result.values:
            g.step = max(g.step, int(result.values[0].get("step", 0)))
        return result

    def request_identity(self) -> int | None:
        live = self.groups.training()
        by_index = {g.index: g for g in live}

        def ask(replica: int, step: int) -> bool:
            try:
                self.call(by_index[replica], "hash_at", step, timeout=5.0)
                return True
            except Exception:
                return False

        return self.identity.request([(g.index, g.step) for g in live], ask)

    # ---- watching ----------------------------------------------------------------------

    def watch(self, groups: list[ReplicaGroup] | None = None) -> None:
        """One supervisor thread per group (every group by default)."""
        for g in groups if groups is not None else list(self.groups):
            t = threading.Thread(target=self._watch_group, args=(g,), name=f"ft-supervise-{g.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def on_worker_failed(self, event: Any) -> None:
        """Session listener (Monarch's thread): hand the failure to the group's supervisor."""
        mesh = getattr(event, "mesh", "")
        if self.spares is not None and self.spares.failed(mesh, getattr(event, "reason", "process failed")):
            return
        g = self.groups.by_name(mesh)
        if g is None:
            return
        failure = Failure(getattr(event, "reason", "process failed"), getattr(event, "rank", None), time.time(),
                          "supervision")
        if getattr(event, "late", False) or not self.groups.signal_failure(g, failure):
            # Monarch's account of a failure we already act on: how the process died. The run's
            # history takes it as the explanation of that recovery.
            if self.session.events is not self.events:
                self._emit(event)

    def _watch_group(self, g: ReplicaGroup) -> None:
        while not self.stopping.is_set():
            g.wake.wait(self.config.poll_interval_s)
            g.wake.clear()
            if self.stopping.is_set() or getattr(self.session, "_closed", False) or g.state in TERMINAL:
                return
            try:
                failure = self.check(g)
                if failure is not None and not self.stopping.is_set() and g.state not in TERMINAL:
                    self.recover(g, failure)
            except Exception as e:  # never let the supervisor die silently
                log.exception("supervising %s: %s", g.name, e)
                self.stopping.wait(1.0)

    def _dead_rank(self, g: ReplicaGroup) -> Failure | None:
        """A pid check for ranks on this host: Monarch supervision usually reports a dead
        process first (with its exit status), but not always; this never misses one."""
        here = socket.gethostname()
        for rank, (pid, host) in enumerate(g.procs):
            if host == here and not pid_alive(pid):
                how = exit_status(pid) or "is gone"
                return Failure(f"process {pid} of rank {rank} {how} (found by pid check)", rank, time.time(), "pid")
        return None

    def check(self, g: ReplicaGroup) -> Failure | None:
        """Poll the group once; the failure, if it has failed."""
        failure = self.groups.take_failure(g)
        if failure is not None:
            return failure
        dead = self._dead_rank(g)
        if dead is not None:
            # No wait for Monarch's report of how it died: it may come later, and the run's
            # history then takes it as the explanation (see on_worker_failed).
            return dead
        # Short polls: a hung group is then noticed within hang_timeout_s + about one poll.
        result = self.poll(g, max(0.2, min(0.5, self.config.hang_timeout_s / 4)))
        now = time.monotonic()
        told = self.groups.take_failure(g)
        if told is not None:  # supervision spoke while we were waiting
            return told
        if result.errors:
            rank, err = sorted(result.errors.items())[0]
            return Failure(f"unreachable: {type(err).__name__}: {str(err)[:300]}", rank, time.time(), "endpoint")
        for rank, value in sorted(result.values.items()):
            if value.get("state") == "failed":
                return Failure(value.get("failure") or "trainer reported failure", rank, time.time(), "trainer")
        if not result.missing:
            g.last_answer = now
            if all(v.get("state") == "finished" for v in result.values.values()):
                self.set_state(g, FINISHED)
        elif now - g.last_answer > self.config.hang_timeout_s:
            return Failure(f"hang: no answer from ranks {result.missing} for {now - g.last_answer:.1f} s",
                           result.missing[0], time.time(), "hang")
        return None

    # ---- recovering --------------------------------------------------------------------

    def teardown(self, g: ReplicaGroup) -> None:
        """The failed group's processes gone: a hung process (GIL held) cannot answer a polite
        stop, so they are killed first."""
        t0 = time.monotonic()
        try:
            self.session.down(g.name, kill=True)
        except Exception as exc:
            log.debug("tearing down %s: %s", g.name, exc)
        self._emit(TornDown(replica=g.index, seconds=time.monotonic() - t0))

    def recover(self, g: ReplicaGroup, failure: Failure) -> None:
        fired = self._fired_time(g.index)
        self.ingest.expect_rejoin(g.index, fired or failure.t)
        self._emit(FailureDetected(t=failure.t, replica=g.index, rank=failure.rank, reason=failure.reason,
                                   detection_s=(failure.t - fired) if fired else None, source=failure.source))
        self.set_state(g, FAILED, failure.reason[:200])
        policy = self.config.restart
        while not self.stopping.is_set() and not getattr(self.session, "_closed", False):
            self.teardown(g)
            attempt = g.attempts + 1
            if not policy.allows(attempt):
                self._emit(GaveUp(replica=g.index, attempts=g.attempts))
                self.set_state(g, GAVE_UP, f"after {g.attempts} restarts")
                return
            g.in_a_row += 1  # reset when the group rejoins: a cause that persists backs off
            delay = policy.wait_before(g.in_a_row)
            if delay:
                self.set_state(g, FAILED, f"attempt {attempt} in {delay:g} s (attempt {g.in_a_row} in a row)")
                if self.stopping.wait(delay):
                    return
            g.attempts = attempt
            self.set_state(g, RESPAWNING, f"attempt {attempt}")
            t0 = time.time()
            try:
                self.acquire(g, t0)
                if self.stopping.is_set():
                    return
                self.start_training(g)
            except Exception as e:  # the respawn itself failed: counts as an attempt, try again
                if self.stopping.is_set():
                    return
                self._emit(FailureDetected(replica=g.index, rank=None, reason=f"respawn failed: {e}"[:300]))
                self.set_state(g, FAILED, f"respawn attempt {attempt} failed")
                continue
            self._emit(Respawned(replica=g.index, attempt=attempt, seconds=time.time() - t0))
            self.set_state(g, HEALING)
            g.last_answer = time.monotonic()
            return

    def acquire(self, g: ReplicaGroup, t0: float) -> None:
        """Processes and built trainers for ``g``: a ready spare if there is one, else fresh ones
        (spawned, or a new allocation). Records the ``acquired`` phase."""
        spare = self.spares.take() if self.spares is not None else None
        if spare is not None:
            self.adopt(g, spare)
            self._emit(Acquired(replica=g.index, how="spare", seconds=time.time() - t0))
            return
        acquired_s = self.spawn(g)
        how = "allocation" if self.placement.name == "slurm" else "spawn"
        self._emit(Acquired(t=t0 + acquired_s, replica=g.index, how=how, seconds=acquired_s))
        self.wait_ready(g, time.monotonic() + self.config.init_timeout_s)

    # ---- resizing ----------------------------------------------------------------------

    def add_group(self, g: ReplicaGroup) -> None:
        """A new group joins the running job (scale up): from a spare, else fresh processes; it
        heals from a peer at its first quorum, and its first committed step is recorded as its
        (re)join."""
        self.set_state(g, STARTING, "scale up")
        self.acquire(g, time.time())
        self.ingest.expect_rejoin(g.index, time.time())
        self.start_training(g)
        self.set_state(g, HEALING)
        g.last_answer = time.monotonic()
        self.watch([g])

    def retire(self, g: ReplicaGroup, timeout: float = 30.0) -> None:
        """The group leaves at a step boundary (scale down): recorded as retired, not failed."""
        self.set_state(g, RETIRING)
        self.call(g, "retire", timeout=10.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.session.deadline(g.actors, 5.0).poll.gather()
            if result.values and all(v.get("state") == "retired" for v in result.values.values()):
                break
            if result.errors or g.failure is not None:
                break
            time.sleep(0.05)
        self.set_state(g, RETIRED)
        g.wake.set()
        try:
            self.session.down(g.name)
        except Exception as exc:
            log.debug("stopping retired %s: %s", g.name, exc)

    # ---- stopping ----------------------------------------------------------------------

    def stop(self, timeout: float = 3.0) -> None:
        """Stop watching: every thread gets ``timeout`` in all (a respawn in progress notices
        the stop at its next poll); spares are killed (they hold no state worth keeping)."""
        self.stopping.set()
        for g in self.groups:
            g.wake.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.spares is not None:
            held = self.spares.stop()
            if held:
                self.session.down_many([s.mesh for s in held], kill=True)


def _trainer_class() -> type:
    from .trainer_actor import TrainerActor  # imports monarch and torch; kept out of module import time

    return TrainerActor
