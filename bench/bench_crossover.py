"""The crossover: at which fault period peer recovery and plain checkpoint-restart break even,
composed from measured parts and checked against the races measured at several periods.

Nothing is run here: the parts come from bench_goodput.py's races (``--from``, one or more
JSON files), each arm measured against its race's fault-free torchft reference (goodput 1.0).
Per race (model, groups) and arm (peer, restart, plain_restart):

  goodput(P) = pace * saving(P) * max(0, 1 - (fixed + redo(P)) / P)

  pace       the arm's fault-free rate against the reference: reference step / the arm's
             median step (plain torchtitan pays no quorum per step, and is faster where that
             is a large share of the step; with debugmodel at 8 groups it is the slower)
  saving(P)  the share of time not spent on durable saves: 1 / (1 + c / (K s)), c the measured
             cost of a save, s the step, K(P) Young/Daly's interval for that period (every arm
             of the races saves by that rule, peer included: a total loss still needs a
             checkpoint)
  fixed      what one fault costs beyond the steps it throws away, in seconds of the whole
             job's training: for peer the survivors' stall and the victim's missing tokens while
             it is away; for a restart the detection, teardown, start-up and load. Fitted from
             the measured runs: fixed = (1 - goodput / (pace * saving)) * wall / faults - redo,
             with token goodput (a step committed by fewer groups trains on fewer tokens)
  redo(P)    the steps a restart throws away: on average half an interval, K(P) s / 2; a peer
             heals to the current step and redoes none

``peer_async`` (composed only, never raced): peer's parts with its pace scaled by the fault-free
step of the synchronous over the async quorum (bench_overhead.py, same model and size): what
taking the quorum off the step would change, where plain restart's lead is the per-step cost.

The check: every measured point is composed again from the parts fitted on the race's *other*
periods (``composed_from``), so the composition is tested on a period it did not see; a race
measured at one period only is composed from that run (``checked: false``).

JSON (``--out``): ``{"records": [{"model", "groups", "period_s", "peer_goodput",
"plain_restart_goodput", "restart_goodput", "measured", ...}], "parts": [...],
"crossovers": [...], "from": [...]}``; the PNG beside it: goodput against the fault period from
30 s to 24 h, one panel per race, each measured point at the period its faults really came
(a fault due while no group trained waited for one, so a slow restart stretches it).

Usage:
  python bench/bench_crossover.py --from bench/results/goodput.json,bench/results/goodput_periods.json \\
      --overhead bench/results/overhead.json --out bench/results/crossover.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goodput_records import race, reached  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ARMS = ("peer", "restart", "plain_restart")
GRID = (30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 43200, 86400)  # 30 s .. 24 h


def young_daly_k(save_cost: float, period: float, step: float) -> int:
    return max(1, round(math.sqrt(2 * save_cost * period) / step))


def pace(record: dict, reference: dict) -> float:
    """The arm's fault-free rate against the reference's: reference step over its own."""
    ref_step = reference["wall_s"] / reference["target_step"]
    return ref_step / (ref_step + record["lost_s"]["steady_steps"] / reached(record))


def saving(save_cost: float, period: float, step: float, saves: bool) -> float:
    if not saves:
        return 1.0
    return 1.0 / (1.0 + save_cost / (young_daly_k(save_cost, period, step) * step))


def redo_s(arm: str, save_cost: float, period: float, step: float) -> float:
    return 0.0 if arm.startswith("peer") else young_daly_k(save_cost, period, step) * step / 2


def fixed_cost(record: dict, reference: dict) -> float:
    """Seconds of the whole job's training one fault cost this run beyond its redone steps."""
    period, step, cost = record["period_s"], record["step_time_s"], record["save_cost_s"]
    full = pace(record, reference) * saving(cost, period, step, bool(record["checkpoint_every"]))
    lost_per_fault = (1 - min(record["token_goodput"] / full, 1.0)) * record["wall_s"] / record["faults"]
    redone = record["steps_lost"] * step / record["faults"]
    return lost_per_fault - redone


def compose(parts: dict, period: float, planned: float | None = None) -> float:
    """Goodput with a fault every ``period`` seconds, saves planned by Young/Daly for
    ``planned`` (default: the same period; a measured run's faults came a little less often
    than its planned period, when it ended between two)."""
    planned = planned or period
    lost = parts["fixed_s"] + redo_s(parts["arm"], parts["save_cost_s"], planned, parts["step_s"])
    return (parts["pace"] * saving(parts["save_cost_s"], planned, parts["step_s"], parts["saves"])
            * max(0.0, 1.0 - lost / period))


def fit(records: list[dict], reference: dict) -> dict:
    """One arm's parts from its measured runs: pace the mean of theirs, the fixed cost per fault
    pooled over their faults (runs stopped at their limit only when no other exists: their
    loss is cut short by the limit)."""
    whole = [r for r in records if reached(r) >= r["target_step"]] or records
    first = records[0]
    return {"arm": first["arm"], "pace": sum(pace(r, reference) for r in records) / len(records),
            "fixed_s": sum(fixed_cost(r, reference) * r["faults"] for r in whole) / sum(r["faults"] for r in whole),
            "save_cost_s": first["save_cost_s"], "step_s": first["step_time_s"], "saves": bool(first["checkpoint_every"]),
            "periods": sorted({r["period_s"] for r in records})}


def crossover(a: dict, b: dict, lo: float = GRID[0], hi: float = GRID[-1]) -> float | None:
    """The period in [lo, hi] where arm ``a``'s composed goodput meets ``b``'s (the first sign
    change on a log grid, then bisection), or None if one is ahead at every period."""
    grid = [lo * (hi / lo) ** (i / 400) for i in range(401)]
    diff = [compose(a, p) - compose(b, p) for p in grid]
    for (p0, d0), (p1, d1) in zip(zip(grid, diff), zip(grid[1:], diff[1:])):
        if d0 == 0:
            return p0
        if (d0 > 0) != (d1 > 0):
            for _ in range(60):
                mid = math.sqrt(p0 * p1)
                if (compose(a, mid) - compose(b, mid) > 0) == (d0 > 0):
                    p0 = mid
                else:
                    p1 = mid
            return math.sqrt(p0 * p1)
    return None


def load(paths: list[str]) -> list[dict]:
    """Every measured record of the files, each race's fault-free reference first."""
    out = []
    for path in paths:
        for r in json.loads((REPO / path).read_text())["records"]:
            if not r.get("reused"):
                out.append(dict(r, source=path))
    return out


def with_async(parts: dict, overhead: list[dict], model: str, groups: int) -> dict | None:
    """Peer with torchft's async quorum, composed only: peer's measured parts, its pace scaled
    by the fault-free step of ``quorum="sync"`` over ``"async"`` from bench_overhead.py at the
    same model and size (None where that was not measured)."""
    step = {r["mode"]: r["step_s_median"] for r in overhead if (r["model"], r["groups"]) == (model, groups)}
    if "sync" not in step or "async" not in step:
        return None
    return dict(parts, arm="peer_async", pace=parts["pace"] * step["sync"] / step["async"])


def build(paths: list[str], overhead_path: str | None = None) -> dict[str, Any]:
    measured = load(paths)
    overhead = json.loads((REPO / overhead_path).read_text())["records"] if overhead_path else []
    records, all_parts, crossings = [], [], []
    for key in dict.fromkeys(race(r) for r in measured):
        same = [r for r in measured if race(r) == key]
        reference = next(r for r in same if r["arm"] == "no_faults")
        runs = {arm: [r for r in same if r["arm"] == arm] for arm in ARMS if any(r["arm"] == arm for r in same)}
        parts = {arm: fit(rs, reference) for arm, rs in runs.items()}
        quick = with_async(parts["peer"], overhead, key[1], key[0]) if "peer" in parts else None
        if quick is not None:
            parts["peer_async"] = quick
        all_parts += [dict(p, model=key[1], groups=key[0]) for p in parts.values()]
        base = {"model": key[1], "groups": key[0]}
        for period in sorted({r["period_s"] for rs in runs.values() for r in rs}):
            rec = dict(base, period_s=period, measured=True)
            for arm, rs in runs.items():  # measured arms only (peer_async is composed)
                run = next((r for r in rs if r["period_s"] == period), None)
                if run is None:
                    continue
                others = [r for r in rs if r["period_s"] != period]
                rec[f"{arm}_goodput"] = run["token_goodput"]
                # a fault due while no group trained waited for one: the faults came this often
                rec[f"{arm}_faults"], rec[f"{arm}_every_s"] = run["faults"], run["wall_s"] / run["faults"]
                rec[f"{arm}_composed"] = compose(fit(others, reference) if others else parts[arm],
                                                 rec[f"{arm}_every_s"], period)
                rec[f"{arm}_composed_from"] = sorted({r["period_s"] for r in others or rs})
                rec["checked"] = bool(others)
            records.append(rec)
        for period in GRID:
            records.append(dict(base, period_s=float(period), measured=False,
                                **{f"{arm}_goodput": compose(p, period) for arm, p in parts.items()}))
        if "peer" in parts and "plain_restart" in parts:
            at = crossover(parts["peer"], parts["plain_restart"])
            short, long_ = (compose(parts["peer"], GRID[0]) >= compose(parts["plain_restart"], GRID[0]),
                            compose(parts["peer"], GRID[-1]) >= compose(parts["plain_restart"], GRID[-1]))
            crossings.append(dict(base, period_s=at, peer_wins_below=short if at else None,
                                  winner=None if at else ("peer" if short else "plain_restart"),
                                  peer_at_24h=compose(parts["peer"], GRID[-1]),
                                  plain_restart_at_24h=compose(parts["plain_restart"], GRID[-1]),
                                  peer_wins_at_24h=long_))
            if "peer_async" in parts:
                ahead = compose(parts["peer_async"], GRID[0]) >= compose(parts["plain_restart"], GRID[0])
                at = crossover(parts["peer_async"], parts["plain_restart"])
                crossings[-1].update(async_period_s=at, async_wins_below=ahead if at else None,
                                     async_winner=None if at else ("peer_async" if ahead else "plain_restart"))
    return {"records": records, "parts": all_parts, "crossovers": crossings, "from": paths,
            "overhead_from": overhead_path}


def label(period: float) -> str:
    return f"{period / 3600:.3g} h" if period >= 3600 else f"{period / 60:.3g} min" if period >= 120 else f"{period:.3g} s"


def plot(result: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    colours = {"peer": "#0072B2", "peer_async": "#56B4E9", "restart": "#D55E00", "plain_restart": "#CC79A7"}
    races = list(dict.fromkeys((r["groups"], r["model"]) for r in result["records"]))
    cols = 2
    rows = math.ceil(len(races) / cols)
    fig = Figure(figsize=(10, 3.6 * rows), dpi=100)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, (groups, model) in zip(axes, races):
        same = [r for r in result["records"] if (r["groups"], r["model"]) == (groups, model)]
        for arm, colour in colours.items():
            curve = [(r["period_s"], r[f"{arm}_goodput"]) for r in same if not r["measured"] and f"{arm}_goodput" in r]
            if not curve:
                continue
            ax.plot([p for p, _ in curve], [g for _, g in curve], color=colour, lw=1.4,
                    ls="--" if arm == "peer_async" else "-", label=f"{arm} (composed)")
            points = [(r[f"{arm}_every_s"], r[f"{arm}_goodput"]) for r in same if r["measured"] and f"{arm}_goodput" in r]
            if points:
                ax.plot([p for p, _ in points], [g for _, g in points], "o", color=colour, ms=6,
                        label=f"{arm} (measured)")
        ax.set_xscale("log")
        ticks = [30, 300, 3600, 8 * 3600, 86400]
        ax.set_xticks(ticks, [label(t) for t in ticks])
        ax.set_ylim(0, max(1.15, max(g for r in same for k, g in r.items() if k.endswith("_goodput")) + 0.05))
        ax.set_title(f"{model}, {groups} groups")
        ax.set_xlabel("fault period")
        ax.set_ylabel("token goodput (fault-free torchft = 1)")
        ax.grid(alpha=0.3)
    for ax in axes[len(races):]:
        ax.set_visible(False)
    fig.axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="sources", default="bench/results/goodput.json,bench/results/goodput_periods.json",
                   help="comma-separated bench_goodput.py JSON files, relative to the repository")
    p.add_argument("--overhead", default="bench/results/overhead.json",
                   help="bench_overhead.py's JSON, for the composed peer_async line ('' for none)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    paths = [x.strip() for x in a.sources.split(",") if x.strip()]
    missing = [x for x in paths + ([a.overhead] if a.overhead else []) if not (REPO / x).exists()]
    if missing:
        p.error(f"--from: no such file {', '.join(missing)}; write it with bench/bench_goodput.py first")
    result = build(paths, a.overhead or None)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out)
    for c in result["crossovers"]:
        where = (f"break even at {label(c['period_s'])}: peer ahead {'below' if c['peer_wins_below'] else 'above'} it"
                 if c["period_s"] else f"{c['winner']} ahead at every period from 30 s to 24 h")
        if "async_period_s" in c:
            where += "; with the async quorum: " + (f"break even at {label(c['async_period_s'])}" if c["async_period_s"]
                                                     else f"{c['async_winner']} ahead at every period")
        print(f"{c['model']}, {c['groups']} groups: {where}")
    for r in result["records"]:
        if r["measured"]:
            print(f"{r['model']}, {r['groups']} groups, {label(r['period_s'])}: " + ", ".join(
                f"{arm} measured {r[f'{arm}_goodput']:.2f} composed {r[f'{arm}_composed']:.2f}"
                for arm in ARMS if f"{arm}_goodput" in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
