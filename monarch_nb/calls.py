"""Endpoint calls with a deadline and per-rank outcomes.

Monarch's ``call()`` gathers a whole ValueMesh and can block forever when a rank dies
mid-collective. Here the message goes out through Monarch's own ``send`` with a ranked
port (a once port to a single actor), and replies are taken one at a time, as they arrive,
against a deadline, so the caller learns exactly which ranks answered, which raised, and
which were silent. ``DeadlineMesh`` puts that behind Monarch's adverbs (``.call``, ``.stream``,
...) for a whole actor mesh; it knows the session only through two callables it is given:
which mesh owns the actors (its dead ranks are not waited for) and where a timeout is
reported (``TimeoutReports``, which keeps the event log from growing an event per poll).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from monarch.actor import Channel, send

from . import seam
from .errors import CallInterrupted, CallTimeout, RemoteError
from .telemetry.events import CallTimedOut

if TYPE_CHECKING:
    from .meshes import MeshHandle
    from .telemetry import EventStore

TIMEOUT_EVENT_INTERVAL_S = 10.0


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


class TimeoutReports:
    """One ``call_timed_out`` event per mesh and endpoint per ``TIMEOUT_EVENT_INTERVAL_S``; the
    ones in between are counted in the next one's ``repeats`` (a poll loop against a silent rank
    must not grow the event log by an event per poll). Its lock guards the counters."""

    def __init__(self, events: "EventStore") -> None:
        self.events = events
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (mesh, endpoint) -> (last event, since)

    def record(self, event: CallTimedOut) -> None:
        now = time.monotonic()
        key = (event.mesh, event.endpoint)
        with self._lock:
            last, suppressed = self._last.get(key, (None, 0))
            if last is not None and now - last < TIMEOUT_EVENT_INTERVAL_S:
                self._last[key] = (last, suppressed + 1)
                return
            self._last[key] = (now, 0)
        self.events.append(dataclasses.replace(event, repeats=suppressed + 1))

    def forget(self, meshes: Iterable[str]) -> None:
        """Drop the counters of meshes taken down."""
        gone = set(meshes)
        with self._lock:
            self._last = {k: v for k, v in self._last.items() if k[0] not in gone}


class DeadlineEndpoint:
    """One endpoint of a ``DeadlineMesh``: Monarch's adverbs, each bounded by the deadline."""

    def __init__(self, view: "DeadlineMesh", name: str) -> None:
        self._view, self._name = view, name
        self._endpoint = getattr(view.actors, name)
        self._label = f"{seam.actor_mesh_name(view.actors)}.{name}"

    def _targets(self) -> "tuple[list[int], set[int], MeshHandle | None]":
        """(global ranks of the view, those known dead, the owning mesh)."""
        ranks = seam.actor_mesh_ranks(self._view.actors)
        owner = self._view.owner_of(self._view.actors)
        failed = set(owner.failed_ranks) & set(ranks) if owner else set()
        return ranks, failed, owner

    def gather(self, *args: Any, **kwargs: Any) -> MeshResult:
        """Per-rank outcome without raising: values, errors, and ranks that stayed silent."""
        view = self._view
        ranks, failed, owner = self._targets()
        local_live = [i for i, r in enumerate(ranks) if r not in failed]
        index = {r: i for i, r in enumerate(ranks)}

        def dead() -> set[int]:  # ranks that died during the call: stop waiting for them
            return {index[r] for r in owner.failed_ranks if r in index} if owner else set()

        try:
            result = gather(self._endpoint, self._label, args, kwargs, local_live, view.timeout, dead,
                            on_interrupt=view.on_interrupt, watch=view.watch, global_ranks=ranks,
                            while_waiting=view.while_waiting, size=len(ranks))
        except CallInterrupted as exc:
            _to_global(exc.result, ranks, failed)
            raise
        _to_global(result, ranks, failed)
        silent = sorted(set(result.missing) - set(owner.failed_ranks if owner else ()))
        if silent and view.on_timeout is not None:  # ranks known dead are no news: recorded when they died
            view.on_timeout(CallTimedOut(mesh=owner.name if owner else "?", endpoint=result.endpoint,
                                         missing_ranks=silent, timeout_s=view.timeout))
        return result

    def call(self, *args: Any, **kwargs: Any) -> MeshResult:
        result = self.gather(*args, **kwargs)
        _, failed, _ = self._targets()
        return raise_for_outcome(result, self._view.timeout, sorted(failed))

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        size = len(seam.actor_mesh_ranks(self._view.actors))
        if size != 1:
            raise ValueError(f"call_one needs a mesh of exactly one actor, this slice has {size}; "
                             "slice it first, e.g. .slice(gpus=0)")
        result = self.call(*args, **kwargs)
        return next(iter(result.values.values()))

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._endpoint.choose(*args, **kwargs).get(timeout=self._view.timeout)
        except TimeoutError:
            raise CallTimeout(f"{self._label} (choose)", [], self._view.timeout) from None

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        self._endpoint.broadcast(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Values in arrival order; raises the first rank's exception as ``RemoteError``, and
        ``CallTimeout`` at the deadline naming the ranks that stayed silent."""
        ranks, failed, _ = self._targets()
        pending = {i for i, r in enumerate(ranks) if r not in failed}
        for rank, ok, value in receive(self._endpoint, args, kwargs, len(pending), self._view.timeout,
                                       size=len(ranks)):
            pending.discard(rank)
            if not ok:
                raise RemoteError(self._label, {ranks[rank]: value}, {})
            yield value
        missing = sorted([ranks[i] for i in pending] + sorted(failed))
        if missing:
            raise CallTimeout(self._label, missing, self._view.timeout, failed_ranks=sorted(failed))


def _no_owner(actors: Any) -> "MeshHandle | None":
    return None


class DeadlineMesh:
    """``actors`` with a deadline on every call (``Session.deadline`` makes one).

    Args:
        actors: a Monarch actor mesh, or a slice of one.
        timeout: seconds each call may wait for its replies.
        owner_of: the mesh ``actors`` were spawned on (its ranks known dead are not waited
            for), or None; default: none known.
        on_timeout: told each call that found ranks silent past the deadline; default: nobody.
        on_interrupt: called on Ctrl-C during a ``gather``/``call`` (to stop the ranks too).
        watch: follows the progress of each ``gather``.
        while_waiting: called with the pending ranks every second of a ``gather``.
    """

    def __init__(self, actors: Any, timeout: float, *,
                 owner_of: "Callable[[Any], MeshHandle | None]" = _no_owner,
                 on_timeout: Callable[[CallTimedOut], None] | None = None,
                 on_interrupt: Callable[[], None] | None = None, watch: CallWatch | None = None,
                 while_waiting: Callable[[set[int]], None] | None = None) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.actors, self.timeout = actors, timeout
        self.owner_of, self.on_timeout = owner_of, on_timeout
        self.on_interrupt, self.watch, self.while_waiting = on_interrupt, watch, while_waiting

    def __getattr__(self, name: str) -> DeadlineEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return DeadlineEndpoint(self, name)

    def slice(self, **dims: Any) -> "DeadlineMesh":
        return DeadlineMesh(self.actors.slice(**dims), self.timeout, owner_of=self.owner_of,
                            on_timeout=self.on_timeout, on_interrupt=self.on_interrupt, watch=self.watch)


def _to_global(result: MeshResult, ranks: list[int], failed: set[int]) -> None:
    """Report in the proc mesh's global ranks, and count known-dead ranks as missing."""
    result.values = {ranks[i]: v for i, v in result.values.items()}
    result.errors = {ranks[i]: e for i, e in result.errors.items()}
    result.missing = sorted(set([ranks[i] for i in result.missing]) | failed)
    result.ranks = ranks
