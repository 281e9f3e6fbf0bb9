"""Endpoint calls with a deadline and per-rank outcomes.

Monarch's ``call()`` gathers a whole ValueMesh and can block forever when a rank dies
mid-collective. Here the message goes out through Monarch's own ``send`` with a ranked
port, and replies are taken one at a time, as they arrive, against a deadline, so the
caller learns exactly which ranks answered, which raised, and which were silent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from monarch.actor import send

from . import seam
from .errors import CallTimeout, RemoteError


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


# How often a wait for replies checks whether it should give up (a rank it waits on died).
_CHECK_S = 0.1


def receive(endpoint: Any, args: tuple, kwargs: dict, expected: int, timeout: float,
            give_up: Callable[[], bool] | None = None) -> Iterator[tuple[int, bool, Any]]:
    """Send to every actor of ``endpoint``'s mesh; yield ``(local rank, ok, value)`` in arrival
    order until ``expected`` replies came, ``timeout`` seconds passed, or ``give_up()`` says a
    rank that has not answered is known dead (checked every 0.1 s: no wait on the dead)."""
    port, outcomes = seam.open_outcome_channel()
    deadline = time.monotonic() + timeout
    send(endpoint, args, kwargs, port=port)
    for _ in range(expected):
        pending = outcomes.recv()
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (give_up is not None and give_up()):
                return
            try:
                rank, ok, value = pending.get(timeout=min(left, _CHECK_S) if give_up else left)
                break
            except TimeoutError:
                continue
        yield rank, ok, value


def gather(endpoint: Any, name: str, args: tuple, kwargs: dict, ranks: list[int], timeout: float,
           dead: Callable[[], set[int]] | None = None) -> MeshResult:
    """Collect every reply of one call to ``ranks`` (slice-local) until all arrive, the deadline
    passes, or ``dead()`` (slice-local ranks known dead) names one that has not answered."""
    started = time.monotonic()
    result = MeshResult(endpoint=name, ranks=list(ranks))
    pending = set(ranks)
    give_up = (lambda: bool(pending & dead())) if dead is not None else None
    for rank, ok, value in receive(endpoint, args, kwargs, len(pending), timeout, give_up):
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
