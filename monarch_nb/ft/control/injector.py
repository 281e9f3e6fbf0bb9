"""Faults on demand and on a schedule, and when each one actually fired.

The injector validates a :class:`~monarch_nb.ft.settings.faults.Fault` against the run, refuses a
target that is not running, and hands it to the target rank's trainer, which arms it for a
step. A worker appends a line to the run's fault log (``faults.jsonl``) just before it fires
a fault, because the process may be gone a moment later; :meth:`FaultInjector.fired_time`
reads that log, so detection latency is measured from the fault itself, not from the
injection, and :meth:`FaultInjector.fired_by` tells the pid check how a process that fired
a fault ended when its exit status was reaped before it could be read.

The schedule thread injects random faults every N seconds and never takes the last training
group down (nor, with ``keep=K``, the training groups below K). A schedule that the run's
groups can never satisfy is refused when it is set; a wave that finds too few groups training
later fires fewer faults, or none, and says so (``fault_skipped``).
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any, Callable

from ...telemetry.events import Event, FaultInjected, FaultSkipped
from ..settings.faults import CLUSTER_KINDS, Fault, FaultKind, FaultSchedule
from .groups import HEALING, TRAINING, GroupTable

FIRED_KEPT = 1000


class FaultInjector:
    def __init__(self, group_size: int, groups: GroupTable, fault_log: str,
                 arm: Callable[[Fault], int | None], cluster: Callable[..., int | None],
                 emit: Callable[[Event], None], running: Callable[[], bool]) -> None:
        """``arm(fault)`` arms a fault in its target worker; ``cluster(fault, announce)`` makes a
        cluster kind happen through the scheduler, calling ``announce(step)`` just before it is
        sent. Both return the step the fault is due at."""
        self.group_size = group_size
        self.fault_log = fault_log
        self._groups, self._arm, self._cluster, self._emit, self._running = groups, arm, cluster, emit, running
        self._lock = threading.Lock()
        self._log_pos = 0
        # the fault log's newest firings (a recovery claims one within seconds; older ones are history)
        self._fired: collections.deque[dict[str, Any]] = collections.deque(maxlen=FIRED_KEPT)
        self._schedule_stop: threading.Event | None = None

    def inject(self, kind: str | FaultKind, replica: int = 0, rank: int = 0, *, at_step: int | None = None,
               after_s: float | None = None, hang_s: float = 30.0, during: str | None = None,
               stuck: bool = False, factor: float = 2.5) -> Fault:
        fault = Fault(kind=FaultKind.parse(kind), replica=replica, rank=rank, at_step=at_step, after_s=after_s,
                      hang_s=hang_s, during=during, stuck=stuck, factor=factor)
        fault.validate(len(self._groups.groups), self.group_size)  # groups added by scale() count
        now = self._groups[fault.replica].step
        if fault.at_step is not None and fault.at_step <= now:
            raise ValueError(f"at_step: step {fault.at_step} has passed in replica {replica} (it committed step "
                             f"{now}); give a later step, or none for the next one")
        if not self._running():
            raise RuntimeError("inject: the run is not running (call start() first)")
        if fault.after_s:
            timer = threading.Timer(fault.after_s, self._fire_quietly, args=(fault,))
            timer.daemon = True
            timer.start()
            self._emit(FaultInjected(fault=fault.kind.value, replica=replica, rank=rank, step=None,
                                     factor=_factor(fault)))
            return fault
        self.send(fault)
        return fault

    def send(self, fault: Fault) -> None:
        """Arm ``fault`` in its target now and record the injection; refuses a target not running."""
        g = self._groups[fault.replica]
        if g.state not in (TRAINING, HEALING):
            allowed = [x.index for x in self._groups.training()]
            raise RuntimeError(f"inject: replica {fault.replica} is {g.state}; allowed targets now: {allowed}")
        def announce(step: int | None) -> None:
            self._emit(FaultInjected(fault=fault.kind.value, replica=fault.replica, rank=fault.rank,
                                     step=step if step is not None else fault.at_step, factor=_factor(fault)))

        if fault.kind in CLUSTER_KINDS:  # recorded before it is sent: the cluster may report it at once
            self._cluster(fault, announce)
        else:
            announce(self._arm(fault))

    def _fire_quietly(self, fault: Fault) -> None:
        """A delayed fault whose target is no longer running is dropped (its injection is recorded)."""
        g = self._groups[fault.replica]
        if g.state in (TRAINING, HEALING) and self._running():
            try:
                self._deliver(fault)
            except Exception:
                pass

    def _deliver(self, fault: Fault) -> int | None:
        return (self._cluster if fault.kind in CLUSTER_KINDS else self._arm)(fault)

    def schedule(self, every: float, kinds: Any = ("kill",), seed: int | None = None,
                 max_faults: int | None = None, rank: int | None = None, at_once: int = 1,
                 keep: int = 1) -> FaultSchedule:
        """Every ``every`` seconds, one fault (of a random kind) into ``at_once`` random training
        groups together; at least ``keep`` training groups (at least one) are always left standing,
        so a wave that finds groups still recovering is smaller, or skipped."""
        sched = FaultSchedule(every_s=every, kinds=tuple(kinds), seed=seed, rank=rank, max_faults=max_faults,
                              at_once=at_once, keep=keep)
        refuse_impossible_waves(sched, len(self._groups.active()), self.group_size)
        self.stop_schedule()
        stop = self._schedule_stop = threading.Event()

        def loop() -> None:
            n = 0
            while not stop.wait(sched.every_s) and self._running():
                live = [g.index for g in self._groups.training()]
                limit = len(live) - sched.keep  # never take the last (or the last `keep`) down
                if sched.max_faults is not None:
                    limit = min(limit, sched.max_faults - n)
                fired = 0
                for fault in sched.next_wave(self.group_size, live, limit) if limit > 0 else []:
                    try:
                        self.send(fault)
                        n += 1
                        fired += 1
                    except Exception:
                        continue
                wanted = sched.at_once if sched.max_faults is None else min(sched.at_once, sched.max_faults - n + fired)
                if fired < wanted:
                    self._emit(FaultSkipped(wanted=wanted, fired=fired, training=len(live), keep=sched.keep,
                                            reason=skip_reason(wanted, fired, len(live), sched.keep)))
                if sched.max_faults is not None and n >= sched.max_faults:
                    return

        threading.Thread(target=loop, name="ft-fault-schedule", daemon=True).start()
        return sched

    def stop_schedule(self) -> None:
        if self._schedule_stop is not None:
            self._schedule_stop.set()
            self._schedule_stop = None

    def _read_log(self) -> None:
        """Take in the fault log's new lines (call with the lock held)."""
        try:
            with open(self.fault_log, encoding="utf-8") as f:
                f.seek(self._log_pos)
                for line in f:
                    try:
                        self._fired.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
                self._log_pos = f.tell()
        except FileNotFoundError:
            pass

    def fired_time(self, replica: int) -> float | None:
        """When the latest not yet claimed fault aimed at ``replica`` fired (from the fault log);
        each firing is claimed by one failure."""
        with self._lock:
            self._read_log()
            for rec in reversed(self._fired):
                if rec.get("replica") == replica and not rec.get("_claimed"):
                    rec["_claimed"] = True
                    return float(rec["t"])
        return None

    def fired_during_phase(self, replica: int, since: float) -> float | None:
        """When a fault aimed at a phase (``inject(..., during=...)``) fired in ``replica`` at or
        after ``since``, from the fault log; None if none did (the phase never came)."""
        with self._lock:
            self._read_log()
            for rec in self._fired:
                if rec.get("replica") == replica and rec.get("during") and float(rec.get("t", 0)) >= since:
                    return float(rec["t"])
        return None

    def fired_by(self, pid: int) -> str | None:
        """The kind of the latest fault process ``pid`` recorded firing, from the fault log (it
        writes the line just before it fires); None if it fired none."""
        with self._lock:
            self._read_log()
            for rec in reversed(self._fired):
                if rec.get("pid") == pid:
                    return str(rec.get("fault"))
        return None


def refuse_impossible_waves(sched: FaultSchedule, groups: int, group_size: int) -> None:
    """A schedule the run can never satisfy (``ValueError`` naming the flag and what is allowed):
    more groups at once, or more kept standing, than the run has."""
    if sched.keep >= groups:
        allowed = f"--keep 1..{groups - 1}" if groups > 1 else "none: a run of one group has no group to spare"
        raise ValueError(f"keep: {sched.keep} training groups kept standing leaves none of this run's {groups} "
                         f"group(s) to fault; allowed: {allowed}")
    if sched.at_once > groups - sched.keep:
        raise ValueError(f"at_once: {sched.at_once} groups at once can never be hit: the run has {groups} groups and "
                         f"keeps {sched.keep} training; allowed: --at-once 1..{groups - sched.keep} (or a lower --keep)")
    if sched.rank is not None and not 0 <= sched.rank < group_size:
        raise ValueError(f"rank: {sched.rank} is not a rank of a group of {group_size}; allowed: 0..{group_size - 1}")


def skip_reason(wanted: int, fired: int, training: int, keep: int) -> str:
    """Why a wave fired ``fired`` of ``wanted`` faults, in words."""
    room = max(0, training - keep)
    why = (f"{training} group(s) training and {keep} kept standing leave {room} to fault" if room < wanted
           else "a target stopped training before its fault was armed")
    return f"a scheduled wave fired {fired} of {wanted} fault(s): {why}"


def _factor(fault: Fault) -> float | None:
    return float(fault.factor) if fault.kind is FaultKind.SLOW else None
