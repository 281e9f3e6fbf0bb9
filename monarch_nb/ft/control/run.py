"""A fault-tolerant training run driven from the controller: ``FTRun``.

The run owns (or borrows) a :class:`monarch_nb.session.Session`, starts a torchft
Lighthouse in its own process and R replica groups, each a Monarch proc mesh named
``replica{r}`` of G processes running :class:`~monarch_nb.ft.worker.trainer_actor.TrainerActor`.
torchft decides quorum and moves state between peers; monarch_nb decides *when* a group has
failed and brings it back, and records every phase as typed events in
``<run_dir>/events.jsonl``.

This module is the run's lifecycle and public API. The work is done by collaborators, each
in its own module: :mod:`.supervisor` (bring groups up, detect failures, recover),
:mod:`.ingest` (worker telemetry -> typed events), :mod:`.identity` (bit-identical replicas),
:mod:`.injector` (faults on demand and on a schedule), :mod:`.placement` (where processes
run), :mod:`.groups` (the shared group table and its lock), :mod:`.recovery` and
:mod:`.history` (what the events mean).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ... import lifetime, views, worker_logs
from ...session import runs_root
from ...telemetry import EventStore
from ...telemetry.events import (
    CheckpointAbandoned,
    CheckpointSaved,
    Event,
    LighthouseFailed,
    LighthouseRestarted,
    LighthouseStarted,
    ReplicasIdentical,
    ReplicaState,
    RestartedFromScratch,
    Resumed,
    RunFinished,
    RunStarted,
    RunStopped,
    Scaled,
    Step,
)
from ..record.history import RunHistory
from ..record.ingest import EventIngest
from ..spec.checkpoint_format import CheckpointInfo, latest_complete, list_checkpoints
from ..spec.config import MAX_GROUPS, RESTARTS, RunConfig
from ..spec.faults import Fault, FaultKind, FaultSchedule, record_firing, refuse_corrupt_unless_striped
from ..spec.platform import check_gpu_sharing, select_platform
from .checkpoint_folder import checkpoint_root, claim, own_checkpoint, read_fingerprint, remove_torn, source_checkpoint
from .groups import FINISHED, GAVE_UP, HEALING, RETIRED, STARTING, STOPPED, TRAINING, GroupTable, ReplicaGroup
from .identity import IdentityChecks
from .injector import FaultInjector
from .lighthouse import Lighthouse, LighthouseSettings, join_timeout_for
from .placement import placement_for
from .plain_rendezvous import PlainRendezvous
from .supervisor import Supervisor

STOP_TIMEOUT_S = 3.0  # how long stop() waits for a group's polite stop before killing it
STOP_WAIT_S = 120.0  # a second stop() waits this long for the first (its saves have their own deadline)
SAVE_DEADLINE_MIN_S = 10.0  # stop() gives a save in flight at least this long...
SAVE_DEADLINE_FACTOR = 3.0  # ...or this many times the slowest save of the run
FINAL_SAVE_TIMEOUT_S = 600.0  # a finished run's last save (synchronous; a large model on a slow disk)


def save_deadline(save_seconds: list[float]) -> float:
    """How long a stop waits for a durable save in flight: long enough for any save this run
    has made so far, with room for a slower disk now."""
    return max([SAVE_DEADLINE_MIN_S] + [SAVE_DEADLINE_FACTOR * s for s in save_seconds])


@dataclasses.dataclass(frozen=True)
class StopReport:
    """What ``FTRun.stop()`` did: how long it took, the newest complete checkpoint left on
    disk, and any save it had to abandon (recorded as ``checkpoint_abandoned``)."""

    run_id: str
    seconds: float
    newest_checkpoint: int | None = None
    abandoned: tuple[CheckpointAbandoned, ...] = ()
    # where the seconds went, in order (they add up to ``seconds``)
    phases: tuple[tuple[str, float], ...] = ()

    def __str__(self) -> str:
        line = f"run {self.run_id} stopped in {self.seconds:.1f} s"
        if self.phases:
            line += " (" + ", ".join(f"{name} {secs:.1f} s" for name, secs in self.phases if secs >= 0.05) + ")"
        if self.newest_checkpoint is not None:
            line += f"; newest checkpoint: step {self.newest_checkpoint} (complete)"
        for a in self.abandoned:
            line += f"; the save of step {a.step} was abandoned: {a.reason}"
        return line

    __repr__ = __str__
LIGHTHOUSE_POLL_S = 0.25


class FTRun:
    """A fault-tolerant run; see the module docstring.

    Example::

        run = FTRun(RunConfig(replicas=3, group_size=1)).start()   # Lighthouse + 3 groups
        run.wait_for_step(10)
        run.inject("kill", replica=1)                  # also: rank=, at_step=N, after_s=S
        run.wait_for(lambda e: e.kind == "rejoined")   # block until the victim is back
        run.schedule(every=30, kinds=["kill", "exception", "comms"], seed=0)
        run.check_identical()                          # -> ReplicasIdentical event
        run.history().recoveries()                     # per-failure phases and figures
        run.stop()                                     # no process left behind
        open_run(run.run_dir)                          # later, from events.jsonl alone

    Args:
        config: what to run (:class:`RunConfig`); keyword ``overrides`` replace its fields.
        session: the controller session to run on; by default the run makes its own and
            shuts it down on ``stop()``.
        host_mesh_for: ``lambda r: HostMesh`` placing group ``r`` on a cluster job's hosts
            (e.g. slices of ``monarch.job.SlurmJob(...).state().hosts``); set
            ``advertise_host`` to an address the other hosts can reach.
    """

    def __init__(self, config: RunConfig | None = None, *, session: Any = None,
                 host_mesh_for: Callable[[int], Any] | None = None, _resume: Any = None, **overrides: Any) -> None:
        cfg = config or RunConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg.validate()
        self.placement = placement_for(self.config, host_mesh_for)
        if cfg.spares:
            self.placement.spare_kwargs()  # refuses a placement that cannot hold spares, before anything starts
        self.resume_from: CheckpointInfo | None = None
        if _resume is not None:  # FTRun.resume: the same run, its log continued
            self.run_dir, self.resume_from = _resume
            self.run_id = self.run_dir.name
            self.events = EventStore.open(self.run_dir / "events.jsonl", follow=True)
        else:
            self.run_id = cfg.run_name or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
            root = runs_root(cfg.runs_root)
            self.run_dir = root / self.run_id
            if self.run_dir.resolve().parent != root:  # validate() allows one plain component; never leave root
                raise ValueError(f"run_name: {self.run_id!r} would put the run outside {root}; a run name is one "
                                 "directory name")
            if (self.run_dir / "events.jsonl").exists():
                raise ValueError(f"run_name: {self.run_id!r} already exists under {root}; pick another name, or "
                                 f"continue that run: `%monarch train --resume {self.run_dir}` "
                                 "(FTRun.resume(run_dir))")
        self.checkpoint_dir = checkpoint_root(cfg.checkpoint_dir, self.run_dir)
        self.resume_source: str | None = None  # the run that wrote resume_from, when it is another run
        if _resume is None and cfg.resume_from:
            self.resume_from, self.resume_source = source_checkpoint(cfg.resume_from, cfg.model, cfg.group_size)
            _refuse_steps_at_or_below(cfg.steps, self.resume_from.step)
        try:  # before anything starts: this run's folder, writable, owned by no other run
            claim(self.checkpoint_dir, self.run_id, cfg.model, cfg.group_size, adopt=_resume is not None)
        except OSError as exc:
            raise ValueError(f"checkpoint_dir: {self.checkpoint_dir} is not writable ({exc.strerror or exc}); "
                             "pick a directory you can write") from None
        if _resume is None:
            self.events = EventStore(self.run_dir / "events.jsonl")
        self.fault_log = str(self.run_dir / "faults.jsonl")
        self._session = session
        self._own_session = session is None
        self.lighthouse: Lighthouse | None = None
        self.rendezvous: PlainRendezvous | None = None  # recovery="plain_restart" instead of a Lighthouse
        self.groups = GroupTable(cfg.replicas)
        self.identity = IdentityChecks(cfg.group_size, self.events.append)
        self.faults = FaultInjector(cfg.group_size, self.groups, self.fault_log, self._arm_fault,
                                    self._cluster_fault, self.events.append, lambda: self.started and not self.stopped)
        self.supervisor: Supervisor | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._scaling = threading.Lock()
        self._lighthouse_stop = threading.Event()
        self._dashboard: Any = None
        self.started = False
        self.stopped = False
        self._stop_report: StopReport | None = None
        self.data_dir: str | None = None
        self._finishing = threading.Lock()  # taken once, by the thread that ends a finished run
        self._stopper: int | None = None  # the thread that stops the run (a second stop() waits for it)
        self._stop_done = threading.Event()
        self._unwatch_finish: Callable[[], None] | None = None

    # ---- what is going on -------------------------------------------------------------

    @property
    def session(self) -> Any:
        return self._session

    @property
    def lighthouse_pid(self) -> int | None:
        return self.lighthouse.pid if self.lighthouse else None

    @property
    def spawned_pids(self) -> list[int]:
        """Every process this run started (workers and job hosts): none may outlive ``stop()``."""
        workers = self.supervisor.spawned_pids if self.supervisor else []
        return list(workers) + self.placement.extra_pids()

    @classmethod
    def resume(cls, run_dir: str | Path, *, session: Any = None, **overrides: Any) -> "FTRun":
        """Continue a run whose groups, Lighthouse or kernel were all lost, from its newest
        complete durable checkpoint: the same run id, the same ``events.jsonl`` (a ``resumed``
        event says from which step), the step counter and data position carried on. Call
        ``start()`` on the result. ``overrides`` change config fields (not the model)."""
        run_dir = Path(run_dir).resolve()
        log = run_dir / "events.jsonl"
        if not log.is_file():
            raise ValueError(f"resume: {run_dir} is not a run directory (no events.jsonl); pass the directory "
                             "a run wrote (run.run_dir)")
        started = EventStore.open(log).events(RunStarted)
        if not started:
            raise ValueError(f"resume: {log} records no run_started; it is not a fault-tolerant run's log")
        if overrides.get("resume_from"):
            raise ValueError("resume_from: FTRun.resume continues a run from its own checkpoints; to start a new "
                             "run from another run's checkpoint, pass resume_from to a new FTRun instead")
        fields = {f.name for f in dataclasses.fields(RunConfig)}
        saved = {k: v for k, v in started[-1].config.items() if k in fields}  # type: ignore[attr-defined]
        saved.update(overrides, resume_from=None)  # where it started from is history now
        cfg = RunConfig.from_dict(saved)
        root = checkpoint_root(cfg.checkpoint_dir, run_dir)
        own_checkpoint(root, run_dir.name)
        checkpoint = latest_complete(root)
        if checkpoint is None:
            incomplete = len(list_checkpoints(root))
            extra = f" ({incomplete} incomplete: interrupted mid-write)" if incomplete else ""
            raise ValueError(f"resume: no complete checkpoint under {root}{extra}; a run writes them with "
                             "RunConfig(checkpoint_every=K), and when it finishes its steps")
        meta = read_fingerprint(checkpoint)
        for key in ("model", "group_size"):
            if meta.get(key) != getattr(cfg, key):
                raise ValueError(f"resume: the checkpoint of step {checkpoint.step} was written with {key}="
                                 f"{meta.get(key)!r}, this config has {key}={getattr(cfg, key)!r}")
        _refuse_steps_at_or_below(cfg.steps, checkpoint.step)
        return cls(cfg, session=session, _resume=(run_dir, checkpoint))

    def history(self) -> RunHistory:
        return RunHistory(self.events, self.run_dir)

    # ---- seeing inside the workers ----------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        """Every worker's output, one file per group and rank (``replica1-rank0.log``)."""
        return self.run_dir / "logs"

    def _group(self, replica: int) -> ReplicaGroup:
        g = self.groups.by_name(f"replica{replica}") if isinstance(replica, int) else None
        if g is None:
            known = ", ".join(str(x.index) for x in self.groups) or "none"
            raise ValueError(f"replica: {replica!r} is not a replica group of run {self.run_id}; groups: {known}")
        return g

    def logs(self, replica: int | None = None, rank: int | None = None, grep: str | None = None,
             tail: int = 40) -> worker_logs.LogView:
        """The workers' log lines (of one group and rank, containing ``grep``), aggregated; the
        full text is in ``log_dir``."""
        mesh = self._group(replica).name if replica is not None else None
        return worker_logs.view(self.log_dir, mesh, rank, grep, tail)

    def stacks(self, replica: int, ranks: list[int] | None = None) -> list[Any]:
        """The Python stacks of a group's ranks (``Session.stacks``; py-spy from outside)."""
        g = self._group(replica)
        if self._session is None or g.state in (STOPPED, GAVE_UP, RETIRED) or g.name not in self._session.meshes:
            raise ValueError(f"replica: group {replica} has no live processes (it is {g.state}); "
                             f"its output is in {self.log_dir}")
        return self._session.stacks(g.name, ranks)

    def status(self) -> dict[int | str, dict[str, Any]]:
        """Per group: state, last committed step, restarts so far, worker pids; and per warm
        spare (keys ``spare0``, ...): building or ready, and its pids."""
        out: dict[int | str, dict[str, Any]] = dict(self.groups.status())
        if self.supervisor is not None and self.supervisor.spares is not None:
            out.update(self.supervisor.spares.status())
        return out

    def restart_from_scratch(self) -> RestartedFromScratch:
        """After every group was lost with no durable checkpoint (``all_groups_lost``), the groups
        wait for a state holder rather than train on from scratch unasked. This is the way out:
        they train again from the initial weights (identical on every group) from step 0; the
        event log records what was lost. Refused while any group holds the run's state."""
        if not self.started or self.stopped or self.supervisor is None:
            raise RuntimeError("restart_from_scratch: the run is not running")
        lost = self.supervisor.progress()
        told = self.supervisor.restart_from_scratch()
        event = RestartedFromScratch(lost_step=lost, replicas=told)
        self.events.append(event)
        return event

    # ---- elastic resize -----------------------------------------------------------------

    def scale(self, replicas: int, timeout: float | None = None) -> Scaled:
        """Resize the run to ``replicas`` groups while it trains: new groups come from warm spares
        first, else fresh processes, and heal from a peer; surplus groups (the newest first) leave
        at a step boundary and are recorded as retired, not failed. Blocks until done."""
        cfg = self.config
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise ValueError(f"replicas: must be an integer, got {replicas!r}")
        if not self.started or self.stopped or self.supervisor is None:
            raise RuntimeError("scale: the run is not running (start() it first; a stopped run cannot be resized)")
        if cfg.recovery == "plain_restart":
            raise ValueError("scale: a plain_restart job has a fixed world size (one process group over every "
                             "group, as under torchrun); resize a run with recovery='peer'")
        if not cfg.min_replicas <= replicas <= MAX_GROUPS - cfg.spares:
            raise ValueError(f"replicas: {replicas} is not allowed; allowed: {cfg.min_replicas} (min_replicas) "
                             f"to {MAX_GROUPS - cfg.spares}")
        if not self._scaling.acquire(blocking=False):
            raise RuntimeError("scale: a scale is already in progress; wait for it to finish")
        try:
            active = self.groups.active()
            added: list[int] = []
            retired: list[int] = []
            if replicas > len(active):
                for _ in range(replicas - len(active)):
                    g = self.groups.add()
                    self.supervisor.add_group(g)
                    added.append(g.index)
                if timeout is not None:
                    self.wait_for_step(max(g.step for g in active) + 1, replicas=added, timeout=timeout)
            for g in sorted(active, key=lambda g: -g.index)[:max(0, len(active) - replicas)]:
                self.supervisor.retire(g)
                retired.append(g.index)
            event = Scaled(replicas=replicas, added=added, retired=retired)
            self.events.append(event)
            return event
        finally:
            self._scaling.release()

    # ---- start ------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> "FTRun":
        """Start the Lighthouse and every replica group; returns once all groups train."""
        if self.started:
            raise RuntimeError("this run was already started; create a new FTRun to run again")
        cfg = self.config
        if cfg.job in ("local", "process"):  # every group on this host: NCCL needs a GPU per rank
            platform = select_platform(cfg.platform, backend=cfg.backend)
            if platform.device_type != "cpu":
                import torch

                check_gpu_sharing(platform, cfg.replicas + cfg.spares, cfg.group_size, torch.cuda.device_count())
        self.started = True
        from ..spec.tinydata import ensure_tinydata

        self.data_dir = str(Path(cfg.data_dir) if cfg.data_dir else ensure_tinydata())
        self.events.append(RunStarted(run_id=self.run_id, config={**cfg.to_dict(), "run_dir": str(self.run_dir)}))
        if self.resume_from is not None:
            named = cfg.resume_from is not None and self.resume_source != self.run_id
            self.events.append(Resumed(step=self.resume_from.step, checkpoint=str(self.resume_from.path),
                                       reason=f"resume_from {cfg.resume_from}" if named else "FTRun.resume",
                                       source_run=self.resume_source if named else None))
        try:
            if self._session is None:
                from ...session import Session

                self._session = Session(events=self.events)
            lifetime.on_exit(self.stop, "interpreter exit")  # runs before the session's own release
            join_ms = cfg.join_timeout_ms
            if self.placement.shares_this_host:
                join_ms = join_timeout_for(join_ms, (cfg.replicas + cfg.spares) * cfg.group_size, os.cpu_count() or 1)
            if cfg.recovery == "plain_restart":  # no torchft: the job's store instead of a Lighthouse
                self.rendezvous = PlainRendezvous(self.placement.bind_host)
            else:
                self.lighthouse = Lighthouse(LighthouseSettings(
                    bind=f"{self.placement.bind_host}:0", min_replicas=cfg.min_replicas,
                    join_timeout_ms=join_ms, quorum_tick_ms=cfg.quorum_tick_ms,
                    heartbeat_timeout_ms=cfg.heartbeat_timeout_ms)).start()
                self.events.append(LighthouseStarted(address=self.lighthouse.address or "?",
                                                     pid=self.lighthouse.pid, join_timeout_ms=join_ms))
            sup = self.supervisor = Supervisor(cfg, self._session, self.groups, self.placement,
                                               EventIngest(cfg.group_size), self.identity, self.events.append,
                                               self.faults.fired_time, self._trainer_args,
                                               lambda: self.lighthouse.address, fired_by=self.faults.fired_by)
            if cfg.checkpoint_every or cfg.recovery in RESTARTS:
                sup.checkpoint_dir = str(self.checkpoint_dir)
            sup.log_dir = str(self.log_dir)
            self._unsubscribe = self._session.on_failure(sup.on_worker_failed)
            for g in self.groups:
                sup.set_state(g, STARTING)
            sup.spawn_all(list(self.groups))
            deadline = time.monotonic() + (timeout or cfg.init_timeout_s)
            for g in self.groups:
                sup.wait_ready(g, deadline)
            resume = str(self.resume_from.path) if self.resume_from is not None else None
            for g in self.groups:
                sup.start_training(g, resume_from=resume)
                sup.set_state(g, TRAINING)
        except BaseException:
            self.stop(reason="failed to start")
            raise
        if cfg.steps is not None:
            self._unwatch_finish = self.events.subscribe(self._on_finished_group)
        sup.watch()
        if self.lighthouse is not None:
            threading.Thread(target=self._watch_lighthouse, name="ft-lighthouse-watch", daemon=True).start()
        if sup.spares is not None:
            sup.spares.fill()  # in the background, after the groups: they compete for the same cores
        return self

    # ---- a finished run -----------------------------------------------------------------

    def _on_finished_group(self, event: Event) -> None:
        """Event observer (the emitting thread): once every group has reached ``steps``, the
        run ends itself in a thread of its own."""
        if not (isinstance(event, ReplicaState) and event.state == FINISHED) or self.stopped:
            return
        groups = list(self.groups)
        if any(g.state not in (FINISHED, GAVE_UP, RETIRED) for g in groups) or not any(
                g.state == FINISHED for g in groups):
            return
        if self._finishing.acquire(blocking=False):
            threading.Thread(target=self._finish, name="ft-finish", daemon=True).start()

    def _finish(self) -> None:
        """Every group reached ``steps``: save the final state into the run's own checkpoint
        folder (periodic checkpoints on or off, as torchtitan saves its last step), then let
        the workers, spares and Lighthouse go. History, checkpoints and dashboard stay, and
        ``FTRun.resume`` continues the run for more steps. If no group can save, the groups
        stay up (their memory is the only copy) and ``run_finished`` carries the error."""
        sup = self.supervisor
        assert sup is not None
        t0 = time.monotonic()
        # (a group that finished while out, after its peers, had its processes stopped: no state)
        finished = sorted((g for g in self.groups if g.state == FINISHED and g.actors is not None
                           and g.name in self._session.meshes), key=lambda g: g.index)
        checkpoint, step, digest, errors = None, max((g.step for g in finished), default=0), "", []
        if self.config.checkpoint_every:  # a periodic save of the last step may still be writing
            try:
                sup.at_once(finished, lambda g: sup.call(g, "settle_saves", timeout=FINAL_SAVE_TIMEOUT_S), "ft-settle")
            except Exception as exc:  # a group that cannot answer is skipped below as well
                errors.append(f"settling periodic saves: {type(exc).__name__}: {exc}"[:300])
        for g in finished:
            try:
                result = sup.call(g, "save_final", timeout=FINAL_SAVE_TIMEOUT_S)
            except Exception as exc:
                errors.append(f"replica {g.index}: {type(exc).__name__}: {exc}"[:300])
                continue
            if result.errors or result.missing:
                errors.append(f"replica {g.index}: {next(iter(result.errors.values()), 'no answer')}"[:300])
                continue
            record = result.values[0]
            step, checkpoint, digest = int(record["step"]), str(record["path"]), str(record.get("digest", ""))
            break
        self.events.append(RunFinished(step=step, checkpoint=checkpoint, seconds=time.monotonic() - t0, digest=digest,
                                       error="; ".join(errors) if checkpoint is None else ""))
        if checkpoint is not None and not self.stopped:
            self.stop(reason="finished")

    def _trainer_args(self, g: ReplicaGroup | None, store_port: int | None) -> tuple:
        """TrainerActor's arguments for group ``g``, or for a warm spare (``g`` None: no replica
        and no Lighthouse until it is activated)."""
        worker_cfg = {**self.config.to_dict(), "respawn": None, "run_id": self.run_id,
                      "checkpoint_dir": str(self.checkpoint_dir),
                      "advertise_host": self.config.advertise_host or self.placement.advertise_host}
        if g is None:
            return (worker_cfg, None, None, store_port, self.data_dir, self.fault_log, 0)
        return (worker_cfg, g.index, self._coordinator(g), store_port, self.data_dir, self.fault_log, g.attempts)

    def _coordinator(self, g: ReplicaGroup) -> str:
        """Where group ``g`` finds the others: the Lighthouse, or (plain_restart) the job's store
        with the job's generation - every failure restarts all groups, so their attempt counts
        move together and one start of the job is one generation."""
        if self.rendezvous is not None:
            return self.rendezvous.address(g.attempts)
        assert self.lighthouse is not None and self.lighthouse.address
        return self.lighthouse.address

    def _watch_lighthouse(self) -> None:
        """The Lighthouse is watched like any other process: if it dies it is restarted on the
        same address, and the groups' Managers find it again at their next quorum."""
        lighthouse = self.lighthouse
        assert lighthouse is not None
        while not self._lighthouse_stop.wait(LIGHTHOUSE_POLL_S):
            status = lighthouse.exit_status()
            if status is None:
                continue
            self.events.append(LighthouseFailed(address=lighthouse.address or "?", pid=lighthouse.pid,
                                                reason=f"the torchft Lighthouse (pid {lighthouse.pid}) {status}: "
                                                       "the groups cannot form a quorum until it is back"))
            t0 = time.monotonic()
            delay = 0.0
            while not self._lighthouse_stop.is_set():
                try:
                    lighthouse.stop()  # reap the dead process
                    lighthouse.start()
                except Exception as exc:  # the port may still be held for a moment: try again
                    delay = min(5.0, max(0.2, delay * 2))
                    self._lighthouse_stop.wait(delay)
                    last_error = str(exc)
                    if time.monotonic() - t0 > 60:
                        self.events.append(LighthouseFailed(address=lighthouse.address or "?", pid=None,
                                                            reason=f"could not restart the Lighthouse: {last_error}"))
                        return
                    continue
                self.events.append(LighthouseRestarted(address=lighthouse.address or "?", pid=lighthouse.pid,
                                                       seconds=time.monotonic() - t0))
                break

    # ---- faults -----------------------------------------------------------------------

    def inject(self, kind: str | FaultKind, replica: int = 0, rank: int = 0, *, at_step: int | None = None,
               after_s: float | None = None, hang_s: float = 30.0, during: str | None = None) -> Fault:
        """Arm a fault in one process of one replica group.

        ``at_step=N`` fires inside step N; ``after_s=S`` fires in the first step after S
        seconds; ``during=PHASE`` fires when the process next enters that phase of a quorum
        or heal (``faults.PHASES``: quorum, pg_setup, heal_send, heal_recv); none: the next
        step. Validated before anything is sent; a target that is not training or healing is
        refused, naming the groups that are. ``corrupt`` needs ``heal_transport="striped"``.
        """
        refuse_corrupt_unless_striped(kind, self.config.heal_transport)
        if at_step is not None and self.config.steps is not None and at_step > self.config.steps:
            raise ValueError(f"at_step: {at_step} is past the run's last step (steps={self.config.steps}); it would "
                             f"never fire; allowed: up to {self.config.steps}")
        return self.faults.inject(kind, replica, rank, at_step=at_step, after_s=after_s, hang_s=hang_s,
                                  during=during)

    def disarm(self) -> int:
        """Drop every armed fault that has not fired yet (in every training or healing group);
        returns how many were dropped."""
        dropped = 0
        for g in self.groups.active():
            if g.actors is None or g.state not in (TRAINING, HEALING):
                continue
            try:
                result = self._session.deadline(g.actors, 10.0).disarm.call()
                dropped += sum(result.values.values())
            except Exception:
                continue  # a group that cannot answer has no fault left to fire
        return dropped

    def schedule(self, every: float, kinds: Any = ("kill",), seed: int | None = None,
                 max_faults: int | None = None, rank: int | None = None, at_once: int = 1,
                 keep: int = 1) -> FaultSchedule:
        """Every ``every`` seconds inject a random fault kind into ``at_once`` random training
        groups together (waves); the last training group is never taken down, nor any below
        ``keep`` training groups (a wave that finds groups still recovering is smaller or skipped)."""
        return self.faults.schedule(every, kinds, seed=seed, max_faults=max_faults, rank=rank, at_once=at_once,
                                    keep=keep)

    def stop_schedule(self) -> None:
        self.faults.stop_schedule()

    def _arm_fault(self, fault: Fault) -> int | None:
        g = self.groups[fault.replica]
        actors = g.actors.slice(gpus=fault.rank) if self.config.group_size > 1 else g.actors
        res = self._session.deadline(actors, 10.0).inject.call(fault.kind.value, fault.at_step, fault.hang_s,
                                                               fault.during)
        return next(iter(res.values.values()), None)

    def _cluster_fault(self, fault: Fault) -> int | None:
        """preempt / node_down: through the scheduler holding the group's allocation."""
        g = self.groups[fault.replica]
        allocation = self._session.mesh(g.name).allocation
        if not hasattr(allocation, "preempt"):
            raise ValueError(f"kind: {fault.kind.value} needs a run on SLURM allocations (job='slurm'); "
                             f"this run's job is {self.config.job!r}")
        record_firing(self.fault_log, {"kind": "fault_fired", "fault": fault.kind.value, "replica": fault.replica,
                                       "rank": fault.rank, "step": g.step, "job_id": allocation.job_id})
        if fault.kind is FaultKind.PREEMPT:
            allocation.preempt()
        else:
            allocation.down_node()
        return g.step

    # ---- identical replicas ------------------------------------------------------------

    def check_identical(self, timeout: float = 60.0) -> ReplicasIdentical | None:
        """Compare digests of every training group at a common future step; blocks until recorded.
        None when fewer than two groups are training."""
        target = self.supervisor.request_identity() if self.supervisor else None
        if target is None:
            return None
        return self.events.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.step == target,
                                    timeout=timeout, what=f"an identity verdict at step {target}")  # type: ignore[return-value]

    # ---- waiting ----------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 60.0, *, since: float = 0.0,
                 what: str | None = None) -> Event:
        """Block until an event satisfying ``predicate`` (recorded at or after ``since``) exists;
        a ``TimeoutError`` names ``what`` (default: the predicate's source) and the last events."""
        return self.events.wait_for(predicate, timeout, since=since, what=what)

    def wait_for_step(self, step: int, replicas: list[int] | None = None, timeout: float = 120.0) -> None:
        """Block until the given groups committed ``step``; by default every live group (the
        retired and given-up ones are no longer part of the run)."""
        want = set(replicas if replicas is not None else [g.index for g in self.groups.live()])
        done: set[int] = set()

        def pred(e: Event) -> bool:
            if isinstance(e, Step) and e.committed and e.step >= step and e.replica in want:
                done.add(e.replica)
            return done >= want

        self.events.wait_for(pred, timeout, what=f"step {step} committed by groups {sorted(want)}")

    # ---- stop -------------------------------------------------------------------------

    def stop(self, reason: str = "stopped", save_timeout: float | None = None) -> "StopReport":
        """Stop every group, the Lighthouse and (if we made it) the session. Idempotent.

        A durable save still writing gets ``save_timeout`` seconds to complete (default: 3x the
        slowest save of this run, at least 10 s); one that cannot is recorded as
        ``checkpoint_abandoned`` and its directory removed, so the newest checkpoint on disk is
        always complete. The report says which, and how long the stop took."""
        if self.stopped:  # again, or while another thread stops it (a finished run stops itself): wait for it
            if self._stopper != threading.get_ident():
                self._stop_done.wait(STOP_WAIT_S)
            return self._stop_report or StopReport(run_id=self.run_id, seconds=0.0)
        self.stopped = True
        self._stopper = threading.get_ident()
        try:
            return self._stop(reason, save_timeout)
        finally:
            self._stop_done.set()

    def _stop(self, reason: str, save_timeout: float | None) -> "StopReport":
        t0 = time.monotonic()
        phases: list[tuple[str, float]] = []
        mark = [t0]

        def phase(name: str) -> None:
            now = time.monotonic()
            phases.append((name, now - mark[0]))
            mark[0] = now

        if self._unwatch_finish is not None:
            self._unwatch_finish()
        lifetime.cancel(self.stop)
        self.faults.stop_schedule()
        self._lighthouse_stop.set()
        if save_timeout is None:
            save_timeout = save_deadline([e.seconds for e in self.events.recent(CheckpointSaved)])
        if self.supervisor is not None:
            self.supervisor.stop(timeout=STOP_TIMEOUT_S)
            phase("supervisor")
            self.supervisor.finish_groups(save_timeout, join_timeout=STOP_TIMEOUT_S)
            phase("finish")  # each group ends its step, leaves the quorum, completes its save
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._session is not None and self.supervisor is not None:
            # All groups at once, each bounded. On this machine (and its virtual SLURM nodes) a
            # group's processes are killed: its saves are finished or abandoned above, and its
            # logs are written unbuffered, so nothing is lost, while Monarch's polite stop of a
            # trainer took 2.4 s idle and 4.4 s in a loaded kernel. Elsewhere Monarch's polite
            # stop, and a hung group (GIL held), which cannot answer it, is killed after
            # STOP_TIMEOUT_S.
            meshes = self._session.meshes
            names = [g.name for g in self.groups if g.name in meshes]
            here = [n for n in names if meshes[n].local]
            self._session.down_many(here, timeout=STOP_TIMEOUT_S, kill=True)
            self._session.down_many([n for n in names if n not in here], timeout=STOP_TIMEOUT_S)
            for g in self.groups:
                if g.state not in (GAVE_UP, RETIRED, FINISHED):
                    self.supervisor.set_state(g, STOPPED)
            phase("groups")
        abandoned = self._remove_torn_checkpoints()
        self.placement.close()
        if self.lighthouse is not None:
            self.lighthouse.stop()
        if self.rendezvous is not None:
            self.rendezvous.stop()
        phase("lighthouse")
        self.events.append(RunStopped(run_id=self.run_id, reason=reason))
        self._draw_final_dashboard()
        phase("dashboard")
        newest = latest_complete(self.checkpoint_dir)  # this run's own folder (checkpoint_owner)
        if self._own_session and self._session is not None:
            try:
                self._session.shutdown()  # closes self.events too (it was handed over)
            except Exception:
                pass
            phase("session")
        self._stop_report = StopReport(run_id=self.run_id, seconds=time.monotonic() - t0,
                                       newest_checkpoint=newest.step if newest else None,
                                       abandoned=tuple(abandoned), phases=tuple(phases))
        self.events.close()
        return self._stop_report

    def _draw_final_dashboard(self) -> None:
        """The stopped state drawn while the stopping cell runs: a notebook executed headless
        (nbclient) records a displayed dashboard's static copy only from messages sent while a
        cell executes, and the dashboard's own thread drew the stop after the cell had ended, so
        the saved notebook showed the run as it was when the dashboard was shown."""
        dash = self._dashboard
        if dash is None or dash.closed:
            return
        try:
            dash.flush()
        except Exception:  # the UI never stands in the way of a stop
            pass

    def _remove_torn_checkpoints(self) -> list[CheckpointAbandoned]:
        """Once every writer is gone: remove saves that never completed, each recorded once
        (a worker that gave up on its save already reported it, with its reason)."""
        reported = {e.step: e for e in self.events.recent(CheckpointAbandoned)}
        out = []
        for torn in remove_torn(self.checkpoint_dir):
            event = reported.get(torn.step)
            if event is None:
                event = CheckpointAbandoned(step=torn.step, reason="its write had not finished when the run "
                                            "stopped (no COMPLETE marker): removed")
                self.events.append(event)
            out.append(event)
        return out

    def __enter__(self) -> "FTRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def dashboard(self) -> Any:
        """The run's live dashboard; one per run, so calling this again never doubles the UI cost."""
        if self._dashboard is None or self._dashboard.closed:
            self._dashboard = views.build("dashboard", self.events, controls=self)
        return self._dashboard

    def __repr__(self) -> str:
        states = ", ".join(f"{g.name}={g.state}@{g.step}" for g in self.groups)
        return f"FTRun({self.run_id}: {states})"


def _refuse_steps_at_or_below(steps: int | None, checkpoint_step: int) -> None:
    """A resumed run trains on from its checkpoint: ``steps`` (the last step) must lie beyond it."""
    if steps is not None and steps <= checkpoint_step:
        raise ValueError(f"steps: the checkpoint is at step {checkpoint_step} and steps={steps} would train none; "
                         f"pass steps > {checkpoint_step} (`--steps {checkpoint_step + 50}`), or None to train "
                         "until stopped")


def open_run(path: str | Path) -> RunHistory:
    """Reopen a finished or interrupted run from its directory (or its events.jsonl)."""
    store = EventStore.open(path)
    run_dir = Path(path) if Path(path).is_dir() else Path(path).parent
    return RunHistory(store, run_dir)
