"""Typed telemetry events: the one vocabulary shared by controller, widgets, CLI and benchmarks.

Every event is a frozen dataclass with a ``kind`` (its JSON tag) and ``t`` (unix seconds).
Each serialises to one JSON object per line in a run's ``events.jsonl``; ``event_from_dict``
(:mod:`.decode`) turns a line back into the same dataclass, so a reopened run sees exactly what a live one saw.
Unknown kinds (from a newer writer) load as ``UnknownEvent`` instead of failing the reader.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

_KINDS: dict[str, type["Event"]] = {}


def _now() -> float:
    return time.time()


@dataclass(frozen=True, kw_only=True)
class Event:
    kind: ClassVar[str] = "event"
    t: float = field(default_factory=_now)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls

    def to_dict(self) -> dict[str, Any]:
        data = {"t": self.t, "kind": self.kind}
        for f in dataclasses.fields(self):
            if f.name != "t":
                data[f.name] = getattr(self, f.name)
        return data


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A line whose kind this version does not know; kept verbatim."""

    raw_kind: str
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, "t": self.t, "kind": self.raw_kind}


# ---- controller / meshes -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MeshUp(Event):
    kind: ClassVar[str] = "mesh_up"
    mesh: str
    shape: dict[str, int]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class MeshDown(Event):
    kind: ClassVar[str] = "mesh_down"
    mesh: str


@dataclass(frozen=True, kw_only=True)
class WorkerFailed(Event):
    """A process of a mesh failed: reported once per failed rank, by whoever saw it first
    (Monarch supervision, a pid check, a training run's supervisor). ``reason`` is the fault
    itself (a signal, an exception's text, a hang, a broken collective); ``action`` what the
    controller does about it, when something does (a training run replaces the group)."""

    kind: ClassVar[str] = "worker_failed"
    mesh: str
    rank: int | None
    reason: str
    action: str | None = None
    late: bool = False  # logs before worker_exit_reported existed: Monarch's report after the teardown


@dataclass(frozen=True, kw_only=True)
class WorkerExitReported(Event):
    """Monarch's account of how a process of a mesh already torn down ended. Not a failure of
    its own: either our own teardown (a kill, a stop), or the explanation of a failure already
    reported (e.g. the signal behind a pid check's "process is gone"). Never shown as a notice."""

    kind: ClassVar[str] = "worker_exit_reported"
    mesh: str
    rank: int | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class CallTimedOut(Event):
    """Calls to ``endpoint`` found ranks silent past their deadline; ``repeats`` counts the calls
    since the previous such event (at most one per mesh and endpoint every 10 s)."""

    kind: ClassVar[str] = "call_timed_out"
    mesh: str
    endpoint: str
    missing_ranks: list[int]
    timeout_s: float
    repeats: int = 1


# ---- fault-tolerant training ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    run_id: str
    config: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class RunStopped(Event):
    kind: ClassVar[str] = "run_stopped"
    run_id: str
    reason: str = "stopped"


@dataclass(frozen=True, kw_only=True)
class ReplicaState(Event):
    """A replica group changed state: starting, training, failed, respawning, healing, stopped."""

    kind: ClassVar[str] = "replica_state"
    replica: int
    state: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class CheckpointLoaded(Event):
    """A group replaced its state with a durable checkpoint's (a restart from disk, a resume):
    ``seconds`` its rank 0 spent reading it. In a restart every group loads at once."""

    kind: ClassVar[str] = "checkpoint_loaded"
    replica: int
    step: int
    path: str
    seconds: float
    digest: str = ""  # rank 0's parameters right after the load (compare with the save's)


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    """A durable checkpoint is complete on disk. ``stall`` is what the training step lost to it
    (staging a copy); ``seconds`` from the save's start to the end of its write, off the critical
    path (a write on the training thread would end within the stall)."""

    kind: ClassVar[str] = "checkpoint_saved"
    replica: int
    step: int
    bytes: int
    seconds: float
    stall: float
    path: str
    final: bool = False  # the run's last step, written when every group had finished
    digest: str = ""  # (final saves) rank 0's parameters as saved


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Event):
    """A durable checkpoint could not be written (full disk...); training went on."""

    kind: ClassVar[str] = "checkpoint_failed"
    replica: int
    step: int
    error: str


@dataclass(frozen=True, kw_only=True)
class CheckpointAbandoned(Event):
    """A durable save that never completed: the run stopped before its write finished (or its
    writer was killed). Its directory is removed, so it can never be mistaken for a checkpoint.
    ``replica`` is the saving group when it reported it, None when the controller found it."""

    kind: ClassVar[str] = "checkpoint_abandoned"
    step: int
    reason: str
    replica: int | None = None


@dataclass(frozen=True, kw_only=True)
class AllGroupsLost(Event):
    """No group holds the run's state any more (every group failed): ``checkpoint`` is what the
    run resumes from, or None when there is none (the groups then wait)."""

    kind: ClassVar[str] = "all_groups_lost"
    step: int
    checkpoint: str | None
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class CheckpointLoadFailed(Event):
    """Resuming from a durable checkpoint failed for ``replicas`` (the run is not resumed; it
    tries again shortly)."""

    kind: ClassVar[str] = "checkpoint_load_failed"
    step: int
    checkpoint: str
    replicas: list[int] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """The run continues from a durable checkpoint (after losing every group, or FTRun.resume)."""

    kind: ClassVar[str] = "resumed"
    step: int
    checkpoint: str
    reason: str
    source_run: str | None = None  # the run that wrote the checkpoint, when it is another run (resume_from)


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event):
    """Every group reached the run's last step: its state is saved as a durable checkpoint in the
    run's own folder (``checkpoint``; None when no group could save it, with ``error``) and the
    run lets its workers and Lighthouse go (a ``run_stopped`` with reason "finished" follows)."""

    kind: ClassVar[str] = "run_finished"
    step: int
    checkpoint: str | None
    seconds: float  # the final save
    digest: str = ""  # the saved parameters (rank 0's), as a resume's checkpoint_loaded reports them
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class RestartedFromScratch(Event):
    """Every group was lost with no checkpoint, and the user chose to train again from the
    initial weights (``FTRun.restart_from_scratch``): the state of ``lost_step`` is gone."""

    kind: ClassVar[str] = "restarted_from_scratch"
    lost_step: int
    replicas: list[int] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class RestartedFromCheckpoint(Event):
    """on_failure="restart": after a failure every group was stopped and restarted from disk."""

    kind: ClassVar[str] = "restarted_from_checkpoint"
    step: int  # the checkpoint's step (0: none, from the start)
    checkpoint: str | None
    lost_steps: int  # committed steps redone: the run's last step minus the checkpoint's
    seconds: float


@dataclass(frozen=True, kw_only=True)
class QuorumTimedOut(Event):
    """A group waited ``quorum_timeout_s`` for a quorum and asks again (Lighthouse lost, or too
    few groups alive for ``min_replicas``)."""

    kind: ClassVar[str] = "quorum_timed_out"
    replica: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class CommsRetry(Event):
    """A group's cross-replica communication broke through no fault of its own (a peer died
    during the quorum or while the quorum's process group was built): it keeps its process,
    state and step, rebuilds its torchft Manager in place and joins the next quorum. Not a
    failure: nothing is respawned."""

    kind: ClassVar[str] = "comms_retry"
    replica: int
    reason: str
    attempt: int = 1
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class LighthouseFailed(Event):
    """The torchft Lighthouse is gone (or could not be brought back); ``reason`` says so in words."""

    kind: ClassVar[str] = "lighthouse_failed"
    address: str
    pid: int | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class LighthouseStarted(Event):
    """The run's torchft Lighthouse is up; ``address`` is also its status page (quorum, heartbeats)."""

    kind: ClassVar[str] = "lighthouse_started"
    address: str
    pid: int | None
    join_timeout_ms: int | None = None  # as started: stretched on an oversubscribed host (join_timeout_for)
    name_lookup: str | None = None  # why a quorum change may wait on DNS here (name_lookup.py); None: it will not


@dataclass(frozen=True, kw_only=True)
class LighthouseRestarted(Event):
    kind: ClassVar[str] = "lighthouse_restarted"
    address: str
    pid: int | None
    seconds: float


@dataclass(frozen=True, kw_only=True)
class SpareState(Event):
    """A warm spare group changed state: building, ready, taken (by a failed group), failed."""

    kind: ClassVar[str] = "spare_state"
    spare: int
    state: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Scaled(Event):
    """The run was resized: groups added (from spares or fresh) and groups retired."""

    kind: ClassVar[str] = "scaled"
    replicas: int
    added: list[int]
    retired: list[int]


@dataclass(frozen=True, kw_only=True)
class Draining(Event):
    """A planned move began (``FTRun.drain``): group ``replica`` keeps training while a
    replacement (``replacement``, a warm spare or fresh processes) heals from live peers."""

    kind: ClassVar[str] = "draining"
    replica: int
    replacement: int
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Drained(Event):
    """The move is done: the replacement committed a step with the others, then ``replica`` left
    at a step boundary (retired, not failed). ``seconds`` from ``draining`` to here."""

    kind: ClassVar[str] = "drained"
    replica: int
    replacement: int
    seconds: float
    from_spare: bool = False


@dataclass(frozen=True, kw_only=True)
class StragglerDetected(Event):
    """Group ``replica``'s own work per step is ``ratio`` times its peers' (median throughput over
    ``window`` committed steps, ``RunConfig.straggler_factor``); ``policy`` says what follows."""

    kind: ClassVar[str] = "straggler_detected"
    replica: int
    ratio: float
    tokens_per_s: float
    peers_tokens_per_s: float
    window: int
    policy: str = "observe"


@dataclass(frozen=True, kw_only=True)
class StragglerCleared(Event):
    """A group named slow keeps up with its peers again."""

    kind: ClassVar[str] = "straggler_cleared"
    replica: int
    ratio: float


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    kind: ClassVar[str] = "step"
    replica: int
    step: int
    loss: float
    tokens_per_s: float
    committed: bool
    quorum_id: int | None = None
    participants: int | None = None
    # where the step's time went, in seconds (None from logs written before they were kept): its
    # quorum, the cross-group gradient average and should_commit - what fault tolerance adds
    quorum_s: float | None = None
    average_s: float | None = None
    commit_s: float | None = None
    synced: bool | None = None  # LocalSGD / DiLoCo: the groups met in this step (False: the meeting failed)
    left: bool | None = None  # the group's last step before it left (a drain): averaged, then gone without commit


@dataclass(frozen=True, kw_only=True)
class Validated(Event):
    """A group's held-out loss (a torchtitan job's validator): the mean over ``batches`` batches of
    its validation set, no gradients, after committing ``step``."""

    kind: ClassVar[str] = "validated"
    replica: int
    step: int
    loss: float
    batches: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Quorum(Event):
    kind: ClassVar[str] = "quorum"
    quorum_id: int
    participants: list[int]
    replica: int | None = None
    store_replica: int | None = None  # the group whose store the quorum's process group connects through


@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    kind: ClassVar[str] = "fault_injected"
    fault: str
    replica: int
    rank: int
    step: int | None = None
    factor: float | None = None  # a ``slow`` fault: the group's steps take this many times as long


@dataclass(frozen=True, kw_only=True)
class FaultSkipped(Event):
    """A scheduled wave fired fewer faults than asked (``wanted``), or none: too few groups were
    training to leave ``keep`` standing. ``reason`` says so in words."""

    kind: ClassVar[str] = "fault_skipped"
    wanted: int
    fired: int
    training: int
    keep: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class FailureDetected(Event):
    """The controller decided a replica group has failed; ``source`` says what noticed it
    (supervision, pid, endpoint, trainer, hang, scheduler)."""

    kind: ClassVar[str] = "failure_detected"
    replica: int
    rank: int | None
    reason: str
    detection_s: float | None = None
    source: str | None = None
    stack: str | None = None  # a hang: the stuck rank's Python stack, read before it was killed


@dataclass(frozen=True, kw_only=True)
class TornDown(Event):
    """The failed group's processes are gone (killed and reaped, or the allocation released)."""

    kind: ClassVar[str] = "torn_down"
    replica: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Acquired(Event):
    """Processes to replace a failed group are up: ``how`` is spawn, spare or allocation."""

    kind: ClassVar[str] = "acquired"
    replica: int
    how: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class RungStarted(Event):
    """The recovery ladder (ft/control/ladder.py) tries ``rung`` on a failed group: the lowest
    rung that can fix its failure, or the next one up after an escalation. Rungs, lowest first:
    communicator, step, process, hosts, checkpoint."""

    kind: ClassVar[str] = "rung_started"
    replica: int
    rung: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class RungEscalated(Event):
    """``rung`` did not bring the group back (``reason``) after ``seconds``: ``to`` takes over."""

    kind: ClassVar[str] = "rung_escalated"
    replica: int
    rung: str
    to: str
    reason: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Repaired(Event):
    """A stalled group was repaired in its own processes (rung communicator or step): a new
    cross-replica communicator, the broken step dropped; model, optimizer and step kept.
    ``seconds``: the repair itself; the group rejoins at its next committed step.
    ``kept_member``: it stayed a quorum member throughout (after a failed collective torchft's
    own error path gives the next quorum a new id and rebuilds the group), so the others never
    reconfigured without it and it needed no heal."""

    kind: ClassVar[str] = "repaired"
    replica: int
    cause: str
    seconds: float
    step: int
    kept_member: bool | None = None  # stayed in the quorum throughout (torchft's own error path rebuilt the group)
    at_once: bool | None = None  # the worker rebuilt it before the controller saw the stall (ladder.communicator_at_once)


@dataclass(frozen=True, kw_only=True)
class Respawned(Event):
    """The replacement group's trainers are built and training started (acquire + build)."""

    kind: ClassVar[str] = "respawned"
    replica: int
    attempt: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Healed(Event):
    """``cause`` says why: ``"recovery"`` (the group was failed and is coming back) or, for a
    group nobody failed, that quorums went on without it (``from_step`` was its last commit,
    ``unheard_s`` how long before the heal that was)."""

    kind: ClassVar[str] = "healed"
    replica: int
    step: int
    bytes: int
    seconds: float
    source_replica: int | None
    cause: str = ""
    from_step: int | None = None
    unheard_s: float | None = None
    # a striped heal (heal_transport "striped"): the groups that served it, the state's bytes
    # over the transfer's wall time, and pieces that arrived corrupt and were refetched
    donors: list[int | None] | None = None
    gbps: float | None = None
    corrupt: int = 0
    passed_over: list[dict[str, Any]] | None = None  # quorum members not used as donors, and why
    # where the slowest rank's heal time went: manifest_s (peers found, their manifests read),
    # fetch_s (bytes moved and checked), apply_s (loaded into the model; ~0 when written in place)
    breakdown: dict[str, float] | None = None

    @property
    def sources(self) -> list[int | None]:
        """The groups the state came from: a striped heal's donors, else torchft's one source."""
        return self.donors or ([self.source_replica] if self.source_replica is not None else [])

    @property
    def needless(self) -> bool:
        """Healed with no fault: it was left out of quorums while it was alive."""
        return self.cause.startswith("left out")


@dataclass(frozen=True, kw_only=True)
class HealCorrupt(Event):
    """A piece of a heal arrived different from its donor's digest of it: it was refetched from
    ``refetched_from`` (None: no other donor had it, and that heal failed)."""

    kind: ClassVar[str] = "heal_corrupt"
    replica: int
    rank: int
    step: int
    tensor: str
    offset: int
    donor: int | None
    refetched_from: int | None


@dataclass(frozen=True, kw_only=True)
class Rejoined(Event):
    kind: ClassVar[str] = "rejoined"
    replica: int
    step: int
    seconds_since_failure: float | None = None


@dataclass(frozen=True, kw_only=True)
class ReplicasIdentical(Event):
    kind: ClassVar[str] = "replicas_identical"
    step: int
    identical: bool
    hashes: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class GaveUp(Event):
    """The restart policy ran out of attempts for a replica group."""

    kind: ClassVar[str] = "gave_up"
    replica: int
    attempts: int
