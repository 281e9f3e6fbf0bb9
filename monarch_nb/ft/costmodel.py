"""What one failure costs, with peer recovery and with checkpoint-restart, as a fitted model.

A failure's cost is counted in **group-seconds of training lost** (a group idle, or redoing
work, for one second costs one). With R replica groups, each holding S bytes of state:

* peer recovery: the victim is out for ``back(S)`` (detect, teardown, acquire, build, heal,
  rejoin; heal and build grow with S), and the other R-1 groups stall ``stall`` each:
  ``peer(R, S) = back(S) + (R - 1) * stall``.
* checkpoint-restart: every group stops, restarts and loads the checkpoint (``restart(S)``,
  growing with S through process start, model build and the read), and redoes the work since
  the last checkpoint (half an interval on average): ``restart(R, S) = R * (restart(S) +
  K / 2 * step)``.

``fit`` takes measured failures (bench/bench_scale_model.py) and returns the coefficients
(each a straight line in S by least squares); ``predict`` applies them, and ``Cluster`` states
every assumption of an extrapolation to a real cluster. Pure Python: the notebook and the
benchmark use the same numbers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable


def _line(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x; a flat line through the mean with one x."""
    pts = list(points)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if len(set(xs)) < 2:
        return statistics.mean(ys), 0.0
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


@dataclass(frozen=True)
class Fit:
    back_s: tuple[float, float]  # victim out: seconds = a + b * GB of state
    stall_s: tuple[float, float]  # each survivor's stall: seconds = a + b * GB
    restart_s: tuple[float, float]  # one group's restart incl. checkpoint read: a + b * GB
    heal_GBps: float  # measured peer-to-peer transfer rate
    points: int

    def peer(self, replicas: int, state_gb: float) -> float:
        return _at(self.back_s, state_gb) + (replicas - 1) * _at(self.stall_s, state_gb)

    def restart(self, replicas: int, state_gb: float, interval_steps: float, step_s: float) -> float:
        return replicas * (_at(self.restart_s, state_gb) + interval_steps / 2 * step_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _at(line: tuple[float, float], x: float) -> float:
    return max(0.0, line[0] + line[1] * x)


def fit(failures: list[dict[str, Any]]) -> Fit:
    """``failures``: one dict per measured failure with ``mode`` ("peer"/"restart"),
    ``state_gb``, ``back_s`` (peer), ``stall_s`` (peer), ``restart_s`` (restart, per group),
    ``heal_GBps`` (peer, when a heal moved state)."""
    peer = [f for f in failures if f["mode"] == "peer"]
    restart = [f for f in failures if f["mode"] == "restart"]
    heal = [f["heal_GBps"] for f in peer if f.get("heal_GBps")]
    return Fit(back_s=_line((f["state_gb"], f["back_s"]) for f in peer),
               stall_s=_line((f["state_gb"], f["stall_s"]) for f in peer if f.get("stall_s") is not None),
               restart_s=_line((f["state_gb"], f["restart_s"]) for f in restart),
               heal_GBps=statistics.median(heal) if heal else float("nan"), points=len(failures))


@dataclass(frozen=True)
class Cluster:
    """A cluster to extrapolate to; every number is an assumption, stated.

    Args:
        name: for tables.
        groups: replica groups (one per node of GPUs, as the seed's runs used).
        params_b: model parameters, in billions.
        bytes_per_param: state bytes per parameter (bf16 weights + fp32 master + Adam's two fp32
            moments = 2 + 4 + 4 + 4 = 14).
        step_s: one training step.
        fault_every_s: mean time between failures of the whole cluster.
        heal_GBps: peer-to-peer state transfer per group (network between two nodes).
        restart_s: one group's process restart and model build at that scale (Monarch's blog:
            ~90 s to recover from a process failure on 240 H100).
        checkpoint_write_GBps, checkpoint_read_GBps: a group's share of the parallel file system.
        save_stall_s: the step stall of an asynchronous save (staging a copy to host memory).
        detect_s, stall_s: failure detection, and a survivor's stall per failure.
    """

    name: str
    groups: int
    params_b: float
    bytes_per_param: float = 14.0
    step_s: float = 2.0
    fault_every_s: float = 180.0
    heal_GBps: float = 25.0
    restart_s: float = 90.0
    checkpoint_write_GBps: float = 10.0
    checkpoint_read_GBps: float = 10.0
    save_stall_s: float = 2.0
    detect_s: float = 1.0
    stall_s: float = 4.0

    @property
    def state_gb(self) -> float:
        return self.params_b * self.bytes_per_param

    def young_daly_interval_s(self) -> float:
        return math.sqrt(2 * self.save_stall_s * self.fault_every_s)

    def peer_cost(self, spare: bool = False) -> float:
        """Group-seconds lost per failure with peer recovery (a warm spare skips the restart)."""
        back = self.detect_s + (0.0 if spare else self.restart_s) + self.state_gb / self.heal_GBps + self.step_s
        return back + (self.groups - 1) * self.stall_s

    def restart_cost(self) -> float:
        """Group-seconds lost per failure when every group restarts from the last checkpoint."""
        per_group = (self.detect_s + self.restart_s + self.state_gb / self.checkpoint_read_GBps
                     + self.young_daly_interval_s() / 2)
        return self.groups * per_group

    def goodput(self, cost: float) -> float:
        """Fraction of group-time left for training at this failure rate (plus, for restart,
        the save stalls every interval - counted by the caller)."""
        return max(0.0, 1.0 - cost / (self.groups * self.fault_every_s))


SEED_CLUSTERS = (
    Cluster("16 nodes x 8 MI300, Llama 3 8B, fault / 180 s", groups=16, params_b=8.0),
    Cluster("32 nodes x 8 MI355, Llama 3 8B, fault / 180 s", groups=32, params_b=8.0, heal_GBps=50.0,
            step_s=1.5),
)
