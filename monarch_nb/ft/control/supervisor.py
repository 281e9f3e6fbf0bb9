"""Supervision of replica groups: watch each group, and bring it back when it fails.

One thread per group (``ft-supervise-replicaN``) polls its trainers every poll interval; the
:class:`~.detector.Detector` says whether the group failed and how. Recovery happens in that
group's thread only - survivors never restart - by the run's failure response
(:mod:`.responses`, one class per ``RunConfig.on_failure``; the default climbs the recovery
:mod:`.ladder`), which uses the supervisor's means (:class:`~.means.ResponseMeans`): a live
process is repaired in place, a dead one is torn down and brought up again by the
:class:`~.launcher.Launcher` (a warm spare or fresh processes) and torchft heals it from a live
peer at the next quorum; its first committed step is its rejoin. When no live peer is left,
:class:`~.total_loss.TotalLoss` resumes every group from a durable checkpoint. Each phase is an
event, so a recovery's phases add up to the time the victim was out.

The supervisor owns the worker threads and ``stopping``; the poll's acknowledgement state is
``_acks`` (under ``_acks_lock``, never held across a call).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ...calls import MeshResult
from ...stacks import innermost_functions
from ...telemetry.events import Event, FailureDetected, ReplicaState, WorkerExitReported
from ...telemetry.store import EventStore
from ..record.ingest import EventIngest, HashReport, HashSkipped, unseen
from ..settings.config import RunConfig
from .detector import Detector
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
from .identity import IdentityChecks
from .launcher import Launcher
from .placement import Placement
from .responses import FailureResponse, response_for
from .spares import SparePool
from .total_loss import TotalLoss

if TYPE_CHECKING:
    from ...session import Session

log = logging.getLogger(__name__)


class Supervisor:
    """Watches groups and recovers them; the run owns one."""

    def __init__(self, config: RunConfig, session: "Session", groups: GroupTable, placement: Placement,
                 ingest: EventIngest, identity: IdentityChecks, events: EventStore,
                 fired_time: Callable[[int], float | None],
                 trainer_args: Callable[[ReplicaGroup | None, int | None], tuple],
                 lighthouse: Callable[[], str], fired_by: Callable[[int], str | None] = lambda pid: None) -> None:
        """``events``: the run's event store (every event is appended there); ``fired_time(index)``:
        when the fault behind a group's failure fired, if it was injected; ``trainer_args(group,
        store_port)``: TrainerActor's arguments (group None: a spare); ``lighthouse()``: the
        Lighthouse's address now; ``fired_by(pid)``: the kind of fault a process recorded firing."""
        self.config, self.session, self.groups = config, session, groups
        self.ingest, self.identity, self.run_events = ingest, identity, events
        self._fired_time = fired_time
        self.stopping = threading.Event()
        self._acks_lock = threading.Lock()  # never held across a call
        self._acks: dict[int, tuple[Any, dict[int, int]]] = {}  # group -> (its actors, rank -> last event held)
        self.launcher = Launcher(config, session, groups, placement, self.emit, trainer_args, lighthouse,
                                 lambda g, timeout: self.poll(g, timeout), self.failure_action, self.stopping,
                                 fired_by)
        self.total_loss = TotalLoss(groups, self.emit, self.call, self.progress)
        self.detector = Detector(config, session, groups, lambda g, timeout: self.poll(g, timeout), self.set_state,
                                 lambda index: self.ingest.awaiting_rejoin(index),
                                 lambda: self.total_loss.no_peer_left(), fired_by)
        self.response: FailureResponse = response_for(self)
        self._threads: list[threading.Thread] = []

    # ---- what the run and the responses use -----------------------------------------------

    def emit(self, event: Event) -> None:
        self.run_events.append(event)

    def set_state(self, g: ReplicaGroup, state: str, detail: str = "") -> None:
        if self.groups.set_state(g, state, detail):
            self.emit(ReplicaState(replica=g.index, state=state, detail=detail))

    @property
    def spares(self) -> SparePool | None:
        return self.launcher.spares

    @property
    def spawned_pids(self) -> list[int]:
        return self.launcher.spawned_pids

    @property
    def log_dir(self) -> str | None:
        """Where the workers write (the run's ``logs/``); None: the session's."""
        return self.launcher.log_dir

    @log_dir.setter
    def log_dir(self, path: str | None) -> None:
        self.launcher.log_dir = path

    @property
    def checkpoint_dir(self) -> str | None:
        return self.total_loss.checkpoint_dir

    @checkpoint_dir.setter
    def checkpoint_dir(self, path: str | None) -> None:
        self.total_loss.checkpoint_dir = path

    def closed(self) -> bool:
        """The session is shut down: nothing is left to bring back."""
        return self.session.closed

    def repair(self, g: ReplicaGroup, timeout: float) -> float:
        return self.launcher.repair(g, timeout)

    def allocation_gone(self, g: ReplicaGroup) -> bool:
        return self.launcher.allocation_gone(g)

    def call(self, g: ReplicaGroup, endpoint: str, *args: Any, timeout: float = 10.0) -> Any:
        return self.launcher.call(g, endpoint, *args, timeout=timeout)

    def spawn_all(self, groups: list[ReplicaGroup]) -> dict[int, float]:
        return self.launcher.spawn_all(groups)

    def at_once(self, groups: list[ReplicaGroup], fn: Callable[[ReplicaGroup], Any], name: str) -> dict[int, Any]:
        return self.launcher.at_once(groups, fn, name)

    def wait_ready(self, g: ReplicaGroup, deadline: float) -> None:
        self.launcher.wait_ready(g, deadline)

    def start_training(self, g: ReplicaGroup, min_step: int = 0, resume_from: str | None = None) -> None:
        self.launcher.start_training(g, min_step, resume_from)

    def acquire(self, g: ReplicaGroup, t0: float) -> None:
        self.launcher.acquire(g, t0)

    def teardown(self, g: ReplicaGroup) -> None:
        self.launcher.teardown(g)

    def teardown_all(self, groups: list[ReplicaGroup], failed: ReplicaGroup) -> None:
        self.launcher.teardown_all(groups, failed)

    def restart_from_scratch(self) -> list[int]:
        return self.total_loss.restart_from_scratch()

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

    def poll(self, g: ReplicaGroup, timeout: float) -> MeshResult:
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
                self.emit(item)
                if item.kind == "rejoined":
                    self.groups.rejoined(g)
                    self.total_loss.trains_again()
                    self.set_state(g, TRAINING)
                    if self.config.check_identical:
                        threading.Thread(target=self.request_identity, name="ft-hash-check", daemon=True).start()
        if 0 in result.values:
            self.groups.record_step(g, int(result.values[0].get("step", 0)))
        return result

    def request_identity(self) -> int | None:
        def ask(replica: int, step: int) -> bool | None:
            group = next((g for g in self.groups.training() if g.index == replica), None)
            if group is None:  # it failed (or left) since the check began
                return None
            try:  # every rank armed (True), or some rank already past the step (False)
                result = self.call(group, "hash_at", step, timeout=5.0)
            except Exception:
                return None
            if result.errors or result.missing:
                return None
            return all(result.values.values())

        return self.identity.request(lambda: [(g.index, g.step) for g in self.groups.training()], ask)

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
                self.emit(event)
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
            self.emit(event)

    def _watch_group(self, g: ReplicaGroup) -> None:
        while not self.stopping.is_set():
            g.wake.wait(self.detector.poll_interval())
            g.wake.clear()
            if self.stopping.is_set() or self.closed() or g.state in TERMINAL:
                return
            if self.response.busy():  # every group is being restarted from disk by one thread
                continue
            if g.state in (HEALING, WAITING) and self.finish_if_run_is_over(g):
                return
            try:
                failure = self.detector.check(g)
                if failure is not None and not self.stopping.is_set() and g.state not in TERMINAL:
                    self.respond(g, failure)
            except Exception as e:  # never let the supervisor die silently
                if self.stopping.is_set():  # a recovery cut short by stop(): nothing went wrong
                    log.debug("supervising %s: stopped during a recovery: %s", g.name, e)
                    return
                log.exception("supervising %s: %s", g.name, e)
                self.stopping.wait(1.0)

    def finish_if_run_is_over(self, g: ReplicaGroup) -> bool:
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

    # ---- responding: one class per on_failure (responses.py) -------------------------------

    def failure_action(self, mesh: str, cause: str | None = None) -> str:
        """What this run does when a rank of ``mesh`` fails (the notice says it after the fault);
        ``cause``: a stalled trainer's (the ladder may repair it in place)."""
        if not mesh.startswith("replica"):
            return "the spare is discarded and another one built"
        return self.response.action(cause)

    def report(self, g: ReplicaGroup, failure: Failure) -> None:
        """The failure as the notebook shows it: one notice per failed rank, naming the fault
        (Monarch's own report, when it came first, is that notice; this adds none)."""
        cause = failure.reason
        where = innermost_functions(failure.stack) if failure.stack else []
        if where:
            cause += f"; stuck in {' < '.join(where)}"
        try:
            self.session.report_failure(g.name, failure.rank, cause,
                                        self.failure_action(g.name, failure.cause) if failure.cause else None)
        except Exception as exc:  # the notice must never stop a recovery
            log.debug("reporting the failure of %s: %s", g.name, exc)

    def respond(self, g: ReplicaGroup, failure: Failure) -> None:
        """Bring the run back from ``g``'s failure, the way ``config.on_failure`` says."""
        self.response.respond(g, failure)

    def fired_time(self, g: ReplicaGroup) -> float | None:
        """When the fault behind ``g``'s failure was injected, if it was; asked once per failure
        (the injector hands each firing out once)."""
        return self._fired_time(g.index)

    def announce(self, g: ReplicaGroup, failure: Failure, fired: float | None) -> None:
        """Record that ``g`` failed: the event, with how long detection took when the fault was
        ours (``fired``)."""
        self.emit(FailureDetected(t=failure.t, replica=g.index, rank=failure.rank, reason=failure.reason,
                                   detection_s=(failure.t - fired) if fired else None, source=failure.source,
                                   stack=failure.stack))

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
            result = self.poll(g, 5.0)  # its last step's record too (it left without committing)
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
        self.launcher.stop_spares()
