"""Blocking on a live run for what a person waits for: a group back, or replicas proven equal.

``FTRun`` already blocks on events (``wait_for``), on steps (``wait_for_step``) and on one
identity check (``check_identical``). The two calls here answer the questions behind them,
from the same event stream and the one recovery model (:mod:`.recovery`):

* :func:`wait_for_rejoin` - which rejoin? The recoveries under way when it is called (a fault
  injected or a failure detected, and the group not back yet) are the ones a person is
  waiting for, so it waits for all of them (or for the one of ``replica``). With none under
  way it waits for the next rejoin recorded after the call. A group given up on, or the run
  stopping, ends the wait with an error instead of a timeout.
* :func:`wait_for_spares` - every warm spare built and ready, so that the next failure is
  taken by a spare and not by a cold respawn.
* :func:`require_identical` - one identity check, and an error naming the ranks whose
  digests differ from their peers' when the replicas are not bit-identical.

``%monarch wait`` (rejoin, spare) and ``%monarch check`` are these calls.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from ...telemetry.events import Event, GaveUp, Rejoined, ReplicasIdentical, RunStopped, SpareState
from ..record.recovery import RecoveryTracker

if TYPE_CHECKING:
    from .run import FTRun


class ReplicasDiffer(RuntimeError):
    """An identity check found replicas that are not bit-identical; ``event`` is the check and
    ``ranks`` the ``replica{r}/rank{k}`` entries that differ from their peers."""

    def __init__(self, event: ReplicasIdentical, ranks: list[str], message: str) -> None:
        super().__init__(message)
        self.event, self.ranks = event, ranks


def wait_for_rejoin(run: FTRun, replica: int | None = None, timeout: float = 300.0) -> list[Rejoined]:
    """Block until replica groups rejoin; returns their ``Rejoined`` events in arrival order.

    Recoveries under way when called (fault injected or failure detected, no rejoin yet) are
    waited for, every one of them, or only that of ``replica``. With none under way: the next
    rejoin recorded after the call, of any group or of ``replica``.

    Raises ``ValueError`` for a ``replica`` that is not an active group, ``TimeoutError``
    naming the groups not back after ``timeout`` seconds and how far their recovery got,
    ``RuntimeError`` when a group waited for was given up on or the run stopped.
    """
    active = {g.index for g in run.groups.active()}
    if replica is not None and replica not in active:
        raise ValueError(f"replica: {replica} is not an active replica group; active groups: "
                         f"{', '.join(map(str, sorted(active))) or 'none'}")
    now = time.time()
    tracker = RecoveryTracker()
    tracker.apply_all(run.events.events())
    under_way = {r.replica: r for r in tracker.recoveries
                 if not r.finished and r.replica in active and replica in (None, r.replica)}
    want: set[int] | None  # None: any group
    if under_way:
        want = set(under_way)
        since = min((r.start_t for r in under_way.values() if r.start_t is not None), default=now)
    else:
        want = None if replica is None else {replica}
        since = now
    got: dict[int, Rejoined] = {}
    ended: list[Event] = []

    def settled(e: Event) -> bool:
        if isinstance(e, Rejoined) and (want is None or e.replica in want) and e.replica not in got:
            got[e.replica] = e
        elif isinstance(e, GaveUp) and (want is None or e.replica in want):
            ended.append(e)
        elif isinstance(e, RunStopped):
            ended.append(e)
        return bool(ended) or (bool(got) if want is None else want <= set(got))

    what = _rejoin_target(want, under_way)
    try:
        run.wait_for(settled, timeout, since=since)
    except TimeoutError:
        if want is None:
            raise TimeoutError(f"no replica group rejoined within {timeout:g} s (none was recovering when the "
                               "wait began); inject a fault first, or give a longer timeout") from None
        raise TimeoutError(f"{what} did not rejoin within {timeout:g} s{_progress(run, want, got)}; "
                           "see the run's status, or give a longer timeout") from None
    if ended:
        e = ended[0]
        if isinstance(e, GaveUp):
            raise RuntimeError(f"replica {e.replica} will not rejoin: the respawn policy gave up on it after "
                               f"{e.attempts} attempts (raise respawn.max_respawns to allow more)")
        raise RuntimeError(f"the run stopped ({getattr(e, 'reason', 'stopped')}) before {what} rejoined")
    return sorted(got.values(), key=lambda e: e.t)


def _rejoin_target(want: set[int] | None, under_way: dict[int, Any]) -> str:
    if want is None:
        return "any replica group"
    names = ", ".join(map(str, sorted(want)))
    label = f"replica {names}" if len(want) == 1 else f"replicas {names}"
    return f"{label} (recovering)" if under_way else label


def _progress(run: FTRun, want: set[int] | None, got: dict[int, Rejoined]) -> str:
    """How far the recoveries of the groups still missing got, from the recovery model."""
    tracker = RecoveryTracker()
    tracker.apply_all(run.events.events())
    parts = []
    for r in sorted(want or ()):
        if r in got:
            parts.append(f"replica {r} rejoined at step {got[r].step}")
            continue
        rec = tracker.open_for(r)
        parts.append(f"replica {r} {rec.status}" if rec is not None else f"replica {r} has not failed")
    return f" ({'; '.join(parts)})" if parts else ""


def wait_for_spares(run: FTRun, timeout: float = 300.0) -> list[str]:
    """Block until every warm spare of ``run`` is ready; returns their names. ``ValueError`` for
    a run without spares, ``TimeoutError`` (naming the last events) when they are not ready in
    ``timeout`` seconds."""
    want = run.config.spares
    if not want:
        raise ValueError("this run has no warm spares; start it with `--spares K` (RunConfig(spares=K))")

    def ready() -> list[str]:
        return sorted(k for k, v in run.status().items()
                      if isinstance(k, str) and k.startswith("spare") and v.get("state") == "ready")

    t0 = time.time()
    if len(ready()) < want:  # a spare that became ready already has its event: wait_for sees past ones too
        run.events.wait_for(lambda e: (isinstance(e, SpareState) and len(ready()) >= want)
                            or (isinstance(e, RunStopped) and e.t >= t0), timeout, what=f"{want} warm spare(s) ready")
    if run.stopped:
        raise ValueError(f"run {run.run_id} stopped before its spares were ready")
    return ready()


def describe_rejoin(e: Rejoined) -> str:
    """One line: which group rejoined at which step, and how long after the fault."""
    took = f", {e.seconds_since_failure:.1f} s after the fault" if e.seconds_since_failure is not None else ""
    return f"replica {e.replica} rejoined at step {e.step}{took}"


# ---- identical replicas ---------------------------------------------------------------------


def differing_ranks(event: ReplicasIdentical) -> list[str]:
    """The ``replica{r}/rank{k}`` entries whose digest differs from the one most replicas hold
    for rank k (every entry of rank k when there is no single most common digest)."""
    by_rank: dict[str, dict[str, str]] = {}
    for key, digest in event.hashes.items():
        _, _, rank = key.partition("/")
        by_rank.setdefault(rank, {})[key] = digest
    out = []
    for entries in by_rank.values():
        counts = Counter(entries.values()).most_common()
        if len(counts) < 2:
            continue
        if counts[0][1] == counts[1][1]:  # no majority: all of them are suspects
            out.extend(entries)
        else:
            out.extend(k for k, d in entries.items() if d != counts[0][0])
    return sorted(out)


def _what_differs(event: ReplicasIdentical, key: str) -> str:
    """"parameters", "optimizer state" or both, comparing with a peer of the same rank."""
    mine = _parts(event.hashes[key])
    rank = key.partition("/")[2]
    peers = [_parts(d) for k, d in event.hashes.items() if k != key and k.partition("/")[2] == rank]
    counts = Counter(tuple(sorted(p.items())) for p in peers).most_common(1)
    if not mine or not counts:
        return ""
    ref = dict(counts[0][0])
    names = {"params": "parameters", "optim": "optimizer state"}
    diff = [names.get(k, k) for k in mine if mine.get(k) != ref.get(k)]
    return " and ".join(diff)


def _parts(digest: str) -> dict[str, str]:
    """``"params:ab optim:cd"`` -> ``{"params": "ab", "optim": "cd"}`` ({} if not that shape)."""
    out = {}
    for item in digest.split():
        name, sep, value = item.partition(":")
        if not sep:
            return {}
        out[name] = value
    return out


def require_identical(run: FTRun, timeout: float = 60.0) -> ReplicasIdentical:
    """Run one identity check (``run.check_identical``) and insist on its verdict.

    Returns the ``ReplicasIdentical`` event when every rank k of every training group holds the
    same digests. Raises :class:`ReplicasDiffer` naming the ranks that differ (and whether their
    parameters or optimizer state do), ``RuntimeError`` when fewer than two groups are training
    (nothing to compare), ``TimeoutError`` when no verdict came within ``timeout`` seconds.
    """
    try:
        event = run.check_identical(timeout=timeout)
    except TimeoutError:
        raise TimeoutError(f"no identity verdict within {timeout:g} s: every training group must commit the "
                           "checked step and report its digests; see the run's status, "
                           "or give a longer timeout") from None
    if event is None and run.config.sync != "step" and run.config.fragments > 1:
        raise RuntimeError(f"streaming DiLoCo (fragments={run.config.fragments}) meets one fragment at a time, so "
                           "its groups never hold all the same parameters at once: there is no step to compare at")
    if event is None:
        raise RuntimeError("fewer than two replica groups are training: there is nothing to compare; "
                           "check again when at least two are")
    if event.identical:
        return event
    ranks = differing_ranks(event)
    detail = []
    for key in ranks:
        what = _what_differs(event, key)
        detail.append(f"{key} ({what})" if what else key)
    n = len(event.hashes)
    raise ReplicasDiffer(event, ranks, f"replicas are NOT bit-identical at step {event.step}: "
                                       f"{', '.join(detail)} differ{'s' if len(ranks) == 1 else ''} from the other "
                                       f"replicas of the same rank ({n} ranks compared)")
