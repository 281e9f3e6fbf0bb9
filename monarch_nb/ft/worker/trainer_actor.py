"""The Monarch actor that is one rank of one replica group.

``TrainerActor.__init__`` runs in the worker process and builds the
:class:`~monarch_nb.ft.worker.replica_trainer.ReplicaTrainer` (model, optimizer, torchft Manager): patches
and environment set in the controller do not reach workers, so everything happens here.
Training runs in a thread of the actor so endpoints stay responsive: ``poll`` hands the
controller the events produced since the last call plus the current state, ``inject``
arms a fault, ``hash_at`` asks for parameter/optimizer digests after a given committed
step, ``stop`` ends the loop. A failure the process survives (an exception in the step,
aborted comms) stalls the loop: the rank drops its cross-replica connections and leaves the
quorum (peers fail fast and train on without it), reports state ``stalled`` with the cause
through ``poll`` (Monarch cannot see it), and waits for the controller's ladder
(``control/ladder.py``) to ``repair`` it in place or replace the process.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
import traceback
from typing import Any

from monarch.actor import Actor, current_rank, endpoint

from ..settings.faults import FaultKind, record_firing, refuse_corrupt_unless_striped
from .fault_firing import fire
from .own_repair import OwnRepair

# A group that reported ``failed`` is torn down by the controller within a poll interval;
# should the controller be gone, the process ends itself after this long.
_SELF_EXIT_AFTER_FAILURE_S = 120.0


class TrainerActor(Actor):
    """One rank of a replica group; with ``replica=None`` a warm spare until ``activate``."""

    def __init__(self, cfg: dict[str, Any], replica: int | None, lighthouse: str | None, store_port: int | None,
                 data_dir: str, fault_log: str | None = None, attempt: int = 0) -> None:
        point = current_rank()
        self.rank = int(point.rank)
        self.group_size = math.prod(point.extent[label] for label in point.extent)
        self.replica, self.attempt, self.fault_log = replica, attempt, fault_log
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=100_000)  # until acked
        self._seq = 0
        self._state = "initializing"
        self._failure: str | None = None
        self._cause: str | None = None  # why a stalled rank stalled: "comms" or "exception"
        self._repaired = threading.Event()
        self._at_once = bool(cfg.get("communicator_at_once"))  # rebuild our own communicator at once (ladder.py)
        self._own: OwnRepair | None = None  # a rebuild done here, not yet collected by the controller
        self._stuck_s = 0.0  # a stuck comms fault: a repair here hangs this long (faults.Fault.stuck)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed: list[dict[str, Any]] = []
        self._hash_steps: set[int] = set()
        self._retire = threading.Event()
        self._max_steps = cfg.get("steps")
        from .replica_trainer import ReplicaTrainer

        self.trainer = ReplicaTrainer(cfg, replica=replica, rank=self.rank, group_size=self.group_size,
                                     lighthouse=lighthouse, store_port=store_port, data_dir=data_dir,
                                     emit=self._emit)
        self.trainer.phase_hook = self._phase_point
        self._state = "ready" if replica is not None else "spare"
        self._emit({"kind": "ready", "replica": replica, "rank": self.rank, "pid": os.getpid(),
                    "init_seconds": self.trainer.init_seconds, "platform": self.trainer.platform.describe(),
                    "t": time.time()})

    # ---- plumbing ---------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._seq += 1
            self._events.append((self._seq, event))
            if self._state == "waiting_for_peer" and event.get("kind") == "step" and event.get("committed"):
                self._state = "training"  # with its event: a poll must not read both (test_ft_units)

    def _fault_point(self, step: int) -> None:
        with self._lock:
            due = [f for f in self._armed if f.get("during") is None and (f["at_step"] is None or f["at_step"] <= step)]
            self._armed = [f for f in self._armed if f not in due]
        self._fire(due, step)

    def _phase_point(self, phase: str) -> None:
        """The trainer enters a phase of a quorum or heal: fire the faults aimed at it."""
        with self._lock:
            due = [f for f in self._armed if f.get("during") == phase]
            self._armed = [f for f in self._armed if f not in due]
        self._fire(due, self.trainer.current_step())

    def _fire(self, due: list[dict[str, Any]], step: int) -> None:
        for f in due:
            kind = FaultKind.parse(f["kind"])
            record_firing(self.fault_log, {"kind": "fault_fired", "fault": kind.value, "replica": self.replica,
                                           "rank": self.rank, "step": step, "pid": os.getpid(),
                                           "during": f.get("during")})
            self._emit({"kind": "fault_fired", "fault": kind.value, "replica": self.replica, "rank": self.rank,
                        "step": step, "during": f.get("during"), "t": time.time()})
            if kind is FaultKind.COMMS and f.get("stuck"):
                self._stuck_s = float(f.get("hang_s", 30.0))
            fire(kind, abort_comms=self.trainer.abort_comms, hang_s=f.get("hang_s", 30.0),
                 corrupt_heal=getattr(getattr(self.trainer, "transport", None), "corrupt_next_send", None))

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = reason
            self._state = "failed"
        # Leave the quorum now (no heartbeat, no sockets): peers blocked on us fail fast, not at the timeout.
        try:
            self.trainer.abort_comms()
        except Exception:
            pass
        self.trainer.shutdown()

        def _last_resort() -> None:
            if not self._stop.wait(_SELF_EXIT_AFTER_FAILURE_S):
                os._exit(70)

        threading.Thread(target=_last_resort, name="monarch_nb-self-exit", daemon=True).start()

    def _stall(self, cause: str, reason: str) -> bool:
        """Stop training, alive: our connections dropped (peers blocked on us fail at once),
        ``stalled`` reported. Our own failed collective (``comms``) is rebuilt at once if the
        ladder allows; else we leave the quorum (the next does not wait for us) and wait for
        :meth:`repair`. True once repaired; False on stop (no controller left: we exit)."""
        with self._lock:
            self._state, self._failure, self._cause = "stalled", reason, cause
            self._repaired.clear()
        try:
            self.trainer.abort_comms()
        except Exception:
            pass
        self._emit({"kind": "stalled", "replica": self.replica, "rank": self.rank, "cause": cause,
                    "reason": reason, "step": self.trainer.current_step(), "t": time.time()})
        if cause == "comms" and self._at_once and self._rebuild_at_once(reason):
            return not self._stop.is_set()
        self._leave_quorum()
        deadline = time.monotonic() + _SELF_EXIT_AFTER_FAILURE_S
        while not self._repaired.wait(0.1):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                os._exit(70)
        return True

    def _rebuild_at_once(self, reason: str) -> bool:
        """Rung ``communicator`` now, as a quorum member (own_repair.py); False if it raised:
        the controller's repair call then reports it and the ladder escalates."""
        own = OwnRepair(reason)
        with self._lock:
            self._own = own
        rebuilt = own.rebuild(self.trainer.repair, self._leave_quorum, self._stop, self._stuck_s)
        if rebuilt:
            with self._lock:
                self._state, self._failure, self._cause = "training", None, None
        own.done.set()
        return rebuilt

    def _leave_quorum(self) -> None:
        if self.trainer.replication is not None:
            self.trainer.replication.shutdown()

    def _loop(self) -> None:
        self._state = "training"
        try:
            while not self._stop.is_set():
                if self._retire.is_set() and self.trainer.steps.leaving:  # at a step boundary, its last one done
                    self.trainer.shutdown()
                    self._state = "retired"
                    break
                self.trainer.steps.leaving = self._retire.is_set()  # one last step, its gradients averaged
                if self._max_steps is not None and self.trainer.current_step() >= self._max_steps:
                    self._state = "finished"
                    break
                try:
                    rec = self.trainer.train_step(self._fault_point)
                except Exception as e:  # the step raised: the ladder may retry it in this process
                    if self._stop.is_set():
                        return
                    self._emit({"kind": "trainer_error", "replica": self.replica, "rank": self.rank,
                                "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6),
                                "t": time.time()})
                    if not self._stall("exception", f"exception: {type(e).__name__}: {e}"):
                        return
                    continue
                self._state = "waiting_for_peer" if rec.get("kind") == "waiting_for_peer" else "training"
                if self.trainer.comms_broken():  # our own communicator was declared dead (the comms fault)
                    if not self._stall("comms", "comms: cross-replica process group aborted"):
                        return
                    continue
                if rec["committed"] and rec.get("synced") is not False:  # a failed meeting: groups differ
                    self._report_hashes(rec["step"])
        except BaseException as e:  # noqa: BLE001 - anything else ends the group's training
            if self._stop.is_set():
                return
            tb = traceback.format_exc(limit=6)
            self._emit({"kind": "trainer_error", "replica": self.replica, "rank": self.rank,
                        "error": f"{type(e).__name__}: {e}", "traceback": tb, "t": time.time()})
            self._fail(f"exception: {type(e).__name__}: {e}")
        finally:
            self.trainer.training_ended()  # in the training thread (torch's profiler stops where it started)

    def _report_hashes(self, step: int) -> None:
        """Digests for an armed step just committed; an armed step this group never committed (it
        healed past it) is reported skipped: its check compares the groups that did commit it."""
        with self._lock:
            want = step in self._hash_steps
            skipped = sorted(s for s in self._hash_steps if s < step)
            self._hash_steps -= {step, *skipped}
        for s in skipped:
            self._emit({"kind": "hashes_skipped", "replica": self.replica, "rank": self.rank, "step": s,
                        "at": step, "t": time.time()})
        if want:
            self._emit({"kind": "hashes", "replica": self.replica, "rank": self.rank,
                        "step": step, **self.trainer.hashes(), "t": time.time()})

    # ---- endpoints --------------------------------------------------------------------------

    @endpoint
    def activate(self, replica: int, lighthouse: str, attempt: int = 0) -> float:
        """A warm spare becomes rank ``rank`` of group ``replica``, with a torchft Manager (it heals at its first quorum)."""
        if self.replica is not None:
            raise RuntimeError(f"this trainer is already replica {self.replica}")
        seconds = self.trainer.join(replica, lighthouse)
        self.replica, self.attempt = replica, attempt
        self._state = "ready"
        return seconds

    @endpoint
    def load_checkpoint(self, path: str) -> bool:
        """Load a durable checkpoint before the next step (the training thread applies it)."""
        if self._thread is None:
            self.trainer.load_checkpoint(path)
        else:
            self.trainer.request_load(path)
        return True

    @endpoint
    def forget_progress(self) -> bool:
        """Train from this replica's own (initial) state: the run's state is lost and the user
        chose to start again (``FTRun.restart_from_scratch``)."""
        self.trainer.min_step = 0
        return True

    @endpoint
    def listening(self) -> dict[str, int | None]:
        """Ports this rank's torchft parts listen on (for the socket audit)."""
        return self.trainer.listening()

    @endpoint
    def retire(self) -> bool:
        """Leave the run after one more step, its gradients averaged (a drain, a scale-down): not a failure."""
        self._retire.set()
        return True

    @endpoint
    def start(self, min_step: int = 0, resume_from: str | None = None) -> bool:
        """Start training. ``min_step``: the run's progress - below it this replica trains only
        after a heal or a checkpoint. ``resume_from``: a durable checkpoint to load first."""
        self.trainer.min_step = min_step
        if resume_from is not None:
            self.trainer.load_checkpoint(resume_from)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"train-r{self.replica}", daemon=True)
            self._thread.start()
        return True

    @endpoint
    def poll(self, acked: dict[int, int] | None = None) -> dict[str, Any]:
        """State and the events since the last poll. With ``acked`` (group rank -> the last
        sequence number the controller holds) events are dropped once acknowledged, sent again
        until then (a poll answered after the controller stopped waiting for it took its events
        with it, at 32 groups). Without, every event is sent once (a spare's build, retiring)."""
        with self._lock:
            if acked is None:
                events = list(self._events)
                self._events.clear()
            else:
                upto = acked.get(self.rank, 0)
                while self._events and self._events[0][0] <= upto:
                    self._events.popleft()
                events = list(self._events)
            state, failure, cause = self._state, self._failure, self._cause
            if self._own is not None:  # rebuilt here, not collected yet: the ladder must still see it
                state, failure, cause = "stalled", self._own.reason, "comms"
        return {"replica": self.replica, "rank": self.rank, "state": state, "failure": failure, "cause": cause,
                "step": self.trainer.current_step(), "events": [e for _, e in events],
                "first_seq": events[0][0] if events else None, "pid": os.getpid()}

    @endpoint
    def repair(self) -> float:
        """The ladder's in-process rungs (``communicator``, ``step``): a new communicator, model, optimizer
        and step kept; a rebuild done at once (:meth:`_rebuild_at_once`) is collected instead. Seconds."""
        with self._lock:  # our state says "stalled" until a rebuild here is over
            own, self._own = self._own, None
        if own is not None:
            return self._repaired_report("comms", own.collected(), own.kept_member, at_once=True)
        if self._state != "stalled":
            if self.group_size > 1 and self._state in ("training", "waiting_for_peer"):
                return 0.0  # a groupmate's broke; torchft rebuilds ours at the next quorum
            raise RuntimeError(f"repair: replica {self.replica} rank {self.rank} is {self._state}, not stalled")
        t0 = time.time()
        if self._stuck_s:  # the stuck comms fault: this process cannot rebuild its communicator
            time.sleep(self._stuck_s)
        kept = self.trainer.repair()
        with self._lock:
            cause, self._state, self._failure, self._cause = self._cause, "training", None, None
        self._repaired.set()
        return self._repaired_report(cause, time.time() - t0, kept, at_once=False)

    def _repaired_report(self, cause: str | None, seconds: float, kept: bool, at_once: bool) -> float:
        self._emit({"kind": "repaired", "replica": self.replica, "rank": self.rank, "cause": cause, "seconds": seconds,
                    "step": self.trainer.current_step(), "kept_member": kept, "at_once": at_once, "t": time.time()})
        return seconds

    @endpoint
    def inject(self, kind: str, at_step: int | None = None, hang_s: float = 30.0, during: str | None = None,
               stuck: bool = False) -> int:
        """Arm a fault for the first step >= ``at_step`` (None: the next), or phase ``during``; its step."""
        refuse_corrupt_unless_striped(kind, str(self.trainer.cfg.get("heal_transport") or "striped"))
        step = at_step if at_step is not None else self.trainer.current_step() + 1
        with self._lock:
            self._armed.append({"kind": kind, "at_step": at_step, "hang_s": hang_s, "during": during, "stuck": stuck})
        return step

    @endpoint
    def slow(self, factor: float) -> None:
        """The ``slow`` fault: this rank's own work takes ``factor`` times as long (train_step.py)."""
        self.trainer.steps.slow_factor = float(factor)

    @endpoint
    def disarm(self) -> int:
        """Drop the faults armed here that have not fired; returns how many."""
        with self._lock:
            n, self._armed = len(self._armed), []
        return n

    @endpoint
    def hash_at(self, step: int) -> bool:
        """Emit a ``hashes`` event after committing ``step``; False if it is already past."""
        with self._lock:  # armed first, then the step read: a commit in between is still reported
            self._hash_steps.add(step)
        passed = self.trainer.current_step() >= step
        if passed:
            with self._lock:
                self._hash_steps.discard(step)
        return not passed

    @endpoint
    def hashes(self) -> dict[str, Any]:
        """Digests right now (only meaningful while training is stopped or finished)."""
        return {"step": self.trainer.current_step(), **self.trainer.hashes()}

    @endpoint
    def settle_saves(self) -> bool:
        """Wait for a periodic durable save still writing (before the final save, so that two
        groups never write one step's directory at once)."""
        if self.trainer.durable is not None:
            self.trainer.durable.close(timeout=None)
        return True

    @endpoint
    def save_final(self) -> dict[str, Any]:
        """The run reached its last step: save this step's state as a durable checkpoint (every
        rank of the saving group is called). Refused while the training loop still runs."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"save_final: replica {self.replica} is still training (state {self._state})")
        return self.trainer.save_final()

    @endpoint
    def finish(self, timeout: float = 10.0, save_timeout: float | None = None) -> str:
        """End training after the current step; a durable save still writing gets
        ``save_timeout`` seconds to complete (None: as long as it takes), else it is abandoned
        (marked on disk, ``checkpoint_abandoned``)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self.trainer.shutdown(save_timeout)
        self._state = "stopped" if self._state != "failed" else self._state
        return self._state
