"""Endpoint calls with a deadline and per-rank outcomes.

Monarch's ``call()`` gathers a whole ValueMesh and can block forever when a rank dies
mid-collective. Here the message goes out through Monarch's own ``send`` with a ranked
port (a once port to a single actor), and replies are taken one at a time, as they arrive,
against a deadline, so the caller learns exactly which ranks answered, which raised, and
which were silent.
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from monarch.actor import Channel, send

from . import seam
from .errors import CallInterrupted, CallTimeout, RemoteError


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


# How often a wait for replies looks up from the channel: to check whether it should give up
# (a rank it waits on died), to report progress, and to take a Ctrl-C promptly.
_CHECK_S = 0.1
# After an interrupt, how long replies are still taken (the interrupted ranks' own answers).
INTERRUPT_GRACE_S = 1.0
# How often a wait runs its ``while_waiting`` look (is a waited-on rank stopped in the debugger?).
WHILE_WAITING_S = 1.0


_SENT = itertools.count()  # messages sent for replies by this process (next() is atomic under the GIL)


def messages_sent() -> int:
    """How many calls this controller has made so far (every call leaves a little behind inside
    Monarch: bench/monarch_leaks.py; a soak reports the rate)."""
    return next(copy.copy(_SENT))


class Replies:
    """The replies to one message sent to every actor of ``endpoint``'s mesh, taken one at a
    time as they arrive: ``next(wait)`` is a reply ``(local rank, ok, value)`` or None when none
    came within ``wait`` seconds. Waits are short, so the caller stays interruptible.

    ``size`` is how many actors the message reaches. To one actor the reply comes through a once
    port, which Monarch frees when the reply arrives; a port for several replies stays in the
    controller's mailbox until the process exits (0.8 KB of native memory per call against
    0.07, bench/monarch_leaks.py: at the soak's 11 polls a second, 33 MB an hour against 3).
    Several actors need that port: sending to each one's slice instead would change what
    ``current_rank()`` says inside the endpoint."""

    def __init__(self, endpoint: Any, args: tuple, kwargs: dict, timeout: float, size: int | None = None) -> None:
        if size == 1:
            port, receiver = Channel.open(once=True)
            self._single = True
        else:
            port, receiver = seam.open_outcome_channel()
            self._single = False
        self._outcomes = receiver
        next(_SENT)
        self.deadline = time.monotonic() + timeout
        self._pending: Any = None
        send(endpoint, args, kwargs, port=port)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def next(self, wait: float) -> tuple[int, bool, Any] | None:
        if self._pending is None:
            self._pending = self._outcomes.recv()
        try:
            reply = self._pending.get(timeout=max(0.001, min(wait, self.left())))
        except TimeoutError:
            return None
        except Exception as exc:  # the one actor raised (Monarch's ActorError): delivered as data
            if not self._single:
                raise
            self._pending = None
            return 0, False, exc
        self._pending = None
        return (0, True, reply) if self._single else reply


def receive(endpoint: Any, args: tuple, kwargs: dict, expected: int, timeout: float,
            give_up: Callable[[], bool] | None = None, size: int | None = None) -> Iterator[tuple[int, bool, Any]]:
    """Send to every actor of ``endpoint``'s mesh (``size`` of them, if known); yield
    ``(local rank, ok, value)`` in arrival order until ``expected`` replies came, ``timeout``
    seconds passed, or ``give_up()`` says a rank that has not answered is known dead (checked
    every 0.1 s: no wait on the dead)."""
    replies = Replies(endpoint, args, kwargs, timeout, size)
    for _ in range(expected):
        while True:
            if replies.left() <= 0 or (give_up is not None and give_up()):
                return
            reply = replies.next(_CHECK_S)
            if reply is not None:
                break
        yield reply


@dataclass
class CallWatch:
    """How far one call got, for a progress display: ``answered`` and ``pending`` are the
    mesh's global ranks; written by the call, read by whoever shows it."""

    total: int = 0
    answered: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)


def gather(endpoint: Any, name: str, args: tuple, kwargs: dict, ranks: list[int], timeout: float,
           dead: Callable[[], set[int]] | None = None, *, on_interrupt: Callable[[], None] | None = None,
           watch: CallWatch | None = None, global_ranks: list[int] | None = None,
           while_waiting: Callable[[set[int]], None] | None = None, size: int | None = None) -> MeshResult:
    """Collect every reply of one call to ``ranks`` (slice-local) until all arrive, the deadline
    passes, or ``dead()`` (slice-local ranks known dead) names one that has not answered.

    Ctrl-C stops the wait within 0.1 s and raises :class:`CallInterrupted` with what came.
    With ``on_interrupt`` (which tells the ranks to stop), replies are still taken for
    ``INTERRUPT_GRACE_S`` first, so the interrupted ranks' own answers are in the result.
    ``while_waiting(pending global ranks)`` runs every ``WHILE_WAITING_S`` on this thread (the
    cell's debugger: ranks stopped at a breakpoint); the time it takes does not count against
    the deadline."""
    started = time.monotonic()
    result = MeshResult(endpoint=name, ranks=list(ranks))
    pending = set(ranks)
    to_global = (lambda r: global_ranks[r]) if global_ranks is not None else (lambda r: r)
    if watch is not None:
        watch.total, watch.pending = len(pending), {to_global(r) for r in pending}
    replies = Replies(endpoint, args, kwargs, timeout, size)
    next_look = started + WHILE_WAITING_S

    def take() -> None:
        nonlocal next_look
        while pending:
            if replies.left() <= 0 or (dead is not None and pending & dead()):
                return
            if while_waiting is not None and time.monotonic() >= next_look:
                t0 = time.monotonic()
                while_waiting({to_global(r) for r in pending})
                replies.deadline += time.monotonic() - t0
                next_look = time.monotonic() + WHILE_WAITING_S
            reply = replies.next(_CHECK_S)
            if reply is None:
                continue
            rank, ok, value = reply
            pending.discard(rank)
            (result.values if ok else result.errors)[rank] = value
            if watch is not None:
                watch.pending.discard(to_global(rank))
                watch.answered.add(to_global(rank))

    interrupted = False
    while True:  # the try is around the whole loop: Python takes a signal at the loop's jump back
        try:
            take()
            break
        except KeyboardInterrupt:
            if interrupted or on_interrupt is None:
                interrupted = True
                break
            interrupted = True
            on_interrupt()
            replies.deadline = min(replies.deadline, time.monotonic() + INTERRUPT_GRACE_S)
    result.missing = sorted(pending)
    result.seconds = time.monotonic() - started
    if interrupted:
        raise CallInterrupted(name, result)
    return result


def raise_for_outcome(result: MeshResult, timeout: float, failed_ranks: list[int] | None = None) -> MeshResult:
    if result.missing:
        raise CallTimeout(result.endpoint, result.missing, timeout, dict(result.values), failed_ranks)
    if result.errors:
        raise RemoteError(result.endpoint, result.errors, dict(result.values))
    return result
