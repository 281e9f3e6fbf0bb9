"""Worker telemetry in, typed events out: the translation, kept free of processes and clocks.

Each trainer rank hands the controller plain dicts (``{"kind": "step", ...}``) when polled.
:class:`EventIngest` turns one poll of one group into :mod:`monarch_nb.telemetry.events`:
rank 0 speaks for the group's steps and quorums; a quorum is recorded once per run however
many groups report it; a heal is recorded once per group, when every rank has healed its
shard (bytes summed, the slowest rank's time); and the first committed step of a group that
is being recovered is its ``Rejoined``. Parameter digests come out as :class:`HashReport`
for the identity checks. Nothing here calls a process, so it is unit-tested with dicts.
"""

from __future__ import annotations

import collections

from dataclasses import dataclass
from typing import Any, Iterable

from ...telemetry.events import (
    CheckpointAbandoned,
    CheckpointFailed,
    CheckpointLoaded,
    CheckpointSaved,
    CommsRetry,
    Event,
    HealCorrupt,
    Healed,
    Quorum,
    QuorumTimedOut,
    Rejoined,
    Repaired,
    Step,
    Validated,
)


@dataclass(frozen=True)
class HashReport:
    """Digests of one rank's parameters and optimizer state after committing ``step``."""

    replica: int
    rank: int
    step: int
    params: str
    optim: str


@dataclass(frozen=True)
class HashSkipped:
    """A rank armed for digests at ``step`` that never committed it: it healed from a peer to
    ``at``, past the step. The check compares the groups that did commit it."""

    replica: int
    rank: int
    step: int
    at: int


def unseen(value: dict[str, Any], seen: int) -> tuple[list[dict[str, Any]], int]:
    """The events of one rank's poll the controller does not hold yet, and the new last sequence
    number it holds: a poll re-sends every event not acknowledged (numbered from ``first_seq``),
    so a late answer's events come again with the next poll and must not count twice."""
    events, first = list(value.get("events", ())), value.get("first_seq")
    if first is None:
        return events, seen
    return events[max(0, seen + 1 - int(first)):], max(seen, int(first) + len(events) - 1)


def _breakdown(parts: dict[int, dict[str, Any]]) -> dict[str, float] | None:
    """The slowest rank's heal in phases (a striped heal reports them)."""
    slowest = max(parts.values(), key=lambda p: float(p["seconds"]))
    if slowest.get("fetch_s") is None:
        return None
    return {k: round(float(slowest.get(k) or 0.0), 4) for k in ("manifest_s", "fetch_s", "apply_s")}


class EventIngest:
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._seen_quorums: set[int] = set()
        self._stores: dict[str, int] = {}  # a group's store address (host:port) -> its replica
        self._heal_parts: dict[int, dict[int, dict[str, Any]]] = {}
        self._failed_at: dict[int, float] = {}  # replica -> when its failure happened (awaiting rejoin)
        self._recent: dict[int, collections.deque[tuple[float, int]]] = {}  # replica -> its last commits (t, step)
        self._back: dict[int, tuple[float, int]] = {}  # replica -> its first commit after the failure, if seen

    def expect_rejoin(self, replica: int, failed_at: float, maybe_back: bool = False) -> None:
        """The group is being recovered: its next committed step is its rejoin. ``maybe_back``:
        the worker rebuilt its communicator at once, so it may have committed before the
        controller knew of the failure - the rejoin is then that first commit after ``failed_at``
        (reported with the next commit, so that it follows the rung's events)."""
        self._failed_at[replica] = failed_at
        self._heal_parts.pop(replica, None)
        recent = self._recent.pop(replica, ())
        back = next(((t, step) for t, step in recent if t > failed_at), None) if maybe_back else None
        if back is not None:
            self._back[replica] = back

    def awaiting_rejoin(self, replica: int) -> bool:
        return replica in self._failed_at

    def translate(self, replica: int, polls: dict[int, dict[str, Any]]) -> list[Event | HashReport | HashSkipped]:
        """Typed events from one poll of a group (rank -> what that rank returned), in time order."""
        merged = sorted(((float(ev.get("t", 0.0)), rank, i, ev) for rank, value in polls.items()
                         for i, ev in enumerate(value.get("events", ()))), key=lambda x: x[:3])
        out: list[Event | HashReport | HashSkipped] = []
        for _, rank, _, ev in merged:
            out.extend(self._one(replica, rank, ev))
        return out

    def _one(self, replica: int, rank: int, ev: dict[str, Any]) -> Iterable[Event | HashReport | HashSkipped]:
        kind = ev.get("kind")
        t = float(ev.get("t", 0.0))
        if kind == "step" and rank == 0:
            yield Step(t=t, replica=replica, step=int(ev["step"]), loss=float(ev["loss"]),
                       tokens_per_s=float(ev["tokens_per_s"]), committed=bool(ev["committed"]),
                       quorum_id=ev.get("quorum_id"), participants=ev.get("participants"),
                       quorum_s=ev.get("quorum_s"), average_s=ev.get("average_s"), commit_s=ev.get("commit_s"),
                       synced=ev.get("synced"), left=ev.get("left"))
            if ev["committed"] and replica in self._failed_at:
                # Normally after a "healed"; with no live peer to heal from (every group was
                # down) the first committed step is the rejoin all the same.
                failed_at = self._failed_at.pop(replica)
                t_back, step = self._back.pop(replica, (t, int(ev["step"])))
                yield Rejoined(t=t_back, replica=replica, step=step, seconds_since_failure=t_back - failed_at)
            elif ev["committed"]:
                self._recent.setdefault(replica, collections.deque(maxlen=64)).append((t, int(ev["step"])))
        elif kind == "quorum" and rank == 0:
            qid = int(ev["quorum_id"])
            if ev.get("own_store") and replica is not None:
                self._stores[str(ev["own_store"])] = replica
            if qid not in self._seen_quorums:
                self._seen_quorums.add(qid)
                yield Quorum(t=t, quorum_id=qid, participants=list(ev.get("participants") or []), replica=replica,
                             store_replica=self._stores.get(str(ev.get("store"))))
        elif kind == "healed":
            parts = self._heal_parts.setdefault(replica, {})
            parts[rank] = ev
            if len(parts) >= self.group_size:
                del self._heal_parts[replica]
                first = parts[min(parts)]
                step, from_step = int(first["step"]), first.get("from_step")
                unheard = first.get("unheard_s")
                if replica in self._failed_at:
                    cause = "recovery"
                elif from_step is None:
                    cause = "joining"  # a new group (scale-up) catching up with the run
                else:
                    cause = (f"left out of the quorum with no fault: steps {from_step + 1}-{step} committed without "
                             f"it, {unheard:.1f} s after its last commit")
                nbytes = sum(int(p["bytes"]) for p in parts.values())
                transfer = max(float(p.get("transfer_s") or 0.0) for p in parts.values())
                donors = sorted({d for p in parts.values() for d in (p.get("donors") or [])}, key=str)
                yield Healed(t=max(float(p["t"]) for p in parts.values()), replica=replica, step=step,
                             bytes=nbytes, seconds=max(float(p["seconds"]) for p in parts.values()),
                             donors=donors or None, gbps=round(nbytes / transfer / 1e9, 3) if transfer > 0 else None,
                             corrupt=sum(int(p.get("corrupt") or 0) for p in parts.values()),
                             passed_over=[d for p in parts.values() for d in (p.get("passed_over") or [])] or None,
                             breakdown=_breakdown(parts),
                             source_replica=first.get("source_replica"), cause=cause,
                             from_step=None if from_step is None else int(from_step),
                             unheard_s=None if unheard is None else round(float(unheard), 3))
        elif kind == "validated" and rank == 0:
            yield Validated(t=t, replica=replica, step=int(ev["step"]), loss=float(ev["loss"]),
                            batches=int(ev["batches"]), seconds=float(ev["seconds"]))
        elif kind == "heal_corrupt":
            yield HealCorrupt(t=t, replica=replica, rank=rank, step=int(ev["step"]), tensor=str(ev["tensor"]),
                              offset=int(ev["offset"]), donor=ev.get("donor"), refetched_from=ev.get("refetched_from"))
        elif kind == "checkpoint_saved" and rank == 0:
            yield CheckpointSaved(t=t, replica=replica, step=int(ev["step"]), bytes=int(ev["bytes"]),
                                  seconds=float(ev["seconds"]), stall=float(ev["stall"]), path=str(ev["path"]),
                                  final=bool(ev.get("final", False)), digest=str(ev.get("digest", "")))
        elif kind == "checkpoint_loaded" and rank == 0:
            yield CheckpointLoaded(t=t, replica=replica, step=int(ev["step"]), path=str(ev["path"]),
                                   seconds=float(ev["seconds"]), digest=str(ev.get("digest", "")))
        elif kind == "checkpoint_failed" and rank == 0:
            yield CheckpointFailed(t=t, replica=replica, step=int(ev["step"]), error=str(ev.get("error", "")))
        elif kind == "checkpoint_abandoned" and rank == 0:
            yield CheckpointAbandoned(t=t, replica=replica, step=int(ev["step"]), reason=str(ev.get("reason", "")))
        elif kind == "comms_retry" and rank == 0:
            yield CommsRetry(t=t, replica=replica, reason=str(ev.get("reason", "")), attempt=int(ev.get("attempt", 1)),
                             step=int(ev.get("step", 0)))
        elif kind == "repaired":  # from each rank that was broken (in a group of several, maybe not rank 0)
            yield Repaired(t=t, replica=replica, cause=str(ev.get("cause") or ""), seconds=float(ev.get("seconds", 0.0)),
                           step=int(ev.get("step", 0)), kept_member=ev.get("kept_member"), at_once=ev.get("at_once"))
        elif kind == "quorum_timeout" and rank == 0:
            yield QuorumTimedOut(t=t, replica=replica, error=str(ev.get("error", "")))
        elif kind == "hashes":
            yield HashReport(replica=replica, rank=rank, step=int(ev["step"]), params=str(ev["params"]),
                             optim=str(ev["optim"]))
        elif kind == "hashes_skipped":
            yield HashSkipped(replica=replica, rank=rank, step=int(ev["step"]), at=int(ev.get("at", 0)))
