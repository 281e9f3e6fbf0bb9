"""Fault injection as a product feature: what can go wrong and when (plain data both sides read;
a worker makes it happen with :mod:`monarch_nb.ft.worker.fault_firing`).

A :class:`Fault` names a kind, a target (replica group, rank) and a trigger (a step number,
or a delay in seconds). The controller validates it, the trainer actor arms it, and the
training thread fires it at a fixed point inside the step: after forward/backward, before
the cross-replica gradient allreduce, where a failure hurts the surviving peers most.
:class:`FaultSchedule` produces faults at random targets every N seconds for soak runs.

Kinds and how each is survived:
  kill       SIGKILL the process            -> Monarch supervision reports the dead process
  segfault   a real SIGSEGV (NULL read)     -> same
  exit       ``os._exit(13)``               -> same
  exception  raised inside the train step   -> the trainer stalls; the ladder retries the step
                                               in place
  comms      abort the cross-replica PG     -> the trainer stalls; the ladder rebuilds its
                                               communicator in place (``stuck``: it cannot,
                                               and the ladder replaces the process)
  hang       hold the GIL for N seconds     -> calls to the actor time out (hang deadline)
  corrupt    flip one byte of the next heal -> the healing peer's digest check catches it
             this process serves (in transit;  (``heal_corrupt``) and refetches that piece from
             its own state stays intact)        another peer; nothing fails (heal_transport
                                                "striped" only)

Cluster kinds, done by the controller through the scheduler. SLURM (``job="slurm"``):
  preempt    ``scancel`` of the group's allocation          -> the session's job watcher
  node_down  ``scontrol update nodename=N state=down`` of    -> same; every group on that
             the node holding the group                        node fails with it
Kubernetes (``job="kubernetes"``), as Kubernetes delivers them:
  pod_delete     the group's pod deleted through the API    -> the pod watch (and Monarch's supervision)
  evict          the pod evicted through the Eviction API,  -> the pod watch (DisruptionTarget)
                 which its PodDisruptionBudget allows
  node_notready  the kubelet of the pod's node stopped       -> the node watch, once the node
                 (the one-machine cluster's drill)             controller marks it NotReady
"""

from __future__ import annotations

import enum
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Sequence


class FaultKind(str, enum.Enum):
    KILL = "kill"
    SEGFAULT = "segfault"
    EXIT = "exit"
    EXCEPTION = "exception"
    COMMS = "comms"
    HANG = "hang"
    CORRUPT = "corrupt"
    SLOW = "slow"
    PREEMPT = "preempt"
    NODE_DOWN = "node_down"
    POD_DELETE = "pod_delete"
    EVICT = "evict"
    NODE_NOTREADY = "node_notready"

    @classmethod
    def parse(cls, value: "str | FaultKind", field_name: str = "kind") -> "FaultKind":
        if isinstance(value, FaultKind):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            allowed = ", ".join(k.value for k in cls)
            raise ValueError(f"{field_name}: unknown fault kind {value!r}; allowed values: {allowed}") from None

    def __str__(self) -> str:
        return self.value


# Faults the controller makes happen through the cluster's scheduler, not inside a worker.
CLUSTER_KINDS = frozenset({FaultKind.PREEMPT, FaultKind.NODE_DOWN, FaultKind.POD_DELETE, FaultKind.EVICT,
                           FaultKind.NODE_NOTREADY})
# The cluster kinds each job's scheduler delivers (jobs.slurm and jobs.kubernetes_allocation name them too).
JOB_CLUSTER_KINDS = {"slurm": frozenset({FaultKind.PREEMPT, FaultKind.NODE_DOWN}),
                     "kubernetes": frozenset({FaultKind.POD_DELETE, FaultKind.EVICT, FaultKind.NODE_NOTREADY})}


def kinds_for(job: str | None) -> tuple[str, ...]:
    """The fault kinds a run on ``job`` can be given: every worker kind, and the cluster kinds
    of its own scheduler only (a local run has none)."""
    own = JOB_CLUSTER_KINDS.get(job or "local", frozenset())
    return tuple(k.value for k in FaultKind if k not in CLUSTER_KINDS or k in own)

# Faults after which nothing fails, so no recovery follows (the check they test records itself).
FAILS_NOTHING = frozenset({FaultKind.CORRUPT.value, FaultKind.SLOW.value})
MAX_SLOW_FACTOR = 20.0


def refuse_corrupt_unless_striped(kind: "FaultKind | str", heal_transport: str) -> None:
    """A ``corrupt`` fault flips a byte of a striped heal: refuse it on a run that heals otherwise."""
    if FaultKind.parse(kind) is FaultKind.CORRUPT and heal_transport != "striped":
        raise ValueError(f"kind: a corrupt fault flips a byte of a striped heal; this run heals over "
                         f"{heal_transport!r} (RunConfig(heal_transport='striped'), the default)")


EXIT_CODE = 13  # what the ``exit`` fault exits with

# How a process ends once it fired a fault of these kinds (by kind value), in the words of
# ``monarch_nb.meshes.exit_status``: the pid check's account of a process whose exit status
# Monarch reaped before it could be read, but which recorded the firing in the fault log.
ENDS_PROCESS = {
    FaultKind.KILL.value: f"killed by signal {int(signal.SIGKILL)} (SIGKILL)",
    FaultKind.SEGFAULT.value: f"killed by signal {int(signal.SIGSEGV)} (SIGSEGV)",
    FaultKind.EXIT.value: f"exited with code {EXIT_CODE}",
}


# Moments of a recovery a worker-side fault can be aimed at (``Fault.during``): the next time this
# process enters that phase. "quorum": before it asks for a quorum; "pg_setup": when it starts
# building the new quorum's process group (its peers are connecting to it); "heal_send": when
# it starts serving its state to a healing peer (the donor); "heal_recv": when it starts
# fetching the state from a peer (the victim, mid-heal).
PHASES = ("quorum", "pg_setup", "heal_send", "heal_recv")


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    replica: int
    rank: int = 0
    at_step: int | None = None  # fire when the trainer reaches this step
    after_s: float | None = None  # or fire this many seconds after injection
    hang_s: float = 30.0  # for HANG: how long the GIL is held
    during: str | None = None  # or fire when the process next enters this phase (PHASES)
    stuck: bool = False  # COMMS only: the process cannot rebuild its communicator (a repair hangs hang_s)
    factor: float = 2.5  # SLOW only: the group's steps take this many times as long (1: back to normal)

    def validate(self, replicas: int, group_size: int) -> None:
        FaultKind.parse(self.kind)
        if not isinstance(self.replica, int) or not 0 <= self.replica < replicas:
            raise ValueError(f"replica: {self.replica!r} out of range; allowed values: 0..{replicas - 1}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < group_size:
            raise ValueError(f"rank: {self.rank!r} out of range; allowed values: 0..{group_size - 1}")
        if self.at_step is not None and self.after_s is not None:
            raise ValueError("at_step/after_s: give at most one trigger (at_step=N or after_s=SECONDS)")
        if self.at_step is not None and (not isinstance(self.at_step, int) or self.at_step < 1):
            raise ValueError(f"at_step: must be an integer >= 1, got {self.at_step!r}")
        if self.after_s is not None and self.after_s < 0:
            raise ValueError(f"after_s: must be >= 0 seconds, got {self.after_s!r}")
        if self.hang_s <= 0:
            raise ValueError(f"hang_s: must be > 0 seconds, got {self.hang_s!r}")
        if self.during is not None:
            if self.during not in PHASES:
                raise ValueError(f"during: unknown phase {self.during!r}; allowed values: {', '.join(PHASES)}")
            if self.at_step is not None or self.after_s is not None:
                raise ValueError("during/at_step/after_s: give at most one trigger")
            if self.kind in CLUSTER_KINDS or self.kind is FaultKind.EXCEPTION:
                raise ValueError(f"during: a {self.kind.value} fault cannot be aimed at a phase inside a worker; "
                                 "allowed kinds: kill, segfault, exit, comms, hang")
        if self.stuck and FaultKind.parse(self.kind) is not FaultKind.COMMS:
            raise ValueError(f"stuck: only a comms fault can be stuck (its communicator cannot be rebuilt in "
                             f"place); got kind {FaultKind.parse(self.kind).value!r}")
        if FaultKind.parse(self.kind) is FaultKind.SLOW:
            refuse_bad_slow(self)
        if self.kind in CLUSTER_KINDS and self.at_step is not None:
            raise ValueError(f"at_step: {self.kind.value} is done through the scheduler, which knows no steps; "
                             "give after_s=SECONDS or nothing (at once)")


def refuse_bad_slow(fault: "Fault") -> None:
    """A ``slow`` fault makes a group's steps ``factor`` times as long, from now until another
    ``slow`` with factor 1."""
    f = fault.factor
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1.0 <= f <= MAX_SLOW_FACTOR:
        raise ValueError(f"factor: a slow fault makes the group's steps take factor times as long; got {f!r}, "
                         f"allowed: 1 (back to normal) to {MAX_SLOW_FACTOR:g}"
                         + (" (below 1 would make it faster)" if isinstance(f, (int, float)) and f < 1 else ""))
    if fault.at_step is not None or fault.during is not None:
        raise ValueError("at_step/during: a slow fault starts at once (or after_s=SECONDS) and lasts until "
                         "another slow fault with factor 1")


@dataclass
class FaultSchedule:
    """Random faults every ``every_s`` seconds (soak testing); deterministic for a seed."""

    every_s: float
    kinds: Sequence[FaultKind | str] = (FaultKind.KILL,)
    seed: int | None = None
    rank: int | None = None  # None: a random rank of the chosen group
    max_faults: int | None = None
    at_once: int = 1  # groups hit together in each wave (the seed's runs lost several at a time)
    keep: int = 1  # a wave never leaves fewer training groups than this (smaller waves, or none)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.every_s or self.every_s <= 0:
            raise ValueError(f"every: must be > 0 seconds, got {self.every_s!r}")
        if not self.kinds:
            raise ValueError("kinds: give at least one fault kind; allowed values: "
                             + ", ".join(k.value for k in FaultKind))
        self.kinds = tuple(FaultKind.parse(k, "kinds") for k in self.kinds)
        if self.max_faults is not None and self.max_faults < 1:
            raise ValueError(f"max_faults: must be >= 1, got {self.max_faults!r}")
        if not isinstance(self.at_once, int) or self.at_once < 1:
            raise ValueError(f"at_once: must be an integer >= 1, got {self.at_once!r}")
        if not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 1:
            raise ValueError(f"keep: must be an integer >= 1 (training groups a wave leaves standing), "
                             f"got {self.keep!r}")
        self._rng = random.Random(self.seed)

    def next_wave(self, group_size: int, eligible: Sequence[int], limit: int) -> list[Fault]:
        """Up to ``at_once`` faults (and at most ``limit``) into distinct eligible groups."""
        pool = list(eligible)
        count = min(self.at_once, limit, len(pool))
        kind = self._rng.choice(list(self.kinds))
        return [Fault(kind=kind, replica=replica,
                      rank=self.rank if self.rank is not None else self._rng.randrange(group_size))
                for replica in self._rng.sample(pool, count)]


def record_firing(log_path: str | None, info: dict[str, Any]) -> None:
    """Append one line to the run's fault log before firing (the process may die next)."""
    if not log_path:
        return
    try:
        line = (json.dumps({"t": time.time(), **info}) + "\n").encode()
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # another host, read-only dir: the controller falls back to the injection time
