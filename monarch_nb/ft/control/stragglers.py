"""Stragglers: a group whose own work per step is slower than its peers', named by a rule.

A synchronous step takes every group as long as the slowest one (the others wait in the gradient
average), so step times cannot tell who is slow. What each group reports apart from its waits is
its own work: ``tokens_per_s`` of a committed step is its tokens over the time it spent in forward
and backward (the quorum, the average and the commit left out). The rule, as Falcon and ByteRobust
use it: over the last ``straggler_window`` committed steps of each group, a group is slow when its
median throughput is at most its peers' (the median of the other groups' medians) divided by
``straggler_factor``, at each of its last ``window // 2`` steps (a join or a spare being built
shifts every group's speed for a few steps: on this 2-core machine a fresh group next to two
others read 1.31x once, without the persistence); it is cleared when it is back within 0.9. Controller side: fed each
event on the emitting thread (cheap); a policy's action runs in a thread of its own.
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
from typing import Any, Callable

from ...telemetry.events import Event, ReplicaState, Step, StragglerCleared, StragglerDetected

log = logging.getLogger(__name__)
CLEAR_MARGIN = 0.9  # a named group is cleared once its slowness falls under factor x this


class StragglerWatch:
    """Names slow groups (``straggler_detected`` / ``straggler_cleared``) and hands each new one to
    ``act(replica, ratio)`` (the run's policy: nothing, drain it, or drop it)."""

    def __init__(self, factor: float, window: int, policy: str, emit: Callable[[Event], None],
                 act: Callable[[int, float], None]) -> None:
        self.factor, self.window, self.policy = factor, window, policy
        self._emit, self._act = emit, act
        self._rates: dict[int, collections.deque[float]] = {}
        self._medians: dict[int, float] = {}  # of each group with a full window, kept as its window moves
        self._slow: dict[int, float] = {}  # named group -> how many times slower than its peers
        self._over: dict[int, int] = {}  # steps in a row a group was over the rule, not named yet
        self._lock = threading.Lock()

    def observe(self, e: Event) -> None:
        if isinstance(e, ReplicaState) and e.state not in ("training", "healing"):
            self._forget(e.replica)  # a group that failed, retired or stopped: its old steps say nothing now
            return
        if not isinstance(e, Step) or not e.committed or e.tokens_per_s <= 0:
            return
        with self._lock:
            rates = self._rates.setdefault(e.replica, collections.deque(maxlen=self.window))
            rates.append(e.tokens_per_s)
            if len(rates) == self.window:  # only this group's median moved: the others' are kept
                self._medians[e.replica] = statistics.median(rates)
            verdict = self._judge(e.replica)
        if verdict is not None:
            self._emit(verdict)
            if isinstance(verdict, StragglerDetected) and self.policy != "observe":
                threading.Thread(target=self._act, args=(e.replica, verdict.ratio), name="ft-straggler",
                                 daemon=True).start()

    def slow(self) -> dict[int, float]:
        """The groups named slow now, and by how much."""
        with self._lock:
            return dict(self._slow)

    def _judge(self, replica: int) -> Event | None:
        full = self._medians
        if replica not in full or len(full) < 2:
            return None
        peers = statistics.median(v for r, v in full.items() if r != replica)
        ratio = peers / full[replica]  # how many times longer its own work takes
        over = self._over[replica] = self._over.get(replica, 0) + 1 if ratio >= self.factor else 0
        if replica not in self._slow and over >= max(1, self.window // 2):
            self._slow[replica] = ratio
            return StragglerDetected(replica=replica, ratio=ratio, tokens_per_s=full[replica],
                                     peers_tokens_per_s=peers, window=self.window, policy=self.policy)
        if replica in self._slow and ratio < self.factor * CLEAR_MARGIN:
            del self._slow[replica]
            return StragglerCleared(replica=replica, ratio=ratio)
        if replica in self._slow:
            self._slow[replica] = ratio
        return None

    def _forget(self, replica: int) -> None:
        with self._lock:
            self._rates.pop(replica, None)
            self._medians.pop(replica, None)
            self._slow.pop(replica, None)
            self._over.pop(replica, None)


def watch_stragglers(run: Any) -> StragglerWatch:
    """The run's watch, fed by its events; its policy (``RunConfig.straggler``) drains a slow group
    (moved while it trains) or drops it (let go at once, then replaced)."""
    cfg = run.config

    def act(replica: int, ratio: float) -> None:
        reason = f"straggler: its own work takes {ratio:.1f}x its peers'"
        try:
            run.drain(replica, reason=reason, leave_first=cfg.straggler == "drop")
        except Exception as exc:  # refused (a drain in progress, no room) or the run stopped: it stays named
            log.warning("%s policy for slow group %d: %s", cfg.straggler, replica, exc)

    watch = StragglerWatch(cfg.straggler_factor, cfg.straggler_window, cfg.straggler, run.events.append, act)
    run.events.subscribe(watch.observe)
    return watch
