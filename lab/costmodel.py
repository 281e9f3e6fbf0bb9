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
(each a straight line by least squares); ``Fit.peer``/``Fit.restart`` apply them where they were
measured. ``extrapolate`` takes a ``Fit`` to a ``Cluster`` this machine cannot be: it keeps what
was measured here and does not depend on this CPU (the fixed parts of a failure, the steps a
survivor loses) and names every other number as an assumption. bench/seed_clusters.py and
bench/bench_scale_model.py both call it. Pure Python: the notebook and the benchmarks use the
same numbers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable


def _line(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x; a flat line through the mean with one x."""
    pts = list(points)
    if not pts:
        return float("nan"), float("nan")
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
    stall_vs_step: tuple[float, float]  # each survivor's stall: seconds = a + b * step time (s)
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
    ``state_gb``, ``step_s`` (the run's median step), ``back_s`` (peer), ``stall_s`` (peer),
    ``restart_s`` (restart, per group), ``heal_GBps`` (peer, when a heal moved state)."""
    peer = [f for f in failures if f["mode"] == "peer"]
    restart = [f for f in failures if f["mode"] == "restart"]
    stalled = [f for f in peer if f.get("stall_s") is not None]
    heal = [f["heal_GBps"] for f in peer if f.get("heal_GBps")]
    return Fit(back_s=_line((f["state_gb"], f["back_s"]) for f in peer),
               stall_s=_line((f["state_gb"], f["stall_s"]) for f in stalled),
               stall_vs_step=_line((f["step_s"], f["stall_s"]) for f in stalled if f.get("step_s")),
               restart_s=_line((f["state_gb"], f["restart_s"]) for f in restart),
               heal_GBps=statistics.median(heal) if heal else float("nan"), points=len(failures))


@dataclass(frozen=True)
class Cluster:
    """A cluster to extrapolate to: the numbers this machine cannot measure, each an assumption
    (``ASSUMED`` says why each value; ``extrapolate`` adds what it takes from a ``Fit``).

    Args:
        name: for tables.
        groups: replica groups (one per node of GPUs, as the seed's runs used).
        params_b: model parameters, in billions.
        bytes_per_param: state bytes per parameter.
        step_s: one training step.
        fault_every_s: mean time between failures of the whole cluster.
        heal_GBps: peer-to-peer state transfer per group (network between two nodes).
        restart_s: what a group's process restart and model build cost at that scale on top of
            the fixed part measured here.
        checkpoint_read_GBps: a group's share of the parallel file system.
        save_stall_s: the step stall of an asynchronous save (staging a copy to host memory).
    """

    name: str
    groups: int
    params_b: float
    bytes_per_param: float = 14.0
    step_s: float = 2.0
    fault_every_s: float = 180.0
    heal_GBps: float = 25.0
    restart_s: float = 90.0
    checkpoint_read_GBps: float = 10.0
    save_stall_s: float = 2.0

    @property
    def state_gb(self) -> float:
        return self.params_b * self.bytes_per_param

    def young_daly_interval_s(self) -> float:
        return math.sqrt(2 * self.save_stall_s * self.fault_every_s)


ASSUMED = {
    "groups": "one replica group per node of 8 GPUs, as the seed's runs used",
    "params_b": "Llama 3 8B",
    "bytes_per_param": "bf16 weights + fp32 master + Adam's two fp32 moments = 2 + 4 + 4 + 4",
    "step_s": "one training step at 8B on that cluster; a step here is a CPU step of a small model",
    "fault_every_s": "the seed's rate: one fault of the whole cluster every 180 s",
    "heal_GBps": "peer-to-peer transfer between two nodes; the heal measured here is loopback on a "
                 "shared CPU (fit heal_GBps), not a network",
    "restart_s": "a group's process restart and model build at 8B on GPUs (Monarch's reported ~90 s "
                 "to recover from a process failure on 240 H100); a restart here builds a small model "
                 "on a CPU",
    "checkpoint_read_GBps": "a group's share of the parallel file system",
    "save_stall_s": "the step stall of one asynchronous save (staging a copy to host memory)",
}

MODEL = {
    "fixed_parts_carry_over": "the intercepts of the victim's time out and of one group's restart (the "
                              "parts that do not grow with state: detect, teardown, acquire, process "
                              "start, quorum, rejoin) cost at the cluster what they cost here",
    "restart_on_top": "both ways add the assumed restart_s to the measured fixed part, which already holds "
                      "a process start here: counted twice, the same in both ways",
    "state_moves_at_cluster_rates": "state enters only through heal_GBps (peer) and checkpoint_read_GBps "
                                    "(restart); the fit's per-GB slopes measure this CPU's model build, "
                                    "loopback heal and step and are not used",
    "victim_first_step": "a victim rejoins after one step at step_s",
    "spare_skips_restart": "a warm spare saves restart_s only; the measured fixed part is kept",
    "survivor_stall_in_steps": "a survivor's stall is the fit of stall against step time here (quorum "
                               "change plus the steps it loses), evaluated at the cluster's step_s",
    "restart_redoes_half_interval": "checkpoint-restart redoes half a Young/Daly interval "
                                    "sqrt(2 x save_stall_s x fault_every_s) on average",
    "peer_takes_no_save_stall": "peer recovery recovers from a live peer: no periodic save is counted",
    "faults_do_not_overlap": "each failure's cost is paid before the next: the fraction of group-time lost "
                             "is cost / (groups x fault_every_s), and restart's save stalls add "
                             "save_stall_s / interval",
}


def scale_medians(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per group count R, the medians of bench_scale.py's ``kind == "kill"`` records (spare or
    not: a survivor's stall does not depend on how the victim came back)."""
    by_r: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "kill":
            by_r.setdefault(int(r["groups"]), []).append(r)
    out = {}
    for groups, rows in sorted(by_r.items()):
        med = {"kills": float(len(rows))}
        for key in ("detect_s", "stall_steps", "stall_s", "back_s", "heal_s"):
            vals = [row[key] for row in rows if row.get(key) is not None]
            if vals:
                med[key] = statistics.median(vals)
        out[groups] = med
    return out


def stall_steps_from_scale(records: list[dict[str, Any]], groups: int) -> tuple[float, str] | None:
    """A survivor's stall in steps at ``groups``, measured against R by bench_scale.py, and where it
    comes from; None when the records hold fewer than two group counts: without a trend in R the
    fit (which has none either, but more points) is as good."""
    med = {r: m["stall_steps"] for r, m in scale_medians(records).items() if "stall_steps" in m}
    if len(med) < 2:
        return None
    if groups in med:
        return med[groups], f"measured here (--scale): median survivor stall in steps of the kills at R={groups}"
    a, b = _line(med.items())
    return max(0.0, a + b * groups), (f"measured here (--scale): median survivor stall in steps at "
                                      f"R={sorted(med)}, a straight line in R taken to R={groups}")


def extrapolate(fit: Fit, cluster: Cluster, scale: list[dict[str, Any]] | None = None,
                parts: Parts | None = None) -> dict[str, Any]:
    """One failure's cost both ways, and the goodput, at ``cluster``: measured parts from ``fit``
    (and, for the survivors' stall, from ``scale`` records when they hold a trend in R), the
    rest ``cluster``'s assumptions. With ``parts`` (bench_cost_parts.py), the fixed parts are
    one group's recovery and restart measured alone instead of the fit's intercepts (which R
    groups rebuilding on two cores inflate), a restart adds the rendezvous of R groups, and
    peer recovery pays the per-step quorum at R (OVERLAP). Every input is returned by name with
    its value and source."""
    c = cluster
    assumptions: dict[str, dict[str, Any]] = {
        f.name: {"value": getattr(c, f.name), "source": "assumed: " + ASSUMED[f.name]}
        for f in fields(c) if f.name in ASSUMED}
    rendezvous = quorum = 0.0
    if parts is None:
        assumptions["back_fixed_s"] = {"value": fit.back_s[0], "source": (
            "measured here (fit): intercept of the victim's time out against state (back_s)")}
        assumptions["restart_fixed_s"] = {"value": fit.restart_s[0], "source": (
            "measured here (fit): intercept of one group's restart against state (restart_s)")}
    else:
        assumptions["back_fixed_s"] = {"value": parts.peer_alone[0], "source": (
            f"measured here alone (bench_cost_parts.py, {parts.model}): a kill to the victim's first "
            "step, one group rebuilding (detect, teardown, spawn, build, heal, quorum)")}
        assumptions["restart_fixed_s"] = {"value": parts.restart_alone[0], "source": (
            f"measured here alone (bench_cost_parts.py, {parts.model}): a kill to the first step after "
            "a restart from disk of one group, the only thing rebuilding")}
        rendezvous, quorum = parts.rendezvous(c.groups), parts.at("quorum_steady", c.groups)
        assumptions["rendezvous_s"] = {"value": rendezvous, "source": (
            f"measured here (bench_cost_parts.py): TCPStore and gloo process group of R processes, "
            f"beyond R=1, at R={c.groups} (a line in R beyond the largest R measured)")}
        assumptions["quorum_per_step_s"] = {"value": quorum, "source": (
            f"measured here (bench_cost_parts.py): a torchft Lighthouse quorum of R groups, every step, "
            f"at R={c.groups}")}
    stall_a, stall_b = fit.stall_vs_step
    from_scale = stall_steps_from_scale(scale, c.groups) if scale else None
    model = dict(MODEL)
    if from_scale is None:
        assumptions["stall_fixed_s"] = {"value": stall_a, "source": (
            "measured here (fit): intercept of a survivor's stall against step time (stall_vs_step)")}
        assumptions["stall_steps_per_step"] = {"value": stall_b, "source": (
            "measured here (fit): slope of a survivor's stall against step time (stall_vs_step)")}
        stall = _at(fit.stall_vs_step, c.step_s)
    else:
        assumptions["stall_steps"] = {"value": from_scale[0], "source": from_scale[1] + (
            "; used instead of the fit's stall_vs_step, which was measured at R<=6 only")}
        stall = from_scale[0] * c.step_s
        model = dict(MODEL, survivor_stall_in_steps=(
            "a survivor loses the steps bench_scale.py measured at this R, each at the cluster's step_s"))
    state = c.state_gb
    interval = c.young_daly_interval_s()
    restart_fixed = assumptions["restart_fixed_s"]["value"]
    back_spare = assumptions["back_fixed_s"]["value"] + state / c.heal_GBps + c.step_s
    back = back_spare + c.restart_s
    per_group_restart = restart_fixed + rendezvous + c.restart_s + state / c.checkpoint_read_GBps + interval / 2
    peer = back + (c.groups - 1) * stall
    peer_spare = back_spare + (c.groups - 1) * stall
    restart = c.groups * per_group_restart
    exposure = c.groups * c.fault_every_s
    per_step = quorum / c.step_s  # torchft's quorum every step; a plain restart job has none
    goodput_peer = max(0.0, 1.0 - peer / exposure - per_step)
    goodput_spare = max(0.0, 1.0 - peer_spare / exposure - per_step)
    goodput_restart = max(0.0, 1.0 - restart / exposure - c.save_stall_s / interval)
    if parts is not None:
        model = dict(model, **OVERLAP)
    return {
        "cluster": c.name, "assumptions": assumptions, "model": model,
        "derived": {"state_gb": state, "young_daly_interval_s": interval, "survivor_stall_s": stall,
                    "victim_out_s": back, "victim_out_spare_s": back_spare, "restart_per_group_s": per_group_restart},
        "peer_group_s": peer, "peer_spare_group_s": peer_spare, "restart_group_s": restart,
        "ratio": restart / peer, "ratio_with_spare": restart / peer_spare,
        "goodput_peer": goodput_peer, "goodput_peer_spare": goodput_spare, "goodput_restart": goodput_restart,
        "goodput_ratio": goodput_peer / goodput_restart if goodput_restart else None,
    }


SEED_CLUSTERS = (
    Cluster("16 nodes x 8 MI300, Llama 3 8B, fault / 180 s", groups=16, params_b=8.0),
    Cluster("32 nodes x 8 MI355, Llama 3 8B, fault / 180 s", groups=32, params_b=8.0, heal_GBps=50.0,
            step_s=1.5),
)


# ---- composed from parts measured one at a time (bench/bench_cost_parts.py) ---------------

OVERLAP = {
    "groups_rebuild_in_parallel": "on a cluster each group restarts on its own node: R restarts overlap "
                                  "fully and cost one group's restart alone in wall time (here R share two "
                                  "cores: max(alone, R x CPU-seconds / cores))",
    "rendezvous_is_shared": "the store and the process group wait for the last process: every group "
                            "idles through the rendezvous of all R (measured against R, a line beyond 16)",
    "checkpoint_read_at_cluster_rate": "each group reads its own copy at the assumed per-group file-system "
                                       "rate; the growth of the concurrent read measured here is this box's "
                                       "one disk and two cores",
    "peer_victim_overlaps_survivors": "a victim's start, build and heal overlap the survivors' training: "
                                      "only its own group-seconds and the survivors' stall are lost",
    "quorum_every_step": "torchft asks the Lighthouse for a quorum every step: peer recovery pays "
                         "quorum_steady(R) per step, a plain torchtitan job does not",
}


@dataclass(frozen=True)
class Parts:
    """bench_cost_parts.py's medians: one group back alone (wall, CPU-seconds) per way, and each
    R-dependent part (wall, CPU-seconds summed over the R processes) per group count."""

    model: str
    peer_alone: tuple[float, float]
    restart_alone: tuple[float, float]
    by_part: dict[str, dict[int, tuple[float, float]]]

    @classmethod
    def from_json(cls, data: dict[str, Any], model: str | None = None) -> "Parts":
        model = model or next(iter(data["alone"]))
        alone = data["alone"][model]
        by_part: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for r in data["parts"]:
            by_part.setdefault(r["part"], {}).setdefault(int(r["groups"]), []).append(r)
        med = {part: {g: (statistics.median(x["wall_s"] for x in rows), statistics.median(x["cpu_s"] for x in rows))
                      for g, rows in sorted(by_r.items())} for part, by_r in by_part.items()}
        return cls(model=model,
                   peer_alone=(alone["peer"]["wall_s"], alone["peer"]["cpu_s"]),
                   restart_alone=(alone["restart"]["wall_s"], alone["restart"]["cpu_s"]), by_part=med)

    def at(self, part: str, groups: int) -> float:
        """The part's wall time at ``groups``: measured there, else a straight line in R through
        the measured group counts (never below the smallest measured)."""
        rows = self.by_part.get(part, {})
        if not rows:
            return 0.0
        if groups in rows:
            return rows[groups][0]
        a, b = _line((g, w) for g, (w, _) in rows.items())
        return max(min(w for w, _ in rows.values()), a + b * groups)

    def rendezvous(self, groups: int) -> float:
        """What a restart of R groups waits for beyond what one group alone already paid."""
        return max(0.0, sum(self.at(p, groups) - self.at(p, 1) for p in ("store", "process_group")))


def compose(parts: Parts, groups: int, cores: int | None = None) -> dict[str, Any]:
    """One failure's wall time and group-seconds at ``groups``, both ways, from the parts: on a
    cluster (one node per group, ``cores`` None) and on one box of ``cores`` cores, where the R
    restarts share the cores (OVERLAP says which parts overlap where)."""
    peer_wall, peer_cpu = parts.peer_alone
    restart_wall, restart_cpu = parts.restart_alone
    shared = parts.rendezvous(groups)
    rebuild = restart_wall if cores is None else max(restart_wall, groups * restart_cpu / cores)
    restart = rebuild + shared
    return {"groups": groups, "where": "cluster" if cores is None else f"{cores} cores",
            "restart_wall_s": restart, "restart_group_s": groups * restart,
            "restart_cpu_s": groups * restart_cpu, "rendezvous_s": shared,
            "peer_victim_out_s": peer_wall, "peer_cpu_s": peer_cpu,
            "quorum_per_step_s": parts.at("quorum_steady", groups)}
