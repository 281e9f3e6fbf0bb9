"""Typed telemetry events: the one vocabulary shared by controller, widgets, CLI and benchmarks.

Every event is a frozen dataclass with a ``kind`` (its JSON tag) and ``t`` (unix seconds).
Each serialises to one JSON object per line in a run's ``events.jsonl``; ``event_from_dict``
turns a line back into the same dataclass, so a reopened run sees exactly what a live one saw.
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
    """Monarch supervision reported a dead or failed process of a mesh."""

    kind: ClassVar[str] = "worker_failed"
    mesh: str
    rank: int | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class CallTimedOut(Event):
    kind: ClassVar[str] = "call_timed_out"
    mesh: str
    endpoint: str
    missing_ranks: list[int]
    timeout_s: float


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
class Step(Event):
    kind: ClassVar[str] = "step"
    replica: int
    step: int
    loss: float
    tokens_per_s: float
    committed: bool
    quorum_id: int | None = None
    participants: int | None = None


@dataclass(frozen=True, kw_only=True)
class Quorum(Event):
    kind: ClassVar[str] = "quorum"
    quorum_id: int
    participants: list[int]
    replica: int | None = None


@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    kind: ClassVar[str] = "fault_injected"
    fault: str
    replica: int
    rank: int
    step: int | None = None


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
class Respawned(Event):
    """The replacement group's trainers are built and training started (acquire + build)."""

    kind: ClassVar[str] = "respawned"
    replica: int
    attempt: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Healed(Event):
    kind: ClassVar[str] = "healed"
    replica: int
    step: int
    bytes: int
    seconds: float
    source_replica: int | None


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


def event_from_dict(data: dict[str, Any]) -> Event:
    kind = data.get("kind", "")
    cls = _KINDS.get(kind)
    if cls is None or cls is UnknownEvent:
        rest = {k: v for k, v in data.items() if k not in ("t", "kind")}
        return UnknownEvent(t=float(data.get("t", 0.0)), raw_kind=str(kind), data=rest)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def event_kinds() -> dict[str, type[Event]]:
    return dict(_KINDS)
