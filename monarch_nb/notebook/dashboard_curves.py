"""The dashboard model's fold of the loss curves: per group, the committed global line, markers.

A run of days must not grow the kernel: each line is a ``Curve`` thinned uniformly to a bounded
number of points (every point is still in the event log), the global line is the mean of the
groups that committed a step, and ``plot_data`` hands the plot a sampled copy, O(limit) per group
whatever the run's length, with a NaN break where a group was down. Markers (an injected fault,
an unplanned failure, a heal) are placed by ``DashboardModel``, which routes events here.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import TypeVar

from ..telemetry.events import Step, Validated

# Points kept per group's committed curve and for the global curve, before thinning. The image
# draws at most PLOT_POINTS of each (it is 600 pixels wide), so more would only be memory: 2,000
# took a 5-step/s run 13 minutes to fill (~1.6 MB more at 3 groups), a slope in every soak.
PLOT_POINTS = 600
POINTS_KEPT = PLOT_POINTS
LOSS_KEPT = PLOT_POINTS  # every reported (step, loss, committed) per group, newest
MARKERS_KEPT = 600
GLOBAL_SETTLE_STEPS = 200  # a step this far behind the newest has every commit it will get
DROPPED_KEPT = 200  # per group, the newest steps that did not commit
HELD_OUT_KEPT = PLOT_POINTS  # validations kept (a validator reports every few steps)

_T = TypeVar("_T")


@dataclass(frozen=True)
class Marker:
    """A point of interest on the loss plot: an injected fault, an unplanned failure, a heal, a
    meeting of the groups (LocalSGD / DiLoCo)."""

    kind: str  # "fault" | "failure" | "heal" | "meeting"
    replica: int
    step: int | None
    t: float
    label: str


@dataclass(frozen=True)
class PlotData:
    """What the loss plot needs, taken under the lock so drawing happens outside it.

    Lines are sampled to at most a few hundred points each (more than the image has pixels
    is wasted work); a ``(nan, nan)`` point breaks a group's line where it was down.
    """

    committed: dict[int, list[tuple[float, float]]]  # per group, committed steps
    dropped: dict[int, list[tuple[int, float]]]  # per group, recent steps that did not commit
    global_loss: list[tuple[int, float]]
    markers: list[Marker]
    point_count: int
    global_step: int | None
    held_out: tuple[tuple[int, float], ...] = ()  # a validator's (step, the groups' mean held-out loss)


class Curve:
    """One loss line, thinned uniformly to at most about ``2 * cap`` points however long the run:
    when full every other point goes, and from then on one point in ``stride`` is kept. The
    points on both sides of a gap (steps missing) stay, so the line breaks where the data does,
    for the newest ``cap / 4`` gaps (older ones are drawn joined); the newest point is always shown."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = POINTS_KEPT if cap is None else cap
        self.points: list[tuple[int, float]] = []
        self.gaps: list[int] = []  # indexes into points where steps are missing before that point
        self.stride = 1
        self._seen = 0
        self._last: tuple[int, float] | None = None

    def add(self, step: int, loss: float, *, gap: bool = False) -> None:
        """Append a point; ``gap`` marks steps missing before it."""
        if gap and self._last is not None and (not self.points or self.points[-1] is not self._last):
            self.points.append(self._last)  # the point just before the gap
        if gap and self.points:
            self.gaps.append(len(self.points))
        self._seen += 1
        self._last = (step, loss)
        if gap or self._seen % self.stride == 0:
            self.points.append(self._last)
        if len(self.points) > 2 * self.cap:
            self._halve()

    @property
    def last(self) -> tuple[int, float] | None:
        return self._last

    def view(self) -> list[tuple[int, float]]:
        """The kept points and the newest one."""
        if self._last is None or (self.points and self.points[-1] is self._last):
            return self.points
        return [*self.points, self._last]

    def _halve(self) -> None:
        if len(self.gaps) > self.cap // 4:  # the oldest breaks go too: old history is one line
            self.gaps = self.gaps[len(self.gaps) // 2:]
        n = len(self.points)
        keep = sorted(set(range(0, n, 2)) | {n - 1} | {i for g in self.gaps for i in (g - 1, g) if 0 <= i < n})
        where = {old: new for new, old in enumerate(keep)}
        self.points = [self.points[i] for i in keep]
        self.gaps = [where[g] for g in self.gaps]
        self.stride *= 2


class LossCurves:
    """Every group's reported losses, its committed curve, the global curve and the markers.
    Not thread-safe: the model's callers lock. Memory is bounded by the windows below.

    Args:
        points_kept: points of each thinned curve before it halves (see ``Curve``).
        loss_kept: newest ``(step, loss, committed)`` kept per group, for ``series``.
        markers_kept: newest markers kept.
        settle_steps: how far behind the newest a global step must be to move into the thinned
            history (it has every commit it will get).
    """

    def __init__(self, *, points_kept: int = POINTS_KEPT, loss_kept: int = LOSS_KEPT,
                 markers_kept: int = MARKERS_KEPT, settle_steps: int = GLOBAL_SETTLE_STEPS) -> None:
        self.points_kept = points_kept
        self.loss_kept = loss_kept
        self.settle_steps = settle_steps
        # loss[replica] = the last loss_kept (step, loss, committed) the group reported
        self.loss: dict[int, deque[tuple[int, float, bool]]] = {}
        # committed[replica] = the group's committed (step, loss), thinned (see Curve)
        self.committed: dict[int, Curve] = {}
        self.dropped: dict[int, deque[tuple[int, float]]] = {}
        self.markers: deque[Marker] = deque(maxlen=markers_kept)
        self._global_sum: dict[int, list[float]] = {}  # step -> [sum, count] over committed
        self._global_steps: list[int] = []  # the keys of _global_sum, in order
        self._global_settled = Curve(points_kept)  # older steps' means, thinned
        self._points = 0  # loss points of every group (see point_count)
        self._held_out: dict[int, list[float]] = {}  # step -> [sum, count] of the groups' held-out losses

    def add(self, e: Step) -> None:
        """One reported step of one group: on its line, and on the global one once committed."""
        if not e.committed and not e.left:  # a drained group's last step (averaged, then it left) is not dropped
            self.dropped.setdefault(e.replica, deque(maxlen=DROPPED_KEPT)).append((e.step, e.loss))
        self.loss.setdefault(e.replica, deque(maxlen=self.loss_kept)).append((e.step, e.loss, e.committed))
        self._points += 1
        if not e.committed:
            return
        curve = self.committed.get(e.replica)
        if curve is None:
            curve = self.committed[e.replica] = Curve(self.points_kept)
        curve.add(e.step, e.loss, gap=curve.last is not None and e.step > curve.last[0] + 1)
        acc = self._global_sum.get(e.step)
        settled = self._global_settled.last
        if acc is None and settled is not None and e.step <= settled[0]:
            acc = [0.0, 0]  # a commit of a step already settled into the history: not drawn
        elif acc is None:
            acc = self._global_sum[e.step] = [0.0, 0]
            if self._global_steps and e.step < self._global_steps[-1]:
                bisect.insort(self._global_steps, e.step)
            else:
                self._global_steps.append(e.step)
            if len(self._global_steps) > 2 * self.points_kept:
                self._settle_global()
        acc[0] += e.loss
        acc[1] += 1

    def validated(self, e: Validated) -> None:
        """A group's held-out loss: the plot's held-out line is the groups' mean at each step."""
        acc = self._held_out.setdefault(e.step, [0.0, 0])
        acc[0] += e.loss
        acc[1] += 1
        while len(self._held_out) > HELD_OUT_KEPT:
            del self._held_out[min(self._held_out)]

    def held_out(self) -> list[tuple[int, float]]:
        return [(s, total / n) for s, (total, n) in sorted(self._held_out.items())]

    def mark(self, marker: Marker) -> None:
        self.markers.append(marker)

    def series(self) -> dict[int, list[tuple[int, float, bool]]]:
        return {r: list(pts) for r, pts in sorted(self.loss.items())}

    def global_loss(self, limit: int | None = None) -> list[tuple[int, float]]:
        """Committed global loss: per step, the mean loss of the groups that committed it (older
        steps thinned, see ``_settle_global``)."""
        points = self._global_settled.view() + [(s, self._global_sum[s][0] / self._global_sum[s][1])
                                                for s in self._global_steps]
        return _sample(points, limit) if limit else points

    def _settle_global(self) -> None:
        """Move the older half of the live global steps into the thinned history. Only steps
        ``settle_steps`` behind the newest move: they have every commit they will get."""
        newest = self._global_steps[-1]
        half = [s for s in self._global_steps[:self.points_kept] if s < newest - self.settle_steps]
        for s in half:
            total, count = self._global_sum.pop(s)
            self._global_settled.add(s, total / count)
        self._global_steps = self._global_steps[len(half):]

    def point_count(self) -> int:
        return self._points

    def plot_data(self, global_step: int | None, limit: int = PLOT_POINTS) -> PlotData:
        """A sampled copy for the plot: O(limit) per group whatever the run's length."""
        committed = {r: _sample_with_gaps(c.view(), c.gaps, limit) if (c := self.committed.get(r)) else []
                     for r in sorted(self.loss)}
        dropped = {r: list(self.dropped.get(r, ())) for r in sorted(self.loss)}
        return PlotData(committed, dropped, self.global_loss(limit), list(self.markers), self.point_count(),
                        global_step, tuple(_sample(self.held_out(), limit)))


def _sample(items: list[_T], limit: int | None) -> list[_T]:
    """At most about ``limit`` evenly spaced items, always keeping the last."""
    n = len(items)
    if limit is None or n <= limit:
        return list(items)
    stride = -(-n // limit)
    out = items[::stride]
    if (n - 1) % stride:
        out.append(items[-1])
    return out


def _sample_with_gaps(points: list[tuple[int, float]], gaps: list[int], limit: int) -> list[tuple[float, float]]:
    """Sample ``points`` and put a (nan, nan) break before each index in ``gaps``, keeping the
    points on both sides of every gap so the line ends and restarts where the data does."""
    n = len(points)
    if n == 0:
        return []
    stride = max(1, -(-n // limit))
    if stride == 1 and not gaps:
        return list(points)
    keep = set(range(0, n, stride)) | {n - 1}
    for g in gaps:
        keep.update((g - 1, g))
    gap_set = set(gaps)
    nan = float("nan")
    out: list[tuple[float, float]] = []
    for i in sorted(keep):
        if i in gap_set and out:
            out.append((nan, nan))
        out.append(points[i])
    return out
