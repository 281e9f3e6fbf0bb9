"""Supervision of replica groups: bring a group up, watch it, and bring it back when it fails.

One thread per group polls its trainers (events and state) under a deadline and decides the
group has failed in one of five ways (:class:`~monarch_nb.ft.control.groups.Failure`): Monarch
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
import os
import socket
import threading
import time
from typing import Any, Callable

from ...meshes import exit_status, gone, pid_alive
from ...stacks import innermost_functions
from ...telemetry.events import (
    Acquired,
    AllGroupsLost,
    CheckpointLoadFailed,
    Event,
    FailureDetected,
    ReplicaState,
    Resumed,
    TornDown,
    WorkerExitReported,
)
from ..spec.checkpoint_format import latest_complete
from ..spec.config import RunConfig
from ..spec.faults import ENDS_PROCESS
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
    WAITING,
    Failure,
    GroupTable,
    ReplicaGroup,
)
from ..record.ingest import EventIngest, HashReport, HashSkipped, unseen
from ..spec.platform import DEVICE_SLOT_ENV
from .identity import IdentityChecks
from .placement import Placement
from .policies import RecoveryPolicy, policy_for
from .spares import Spare, SparePool

log = logging.getLogger(__name__)
OVERLOAD_PATIENCE = 4  # hang timeouts a group may stay silent while most groups are (hang_deadline)
STARVED_PATIENCE = 8.0  # at most this many hang timeouts on an oversubscribed host (hang_deadline)
POLLS_PER_S = 32  # the controller's polls per second in all, once there are enough groups (poll_interval)
SPAWN_THREADS = 32  # groups brought up at once by spawn_all
RESUME_RETRY_S = 5.0  # after a failed checkpoint load, the next try (at a poll that finds a group waiting)
MAX_STACK_CHARS = 8000  # a stack kept with a failure event (its innermost frames are at the top)

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
                 lighthouse: Callable[[], str], fired_by: Callable[[int], str | None] = lambda pid: None) -> None:
        """``trainer_args(group, store_port)`` are TrainerActor's arguments (group None: a spare);
        ``lighthouse()`` is the Lighthouse's address now; ``fired_by(pid)`` the kind of fault a
        process recorded firing (the fault log), if any."""
        self.config, self.session, self.groups, self.placement = config, session, groups, placement
        self.ingest, self.identity, self._emit = ingest, identity, emit
        self.run_events: Any = getattr(emit, "__self__", None)  # the run's EventStore (emit is its append)
        self._fired_time, self._trainer_args, self._lighthouse = fired_time, trainer_args, lighthouse
        self._fired_by = fired_by
        self.checkpoint_dir: str | None = None  # set by the run when durable checkpoints are on
        self.log_dir: str | None = None  # where the workers write (the run's logs/); None: the session's
        self._lost_lock = threading.Lock()
        self._lost_episode = False  # reset once a group trains again
        self._resume_again_at: float | None = None  # a failed resume is tried again after this
        self._poll_deadlines: dict[int, float] = {}  # per group index; written by that group's thread only
        self._acks_lock = threading.Lock()  # never held across a call
        self._acks: dict[int, tuple[Any, dict[int, int]]] = {}  # group -> (its actors, rank -> last event held)
        self.host_load: Callable[[], float] = host_oversubscription
        self.spares: SparePool | None = None
        if config.spares:
            self.spares = SparePool(config.spares, self.build_spare, self.teardown_spare, emit)
        self.stopping = threading.Event()
        self.policy: RecoveryPolicy = policy_for(self)
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
        slot = int(mesh[len("replica"):]) if mesh.startswith("replica") else cfg.replicas + int(mesh[len("spare"):])
        env = {**WORKER_ENV, DEVICE_SLOT_ENV: str(slot), **cfg.env}
        handle = self.session.up(mesh, procs=cfg.group_size, env=env, timeout=60.0,
                                 log_dir=self.log_dir, **kwargs)
        acquired_s = time.monotonic() - t0
        handle.failure_action = self.failure_action(mesh)
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
        actors, procs, acquired_s = self._bring_up(g.name, f"trainer{g.index}", self.placement.up_kwargs(g.index),
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
        handle = self.session.rename(spare.mesh, g.name)
        handle.failure_action, handle.pid_watch = self.failure_action(g.name), False
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

    def start_training(self, g: ReplicaGroup, min_step: int = 0, resume_from: str | None = None) -> None:
        """Start ``g``'s training loop. ``min_step``: it may not train below the run's progress
        without a heal or a checkpoint; ``resume_from``: a durable checkpoint to load first.
        The group has just answered: its silence is counted from here, not from its spawn (a
        run's start takes minutes with 16 groups on two cores, and a slow first poll after it
        must not read as minutes of silence)."""
        self.call(g, "start", min_step, resume_from, timeout=120.0 if resume_from else 30.0)
        self.groups.touch(g, time.monotonic())

    def last_recorded_step(self) -> int:
        """The last committed step in the run's event log: the steps a restart loses are those the
        log shows committed since the checkpoint. (``progress()`` may be one ahead: a poll reads
        the trainer's step counter, which moves at the commit, just before that step's event is
        queued; a teardown right then takes the event with it.)"""
        if self.run_events is None:
            return self.progress()
        return max((e.step for e in self.run_events.recent("step") if e.committed), default=self.progress())

    def progress(self) -> int:
        """The run's last committed step, as far as the groups reported it."""
        return max((g.step for g in self.groups), default=0)

    # ---- telemetry ---------------------------------------------------------------------

    def poll(self, g: ReplicaGroup, timeout: float) -> Any:
        """One ``poll`` of every rank; its events are translated and recorded. Events are
        acknowledged with the next poll (per rank, for these processes), so none is lost when
        an answer comes after its deadline; each is recorded once (``ingest.unseen``)."""
        actors = g.actors
        with self._acks_lock:
            held = self._acks.get(g.index)
            if held is None or held[0] is not actors:  # new processes number their events from 1
                held = self._acks[g.index] = (actors, {})
            acked = dict(held[1])
        result = self.session.deadline(actors, timeout).poll.gather(acked)
        fresh = {}
        with self._acks_lock:  # two polls of a group at once (a stop's last one): each event once
            for rank, value in result.values.items():
                events, held[1][rank] = unseen(value, held[1].get(rank, 0))
                fresh[rank] = {**value, "events": events}
        for item in self.ingest.translate(g.index, fresh):
            if isinstance(item, HashReport):
                self.identity.record(item)
            elif isinstance(item, HashSkipped):
                self.identity.skipped(item)
            else:
                self._emit(item)
                if item.kind == "rejoined":
                    self.groups.rejoined(g)
                    with self._lost_lock:  # every group's thread reads it (_no_peer_left)
                        self._lost_episode = False
                    self.set_state(g, TRAINING)
                    if self.config.check_identical:
                        threading.Thread(target=self.request_identity, name="ft-hash-check", daemon=True).start()
        if 0 in result.values:
            self.groups.record_step(g, int(result.values[0].get("step", 0)))
        return result

    def request_identity(self) -> int | None:
        live = self.groups.training()
        by_index = {g.index: g for g in live}

        def ask(replica: int, step: int) -> bool | None:
            try:  # every rank armed (True), or some rank already past the step (False)
                result = self.call(by_index[replica], "hash_at", step, timeout=5.0)
            except Exception:
                return None
            if result.errors or result.missing:
                return None
            return all(result.values.values())

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
        forward = self.session.events is not self.run_events
        if isinstance(event, WorkerExitReported):
            # Monarch's account of how a process we tore down (or already act on) ended: the
            # run's history keeps it, as the explanation of a pid check's "is gone".
            if forward and self.groups.by_name(mesh) is not None:
                self._emit(event)
            return
        if self.spares is not None and self.spares.failed(mesh, getattr(event, "reason", "process failed")):
            return
        g = self.groups.by_name(mesh)
        if g is None:
            return
        failure = Failure(getattr(event, "reason", "process failed"), getattr(event, "rank", None), time.time(),
                          "supervision")
        self.groups.signal_failure(g, failure)
        if forward:  # the session reports each failed rank once; the run's own log has each too
            self._emit(event)

    def poll_interval(self) -> float:
        """Seconds between two polls of one group: ``poll_interval_s`` up to POLLS_PER_S / 4
        groups, then longer in proportion, so the controller's polling (Monarch messages, a
        few ms of CPU each) stays flat in R instead of growing with it; at most a quarter of
        the hang timeout, so a hang is still noticed in time."""
        cfg = self.config
        return min(max(cfg.poll_interval_s, len(self.groups.active()) / POLLS_PER_S), cfg.hang_timeout_s / 4)

    def _watch_group(self, g: ReplicaGroup) -> None:
        while not self.stopping.is_set():
            g.wake.wait(self.poll_interval())
            g.wake.clear()
            if self.stopping.is_set() or getattr(self.session, "_closed", False) or g.state in TERMINAL:
                return
            if self.policy.busy():  # every group is being restarted from disk by one thread
                continue
            if g.state in (HEALING, WAITING) and self._finish_if_run_is_over(g):
                return
            try:
                failure = self.check(g)
                if failure is not None and not self.stopping.is_set() and g.state not in TERMINAL:
                    self.recover(g, failure)
            except Exception as e:  # never let the supervisor die silently
                if self.stopping.is_set():  # a recovery cut short by stop(): nothing went wrong
                    log.debug("supervising %s: stopped during a recovery: %s", g.name, e)
                    return
                log.exception("supervising %s: %s", g.name, e)
                self.stopping.wait(1.0)

    def _dead_rank(self, g: ReplicaGroup) -> Failure | None:
        """A pid check for ranks on this host: Monarch supervision usually reports a dead
        process first (with its exit status), but not always; this never misses one."""
        here = socket.gethostname()
        for rank, (pid, host) in enumerate(g.procs):
            if host == here and not pid_alive(pid):
                how, found = exit_status(pid), "found by pid check"
                if how is None:
                    # Monarch's runtime reaps its children at once, so the exit status is usually
                    # gone; a process that wrote in the fault log that it fired a fault which
                    # ends a process ended the way that fault does.
                    kind = self._fired_by(pid)
                    how = ENDS_PROCESS.get(kind or "")
                    found += f"; it fired an injected {kind} fault, per the fault log" if how else ""
                return Failure(gone(pid, rank, how, found), rank, time.time(), "pid")
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
        # Short polls while answers are quick: a hung group is then noticed within hang_timeout_s
        # + about one poll; longer ones while they are slow (poll_deadline).
        deadline = self._poll_deadlines.get(g.index, self._poll_deadline_floor())
        result = self.poll(g, deadline)
        self._poll_deadlines[g.index] = next_poll_deadline(deadline, result, self._poll_deadline_floor(),
                                                           self.config.hang_timeout_s / 2)
        now = time.monotonic()
        told = self.groups.take_failure(g)
        if told is not None:  # supervision spoke while we were waiting
            return told
        if result.errors:
            dead = self._dead_rank(g)  # a call fails when its process died during it: say how it ended
            if dead is not None:
                return dead
            rank, err = sorted(result.errors.items())[0]
            return Failure(f"unreachable: {type(err).__name__}: {str(err)[:300]}", rank, time.time(), "endpoint")
        for rank, value in sorted(result.values.items()):
            if value.get("state") == "failed":
                return Failure(value.get("failure") or "trainer reported failure", rank, time.time(), "trainer")
        if any(v.get("state") == "waiting_for_peer" for v in result.values.values()):
            if g.state != WAITING:
                self.set_state(g, WAITING, "behind the run's progress, and its quorum has no peer that holds the "
                                           "run's state")
            self._no_peer_left()
        elif g.state == WAITING and result.values:
            # It trains again (a poll can carry its first committed step while the state it read
            # was still the wait's): back to what the events say it is.
            self.set_state(g, HEALING if self.ingest.awaiting_rejoin(g.index) else TRAINING)
        if not result.missing:
            self.groups.touch(g, now)
            if all(v.get("state") == "finished" for v in result.values.values()):
                self.set_state(g, FINISHED)
        elif now - g.last_answer > self.hang_deadline(now, g):
            t = time.time()
            return Failure(f"hang: no answer from ranks {result.missing} for {now - g.last_answer:.1f} s",
                           result.missing[0], t, "hang", stack=self.stack_of(g, result.missing[0]))
        return None

    def _poll_deadline_floor(self) -> float:
        return max(0.2, min(0.5, self.config.hang_timeout_s / 4))

    def hang_deadline(self, now: float, g: ReplicaGroup | None = None) -> float:
        """Seconds of silence after which a group is failed as hung: ``hang_timeout_s``, longer
        when the silence says more about the host than about the group (a process is failed for
        its own fault, never for being starved of CPU):

        * at least half of the (4 or more) training groups silent at once: an overloaded host or
          controller; failing them all would kill healthy groups and feed the overload with
          respawns: OVERLOAD_PATIENCE times as long;
        * ``g`` runs on this host and the host is oversubscribed (1-minute load over cores > 1):
          that many times as long, up to STARVED_PATIENCE. At 32 groups on two cores (load ~35)
          a healthy group went 7-8 s between answers while a spare was built, and 14 answering
          groups were failed as hung against 5 s. A hang is still caught, later on a starved host.
        """
        timeout = self.config.hang_timeout_s
        factor = 1.0
        silent, watched = self.groups.silent(now, timeout / 2)
        if watched >= 4 and silent >= watched / 2:
            factor = OVERLOAD_PATIENCE
        if g is not None and _runs_here(g):
            factor = max(factor, min(STARVED_PATIENCE, self.host_load()))
        return factor * timeout

    def _finish_if_run_is_over(self, g: ReplicaGroup) -> bool:
        """The other groups trained to the run's last step and stopped while ``g`` was out: no
        peer is left to heal from and nothing is left to train, so waiting for a quorum would
        go on for ever. ``g`` ends as finished (its processes stopped), and says why."""
        others = [h for h in self.groups if h is not g]
        if (self.config.steps is None or not any(h.state == FINISHED for h in others)
                or any(h.state in (TRAINING, STARTING) for h in others)):
            return False
        try:
            self.session.down(g.name, kill=True)
        except Exception as exc:
            log.debug("stopping %s: %s", g.name, exc)
        self.set_state(g, FINISHED, f"the run reached step {self.config.steps} while this group was out; "
                                    "its peers hold the final state")
        return True

    def stack_of(self, g: ReplicaGroup, rank: int) -> str:
        """Where a silent rank is stuck, read from outside (it cannot answer); kept with the
        failure, because the teardown that follows destroys the evidence."""
        try:
            stacks = self.session.stacks(g.name, [rank])
        except Exception as exc:  # no stack must not stop the recovery
            return f"(no stack: {exc})"
        return stacks[0].text[:MAX_STACK_CHARS]

    # ---- recovering --------------------------------------------------------------------

    def failure_action(self, mesh: str) -> str:
        """What this run does when a rank of ``mesh`` fails (the notice says it after the fault)."""
        if not mesh.startswith("replica"):
            return "the spare is discarded and another one built"
        return self.policy.action()

    def report(self, g: ReplicaGroup, failure: Failure) -> None:
        """The failure as the notebook shows it: one notice per failed rank, naming the fault
        (Monarch's own report, when it came first, is that notice; this adds none)."""
        cause = failure.reason
        where = innermost_functions(failure.stack) if failure.stack else []
        if where:
            cause += f"; stuck in {' < '.join(where)}"
        try:
            self.session.report_failure(g.name, failure.rank, cause)
        except Exception as exc:  # the notice must never stop a recovery
            log.debug("reporting the failure of %s: %s", g.name, exc)

    def teardown(self, g: ReplicaGroup) -> None:
        """The failed group's processes gone: a hung process (GIL held) cannot answer a polite
        stop, so they are killed first."""
        t0 = time.monotonic()
        try:
            self.session.down(g.name, kill=True)
        except Exception as exc:
            log.debug("tearing down %s: %s", g.name, exc)
        self._emit(TornDown(replica=g.index, seconds=time.monotonic() - t0))

    # ---- no live peer left -------------------------------------------------------------

    def _no_peer_left(self) -> None:
        """Some group waits for a peer to heal from (it is behind the run's progress) and no group
        trains: every group was lost. Resume from the newest complete durable checkpoint, or say
        once that the state is lost and leave the groups waiting for a state holder (they never
        train on from scratch unless the user asks: ``FTRun.restart_from_scratch``)."""
        with self._lost_lock:
            if any(g.state == TRAINING for g in self.groups):
                return
            first = not self._lost_episode
            if not first and (self._resume_again_at is None or time.monotonic() < self._resume_again_at):
                return
            self._lost_episode, self._resume_again_at = True, None
        checkpoint = latest_complete(self.checkpoint_dir) if self.checkpoint_dir else None
        step = self.progress()
        if checkpoint is None:
            self._emit(AllGroupsLost(step=step, checkpoint=None,
                                     detail=f"no live peer and no durable checkpoint: the model state of step {step} "
                                            "is lost; the groups wait for a state holder. run.restart_from_scratch() "
                                            "(%monarch restart --from-scratch) trains again from the initial weights; "
                                            "set checkpoint_every to survive this"))
            return
        if first:
            self._emit(AllGroupsLost(step=step, checkpoint=str(checkpoint.path),
                                     detail=f"no live peer: resuming from the checkpoint of step {checkpoint.step}"))
        waiting = [g for g in self.groups if g.state in (WAITING, HEALING)]
        failed: dict[int, str] = {}
        for g in waiting:
            for attempt in range(2):  # one retry: a load can lose a race with a poll
                try:
                    self.call(g, "load_checkpoint", str(checkpoint.path), timeout=60.0)
                    failed.pop(g.index, None)
                    break
                except Exception as exc:
                    failed[g.index] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if failed or not waiting:
            # Not resumed: say so, and try again in a while (a respawned group may take the load).
            self._emit(CheckpointLoadFailed(step=checkpoint.step, checkpoint=str(checkpoint.path),
                                            replicas=sorted(failed),
                                            error="; ".join(f"replica {r}: {e}" for r, e in sorted(failed.items()))
                                            or "no group was waiting to load it"))
            with self._lost_lock:
                self._resume_again_at = time.monotonic() + RESUME_RETRY_S
            return
        # The run's progress is the checkpoint's step now (the steps after it were lost):
        # groups respawned from here on may train from it, not wait for a step nobody holds.
        self.groups.rewind_progress(checkpoint.step)
        self._emit(Resumed(step=checkpoint.step, checkpoint=str(checkpoint.path), reason="all groups lost"))

    def restart_from_scratch(self) -> list[int]:
        """Every group was lost and no checkpoint exists: the groups waiting for a state holder
        train again from their initial weights (identical on every group: one seed), from
        step 0. Returns the groups told. Refused while any group holds the run's state."""
        holders = [g.index for g in self.groups if g.state == TRAINING]
        if holders:
            raise RuntimeError(f"restart_from_scratch: replica group(s) {', '.join(map(str, holders))} hold the "
                               "run's state and train: nothing is lost")
        waiting = [g for g in self.groups if g.state == WAITING]
        if not waiting:
            raise RuntimeError("restart_from_scratch: no group is waiting for a state holder (states: "
                               + ", ".join(f"replica{g.index}={g.state}" for g in self.groups) + ")")
        for g in waiting:
            self.call(g, "forget_progress", timeout=30.0)
        self.groups.rewind_progress(0)  # a group respawned from here on trains from the start as well
        return [g.index for g in waiting]

    # ---- recovery: one policy per mode (policies.py) ---------------------------------------

    def recover(self, g: ReplicaGroup, failure: Failure) -> None:
        """Bring the run back from ``g``'s failure, the way ``config.recovery`` says."""
        self.policy.recover(g, failure)

    def fired_time(self, g: ReplicaGroup) -> float | None:
        """When the fault behind ``g``'s failure was injected, if it was; asked once per failure
        (the injector hands each firing out once)."""
        return self._fired_time(g.index)

    def announce(self, g: ReplicaGroup, failure: Failure, fired: float | None) -> None:
        """Record that ``g`` failed: the event, with how long detection took when the fault was
        ours (``fired``)."""
        self._emit(FailureDetected(t=failure.t, replica=g.index, rank=failure.rank, reason=failure.reason,
                                   detection_s=(failure.t - fired) if fired else None, source=failure.source,
                                   stack=failure.stack))

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

    # ---- resizing ----------------------------------------------------------------------

    def add_group(self, g: ReplicaGroup) -> None:
        """A new group joins the running job (scale up): from a spare, else fresh processes; it
        heals from a peer at its first quorum, and its first committed step is recorded as its
        (re)join."""
        self.set_state(g, STARTING, "scale up")
        self.acquire(g, time.time())
        self.ingest.expect_rejoin(g.index, time.time())
        self.start_training(g, min_step=self.progress())
        self.set_state(g, HEALING)
        self.groups.touch(g, time.monotonic())
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

    def finish_groups(self, save_timeout: float, join_timeout: float = 3.0) -> None:
        """Before a stop: every group with live processes ends its step, leaves the quorum and
        completes a durable save still writing, so the newest checkpoint of a stopped run is
        complete (a torn one would be skipped on resume, losing up to ``checkpoint_every``
        steps) and no group is killed mid-collective. A save still writing after
        ``save_timeout`` s is abandoned (the worker reports it); then the last events are read.
        Groups in parallel, whatever their state: in restart mode the saver may be in any state
        when the stop comes."""
        with self.groups.lock:
            # not FAILED or RESPAWNING: their processes are dead or being replaced (no save in flight)
            groups = [g for g in self.groups if g.actors is not None
                      and g.state not in (FAILED, RESPAWNING, GAVE_UP, RETIRED)]

        def finish(g: ReplicaGroup) -> None:
            try:
                self.call(g, "finish", join_timeout, save_timeout, timeout=join_timeout + save_timeout + 2.0)
                self.poll(g, 0.5)
            except Exception as exc:
                log.debug("finishing %s: %s", g.name, exc)

        threads = [threading.Thread(target=finish, args=(g,), daemon=True) for g in groups]
        for t in threads:
            t.start()
        deadline = time.monotonic() + join_timeout + save_timeout + 3.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

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


def next_poll_deadline(current: float, result: Any, floor: float, cap: float) -> float:
    """How long the next poll of a group waits for its answers (as TCP sizes its retransmission
    timeout): doubled after a poll that some rank did not answer in time, three times the last
    full answer's latency after one that all answered; never under ``floor`` (a quick check on
    a quiet host) nor over ``cap`` (half the hang timeout: a real hang is still caught within
    1.5 hang timeouts). A late answer is dropped with its poll, so with a fixed deadline a group
    whose answers take just longer than it is silent for ever: at 32 groups on two cores, answers
    took 0.5-0.7 s against a 0.5 s deadline and 27 of 32 answering groups were failed as hung."""
    if result.errors:
        return current
    if result.missing:
        return min(cap, max(floor, current * 2))
    return min(cap, max(floor, 3 * result.seconds))


def host_oversubscription() -> float:
    """Runnable work per core on this host (1-minute load average over CPUs): above 1, each
    process gets less than a core, and a poll's answer waits its turn."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def _runs_here(g: ReplicaGroup) -> bool:
    here = socket.gethostname()
    return any(host == here for _, host in g.procs)
