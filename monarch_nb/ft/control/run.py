"""A fault-tolerant training run driven from the controller: ``FTRun``.

The run owns (or borrows) a :class:`monarch_nb.session.Session`, starts a torchft
Lighthouse in its own process and R replica groups, each a Monarch proc mesh named
``replica{r}`` of G processes running :class:`~monarch_nb.ft.worker.trainer_actor.TrainerActor`.
torchft decides quorum and moves state between peers; monarch_nb decides *when* a group has
failed and brings it back, and records every phase as typed events in
``<run_dir>/events.jsonl``.

This module is the run's lifecycle and public API. The work is done by collaborators, each
in its own module: :mod:`.opening` (a new or resumed run's checks), :mod:`.supervisor` (bring
groups up, detect failures, recover), :mod:`.coordinator` (the Lighthouse, kept up),
:mod:`.finish` (a finished run's final save), :mod:`.stopping` (the stop and its report),
:mod:`.scaling` (elastic resize), :mod:`.identity` (bit-identical replicas), :mod:`.injector`
and :mod:`.fault_delivery` (faults on demand and on a schedule), :mod:`.placement` (where
processes run), :mod:`.groups` (the shared group table and its lock), and in ``record/``
ingest, recovery and history (what the events mean).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ... import lifetime, views
from ...telemetry import EventStore
from ...telemetry.events import Drained, ReplicasIdentical, RestartedFromScratch, RunStarted, Scaled
from ..record.history import RunHistory
from ..record.ingest import EventIngest
from ..settings.checkpoint_format import CheckpointInfo
from ..settings.config import RESTARTS, RunConfig, meeting_period, meets_every
from ..settings.faults import Fault, FaultKind, FaultSchedule, refuse_corrupt_unless_striped
from ..settings import titan_job
from ..settings.platform import check_gpu_sharing, select_platform
from .coordinator import Coordinator
from .fault_delivery import FaultDelivery
from .finish import FinishWatch
from .groups import GAVE_UP, RETIRED, STARTING, STOPPED, TRAINING, GroupTable, ReplicaGroup
from .identity import IdentityChecks
from .injector import FaultInjector
from .ladder import communicator_at_once
from .lighthouse import Lighthouse
from .opening import claim_checkpoint_folder, new_run, resume_point, resumed_run
from .placement import placement_for
from .run_log import FromTheLog
from .host_placement import HOST_ENV
from .run_client import RunClient, attach, resume_detached, start_detached
from .plain_rendezvous import PlainRendezvous
from .scaling import Scaler
from .node_drains import node_drain_watch
from .stragglers import watch_stragglers
from .stopping import SAVE_DEADLINE_MIN_S, ShownView, StopReport, StopSequence, save_deadline
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ...session import Session
    from ...stacks import Stack

__all__ = ["FTRun", "SAVE_DEADLINE_MIN_S", "StopReport", "open_run", "save_deadline"]


class FTRun(FromTheLog):
    """A fault-tolerant run; see the module docstring.

    Example::

        run = FTRun(RunConfig(replicas=3)).start()     # Lighthouse + 3 groups, in this kernel
        run.inject("kill", replica=1); run.wait_for(lambda e: e.kind == "rejoined")
        run.check_identical(); run.history().recoveries(); run.stop()
        FTRun.detached(RunConfig(run_name="keep")); FTRun.attach("keep")   # a run that outlives it

    Args:
        config: what to run: a :class:`RunConfig`, or torchtitan 0.3's ``Trainer.Config`` (as a config
            registry function returns it; every field honoured or refused by name, see
            ``monarch_nb.ft.settings.titan_job``); keyword ``overrides`` replace its fields.
        session: the controller session to run on; by default the run makes its own and
            shuts it down on ``stop()``.
        host_mesh_for: ``lambda r: HostMesh`` placing group ``r`` on a cluster job's hosts
            (e.g. slices of ``monarch.job.SlurmJob(...).state().hosts``); set
            ``advertise_host`` to an address the other hosts can reach.
    """

    def __init__(self, config: RunConfig | Any | None = None, *, session: Session | None = None,
                 host_mesh_for: Callable[[int], Any] | None = None,
                 _resume: tuple[Path, CheckpointInfo] | None = None, **overrides: Any) -> None:
        if titan_job.is_titan_config(config):  # torchtitan 0.3's Trainer.Config, built in Python
            config, overrides = titan_job.run_config_of(config, **overrides), {}
        cfg = config or RunConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg.validate()
        if cfg.controller_on == "cluster" and HOST_ENV not in os.environ:
            raise ValueError("controller_on='cluster': the run's controller lives on its cluster (a SLURM job, a "
                             "Kubernetes pod), not in this process; start it with FTRun.detached(config) or `%monarch train --name NAME`")
        self.placement = placement_for(self.config, host_mesh_for)
        if cfg.spares:
            self.placement.spare_kwargs()  # refuses a placement that cannot hold spares, before anything starts
        # FTRun.resume: the same run, its log continued; else a new run (checked before anything is written)
        place = resumed_run(*_resume, cfg) if _resume is not None else new_run(cfg)
        self.run_id, self.run_dir, self.checkpoint_dir = place.run_id, place.run_dir, place.checkpoint_dir
        self.resume_from: CheckpointInfo | None = place.resume_from
        self.resume_source: str | None = place.resume_source  # the run that wrote resume_from, if another
        self._place = place
        claim_checkpoint_folder(place, cfg, resumed=_resume is not None)
        log = self.run_dir / "events.jsonl"
        self.events = EventStore.open(log, follow=True) if _resume is not None else EventStore(log)
        self.fault_log = str(self.run_dir / "faults.jsonl")
        self._session = session
        self.groups = GroupTable(cfg.replicas)
        self.identity = IdentityChecks(cfg.group_size, self.events.append, every=meets_every(cfg))
        self._delivery = FaultDelivery(self.config, self.groups, self.fault_log, lambda: self._session)
        self.faults = FaultInjector(cfg.group_size, self.groups, self.fault_log, self._delivery.arm,
                                    self._delivery.through_scheduler, self.events.append,
                                    lambda: self.started and not self.stopped)
        self.supervisor: Supervisor | None = None
        self._unsubscribe: Callable[[], None] | None = None  # the supervisor's worker-failure listener
        self._coordinator = Coordinator(self.events.append)
        self._finish_watch = FinishWatch(self.config, self.groups, self.events, lambda: self.stopped, self.stop)
        self._scaler = Scaler(self.config, self.groups, self.events, self.wait_for_step)
        self.stragglers = watch_stragglers(self)
        self._node_drains: Any = None  # job="slurm" or "kubernetes": NodeDrainWatch
        self._stopping = StopSequence(self.run_id, self.events, self.groups, self.placement, self._coordinator,
                                      self.checkpoint_dir, self._quiet, own_session=session is None)
        self._dashboard: ShownView | None = None  # views.build("dashboard"), made on first ask
        self.started = False
        self.started_t: float | None = None  # when start() was called (the default ``since`` of waits)
        self.data_dir: str | None = None

    # ---- what is going on -------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        return self._session

    @property
    def lighthouse(self) -> Lighthouse | None:
        return self._coordinator.lighthouse

    @property
    def rendezvous(self) -> PlainRendezvous | None:
        """The job's store, under on_failure="plain_restart" (instead of a Lighthouse)."""
        return self._coordinator.rendezvous

    @property
    def lighthouse_pid(self) -> int | None:
        return self.lighthouse.pid if self.lighthouse else None

    @property
    def stopped(self) -> bool:
        """True from the moment ``stop()`` begins (a finished run stops itself)."""
        return self._stopping.stopped

    @property
    def spawned_pids(self) -> list[int]:
        """Every process this run started (workers and job hosts): none may outlive ``stop()``."""
        workers = self.supervisor.spawned_pids if self.supervisor else []
        return list(workers) + self.placement.extra_pids()

    @classmethod
    def resume(cls, run_dir: str | Path, *, session: Session | None = None, **overrides: Any) -> "FTRun":
        """Continue a run whose groups, Lighthouse or kernel were all lost, from its newest
        complete durable checkpoint: the same run id, the same ``events.jsonl`` (a ``resumed``
        event says from which step), the step counter and data position carried on. Call
        ``start()`` on the result. ``overrides`` change config fields (not the model)."""
        cfg, run_dir, checkpoint = resume_point(run_dir, overrides)
        return cls(cfg, session=session, _resume=(run_dir, checkpoint))

    @staticmethod
    def detached(config: RunConfig | None = None, **overrides: Any) -> RunClient:
        """This run in a process of its own that outlives the kernel (``run_client.py``)."""
        return start_detached((config or RunConfig()).replace(**overrides).validate())

    @staticmethod
    def resume_detached(run_dir: str | Path, **overrides: Any) -> RunClient:
        """``resume`` in a process of its own that outlives the kernel (``run_client.py``)."""
        return resume_detached(run_dir, **overrides)

    @staticmethod
    def attach(name: str, runs_root: str | None = None) -> RunClient:
        """A live detached run, with FTRun's API, in this kernel (``run_client.attach``)."""
        return attach(name, runs_root)

    def stacks(self, replica: int, ranks: list[int] | None = None) -> list[Stack]:
        """The Python stacks of a group's ranks (``Session.stacks``; py-spy from outside)."""
        g = group_of(self.groups, replica, self.run_id)
        if self._session is None or g.state in (STOPPED, GAVE_UP, RETIRED) or g.name not in self._session.meshes:
            raise ValueError(f"replica: group {replica} has no live processes (it is {g.state}); "
                             f"its output is in {self.log_dir}")
        return self._session.stacks(g.name, ranks)

    def status(self) -> dict[int | str, dict[str, Any]]:
        """Per group: state, last committed step, restarts so far, worker pids (LocalSGD / DiLoCo:
        ``inner``, its steps since the groups last met, of the period); and per warm spare (keys
        ``spare0``, ...): building or ready, and its pids."""
        out: dict[int | str, dict[str, Any]] = dict(self.groups.status())
        every = meeting_period(self.config.sync, self.config.sync_every, self.config.fragments)
        slow = self.stragglers.slow()
        for index, st in out.items():  # LocalSGD / DiLoCo: where each training group is in its inner loop
            if every and st["state"] == TRAINING:
                st["inner"] = f"{st['step'] % every}/{every}"
            if index in slow:  # named a straggler: its own work takes this many times its peers'
                st["slow"] = round(slow[index], 2)
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

    def scale(self, replicas: int, timeout: float | None = None) -> Scaled:
        """Resize the run to ``replicas`` groups while it trains: new groups come from warm spares
        first, else fresh processes, and heal from a peer; surplus groups (the newest first) leave
        at a step boundary and are recorded as retired, not failed. Blocks until done."""
        running = self.supervisor if self.started and not self.stopped else None
        return self._scaler.scale(replicas, timeout, running)

    def drain(self, replica: int, timeout: float = 180.0, reason: str = "", leave_first: bool = False) -> Drained:
        """A planned move of group ``replica`` (its node is about to go): a replacement - a warm
        spare first, else fresh processes - heals from live peers and commits a step with them
        while ``replica`` still trains, then ``replica`` leaves at a step boundary. The
        replacement is a new group (its own index). ``leave_first`` (the ``drop`` straggler
        policy): ``replica`` leaves at once, then the replacement comes. Blocks until done."""
        running = self.supervisor if self.started and not self.stopped else None
        return self._scaler.drain(replica, timeout, running, reason, leave_first)

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
        self.started_t = time.time()  # waits default to events from here on (wait_for)
        from ..settings.tinydata import ensure_tinydata

        self.data_dir = str(Path(cfg.data_dir) if cfg.data_dir else ensure_tinydata())
        self.placement.share(str(self.run_dir), self.data_dir)
        self.events.append(RunStarted(run_id=self.run_id, config={**cfg.to_dict(), "run_dir": str(self.run_dir)}))
        resumed = self._place.resumed_event(cfg)
        if resumed is not None:
            self.events.append(resumed)
        try:
            if self._session is None:
                from ...session import Session

                self._session = Session(events=self.events)
            lifetime.on_exit(self.stop, "interpreter exit")  # runs before the session's own release
            self._coordinator.open(cfg, self.placement)
            sup = self.supervisor = Supervisor(cfg, self._session, self.groups, self.placement,
                                               EventIngest(cfg.group_size), self.identity, self.events,
                                               self.faults.fired_time, self._trainer_args,
                                               self._coordinator.lighthouse_address, fired_by=self.faults.fired_by)
            if cfg.checkpoint_every or cfg.on_failure in RESTARTS:
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
            self._finish_watch.watch(sup, self._session)
        sup.watch()
        self._coordinator.watch()
        self._node_drains = node_drain_watch(self)  # groups on a node being drained move before it goes
        if self._node_drains is not None:
            self._node_drains.start()
        if sup.spares is not None:
            sup.spares.fill()  # in the background, after the groups: they compete for the same cores
        return self

    def _trainer_args(self, g: ReplicaGroup | None, store_port: int | None) -> tuple:
        """TrainerActor's arguments for group ``g``, or for a warm spare (``g`` None: no replica
        and no Lighthouse until it is activated)."""
        worker_cfg = {**self.config.to_dict(), "respawn": None, "run_id": self.run_id,
                      "checkpoint_dir": str(self.checkpoint_dir), "run_dir": str(self.run_dir),
                      "advertise_host": self.config.advertise_host or self.placement.advertise_host,
                      "communicator_at_once": communicator_at_once(self.config)}
        if g is None:
            return (worker_cfg, None, None, store_port, self.data_dir, self.fault_log, 0)
        return (worker_cfg, g.index, self._coordinator.address(g), store_port, self.data_dir, self.fault_log,
                g.attempts)

    # ---- faults -----------------------------------------------------------------------

    def inject(self, kind: str | FaultKind, replica: int = 0, rank: int = 0, *, at_step: int | None = None,
               after_s: float | None = None, hang_s: float = 30.0, during: str | None = None,
               stuck: bool = False, factor: float = 2.5) -> Fault:
        """Arm a fault in one process of one replica group.

        ``at_step=N`` fires inside step N; ``after_s=S`` fires in the first step after S
        seconds; ``during=PHASE`` fires when the process next enters that phase of a quorum
        or heal (``faults.PHASES``: quorum, pg_setup, heal_send, heal_recv); none: the next
        step. ``stuck=True`` (comms only): the process cannot rebuild its communicator, so
        the ladder must escalate from ``communicator`` to ``process``. ``slow``: the group's steps
        take ``factor`` times as long from now (1: back to normal). Validated before anything is sent; a target that is not training or healing is
        refused, naming the groups that are. ``corrupt`` needs ``heal_transport="striped"``.
        """
        refuse_corrupt_unless_striped(kind, self.config.heal_transport)
        if at_step is not None and self.config.steps is not None and at_step > self.config.steps:
            raise ValueError(f"at_step: {at_step} is past the run's last step (steps={self.config.steps}); it would "
                             f"never fire; allowed: up to {self.config.steps}")
        return self.faults.inject(kind, replica, rank, at_step=at_step, after_s=after_s, hang_s=hang_s,
                                  during=during, stuck=stuck, factor=factor)

    def disarm(self) -> int:
        """Drop every armed fault that has not fired yet (in every training or healing group);
        returns how many were dropped."""
        return self._delivery.disarm()

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

    # ---- identical replicas ------------------------------------------------------------

    def check_identical(self, timeout: float = 60.0) -> ReplicasIdentical | None:
        """Compare digests of every training group at a common future step; blocks until recorded.
        None when fewer than two groups are training."""
        target = self.supervisor.request_identity() if self.supervisor else None
        if target is None:
            return None
        return self.events.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.step == target,
                                    timeout=timeout, what=f"an identity verdict at step {target}")  # type: ignore[return-value]

    # ---- stop -------------------------------------------------------------------------

    def stop(self, reason: str = "stopped", save_timeout: float | None = None) -> StopReport:
        """Stop every group, the Lighthouse and (if we made it) the session. Idempotent.

        A durable save still writing gets ``save_timeout`` seconds to complete (default: 3x the
        slowest save of this run, at least 10 s); one that cannot is recorded as
        ``checkpoint_abandoned`` and its directory removed, so the newest checkpoint on disk is
        always complete. The report says which, and how long the stop took. A second call (or
        one while a finished run stops itself) waits for the first and returns its report."""
        return self._stopping.stop(reason, save_timeout, supervisor=self.supervisor, session=self._session,
                                   unsubscribe=self._unsubscribe, dashboard=lambda: self._dashboard)

    @property
    def _stop_report(self) -> StopReport | None:
        """The first stop's report, once it is done (None before)."""
        return self._stopping.report

    def _quiet(self) -> None:
        """A stop's first act: nothing new may start (a finish, the exit hook's stop, a scheduled
        fault, a Lighthouse restart)."""
        self._finish_watch.cancel()
        lifetime.cancel(self.stop)
        self.faults.stop_schedule()
        self._coordinator.stop_watching()

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


def group_of(groups: GroupTable, replica: int, run_id: str) -> ReplicaGroup:
    g = groups.by_name(f"replica{replica}") if isinstance(replica, int) else None
    if g is None:
        known = ", ".join(str(x.index) for x in groups) or "none"
        raise ValueError(f"replica: {replica!r} is not a replica group of run {run_id}; groups: {known}")
    return g


def open_run(path: str | Path) -> RunHistory:
    """Reopen a finished or interrupted run from its directory (or its events.jsonl)."""
    store = EventStore.open(path)
    run_dir = Path(path) if Path(path).is_dir() else Path(path).parent
    return RunHistory(store, run_dir)
