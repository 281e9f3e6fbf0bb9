"""Endpoint calls with a deadline and per-rank outcomes.

Monarch's ``call()`` gathers a whole ValueMesh and can block forever when a rank dies
mid-collective. Here the message goes out through Monarch's own ``send`` with a ranked
port, and replies are collected one at a time against a deadline, so the caller learns
exactly which ranks answered, which raised, and which were silent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from monarch.actor import Channel, send
from monarch._src.actor.actor_mesh import RankedPortReceiver

from .errors import CallTimeout, RemoteError


class _OutcomeReceiver(RankedPortReceiver):
    """A ranked receiver that returns a rank's exception instead of raising it."""

    def _process(self, msg: Any) -> tuple[int, tuple[bool, Any]]:
        rank = getattr(msg.kind, "rank", None)
        try:
            return rank, (True, super(RankedPortReceiver, self)._process(msg))
        except Exception as exc:  # the remote exception, delivered as data
            return rank, (False, exc)


@dataclass
class MeshResult:
    """Per-rank outcome of one call: ``values`` for ranks that returned, ``errors`` for ranks that raised."""

    endpoint: str
    ranks: list[int]
    values: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def __getitem__(self, rank: int) -> Any:
        return self.values[rank]

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return iter(sorted(self.values.items()))

    def __len__(self) -> int:
        return len(self.values)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.missing

    def _repr_html_(self) -> str:
        from .notebook.html import mesh_result_html

        return mesh_result_html(self)


def _endpoint_name(endpoint: Any) -> str:
    name = getattr(endpoint, "_name", None) or getattr(endpoint, "__name__", None)
    owner = getattr(endpoint, "_actor_mesh", None)
    mesh_name = getattr(owner, "_name_str", None) if owner is not None else None
    return f"{mesh_name}.{name}" if mesh_name else str(name or endpoint)


def gather(endpoint: Any, args: tuple, kwargs: dict, ranks: list[int], timeout: float) -> MeshResult:
    """Send to every actor of ``endpoint``'s mesh and collect replies until all arrive or the deadline passes."""
    port, receiver = Channel.open()
    outcomes = _OutcomeReceiver(receiver._mailbox, receiver._receiver)
    started = time.monotonic()
    send(endpoint, args, kwargs, port=port)
    result = MeshResult(endpoint=_endpoint_name(endpoint), ranks=list(ranks))
    pending = set(ranks)
    while pending:
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            break
        try:
            rank, (ok, value) = outcomes.recv().get(timeout=left)
        except TimeoutError:
            break
        pending.discard(rank)
        (result.values if ok else result.errors)[rank] = value
    result.missing = sorted(pending)
    result.seconds = time.monotonic() - started
    return result


def raise_for_outcome(result: MeshResult, timeout: float, failed_ranks: list[int] | None = None) -> MeshResult:
    if result.missing:
        raise CallTimeout(result.endpoint, result.missing, timeout, dict(result.values), failed_ranks)
    if result.errors:
        raise RemoteError(result.endpoint, result.errors, dict(result.values))
    return result
