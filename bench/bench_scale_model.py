"""The cost of one failure, both ways, against the number of groups and the state size; fitted
and extrapolated to the seed's clusters (lab/costmodel.py holds the model).

Measures, on this machine, real failures (a ``kill``, ``--faults`` per configuration):
  * groups R in --groups (default 2,3,4,6) at the debugmodel's state size, both ways;
  * state x1, x4.8, x16.8 (debugmodel, debug4x, small: 6.2M, 29M, 104M parameters) at R=3.
Per failure it records the victim's time out (peer), each survivor's stall (peer), and one
group's restart including the checkpoint read (restart mode). The fit is a straight line in
the state size for each; costs then follow costmodel's formulas. Writes JSON and a PNG of the
cost of a failure against cluster size for both ways, measured and extrapolated.

The seed's clusters in 'clusters' are costmodel.extrapolate's, as bench/seed_clusters.py
writes them. ``--refit`` measures nothing: it recomputes the fit, the costs, the clusters and
the PNG from the failures already in ``--out``.

Usage: python bench/bench_scale_model.py --out bench/results/scale_model.json [--quick | --refit]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from lab.costmodel import SEED_CLUSTERS, Cluster, extrapolate, fit  # noqa: E402


def measure(replicas: int, model: str, mode: str, faults: int) -> list[dict]:
    cfg = RunConfig(replicas=replicas, model=model, on_failure=mode, checkpoint_every=10 if mode == "restart" else None,
                    init_timeout_s=600, run_name=f"scale-{mode}-r{replicas}-{model}-{time.strftime('%H%M%S')}")
    run = FTRun(cfg)
    out = []
    try:
        run.start()
        if mode == "restart":
            run.wait_for(lambda e: e.kind == "checkpoint_saved", timeout=600)
        else:
            run.wait_for_step(5, timeout=600)
        for n in range(faults):
            victim = 1 + n % (replicas - 1) if replicas > 1 else 0
            since = time.time()
            run.inject("kill", replica=victim)
            kinds = ("rejoined",) if mode == "peer" else ("restarted_from_checkpoint",)
            run.wait_for(lambda e, v=victim: e.kind in kinds and getattr(e, "replica", v) == v, timeout=600,
                         since=since)
            if mode == "restart":
                for r in range(replicas):
                    run.wait_for(lambda e, r=r: e.kind == "rejoined" and e.replica == r, timeout=600, since=since)
            run.wait_for_step(max(g.step for g in run.groups) + 3, timeout=600)
    finally:
        run.stop()
    history = run.history()
    state_gb = None
    for rec in history.recoveries():
        if rec.heal_bytes:
            state_gb = rec.heal_bytes / 1e9
    saved = run.events.events("checkpoint_saved")
    if state_gb is None and saved:
        state_gb = saved[-1].bytes / 1e9
    times = [e.t for e in history.steps(0)]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
    for rec in history.recoveries():
        if rec.total_s is None:
            continue
        row = {"mode": mode, "replicas": replicas, "model": model, "state_gb": state_gb, "step_s": step_s}
        if mode == "peer":
            row.update(back_s=rec.total_s, stall_s=rec.survivor_stall_s,
                       heal_GBps=(rec.heal_bytes / rec.heal_s / 1e9) if rec.heal_bytes and rec.heal_s else None)
        else:
            row.update(restart_s=rec.total_s)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default="2,3,4,6")
    p.add_argument("--models", default="debugmodel,debug4x,small")
    p.add_argument("--faults", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="groups 2,3 and the debugmodel only, one fault")
    p.add_argument("--refit", action="store_true", help="measure nothing: redo the rest from --out's failures")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.refit:
        failures = json.loads(out.read_text())["failures"]
    else:
        failures = measure_all(a)
    result = summarize(failures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({"fit": result["fit"], "measured_group_s": result["measured_group_s"]}, indent=1))
    for c in result["clusters"]:
        print(f"{c['cluster']}: peer {c['peer_group_s']:.0f} group-s ({c['peer_spare_group_s']:.0f} with a spare), "
              f"restart {c['restart_group_s']:.0f} group-s per failure: {c['ratio']:.1f}x "
              f"({c['ratio_with_spare']:.1f}x with a spare); goodput {c['goodput_peer']:.3f} vs "
              f"{c['goodput_restart']:.3f}")
    _plot(fit(failures), result["measured_group_s"], out.with_suffix(".png"))
    return 0


def measure_all(a: argparse.Namespace) -> list[dict]:
    groups = [2, 3] if a.quick else [int(g) for g in a.groups.split(",")]
    models = ["debugmodel"] if a.quick else a.models.split(",")
    faults = 1 if a.quick else a.faults
    failures: list[dict] = []
    plan = [(r, "debugmodel") for r in groups] + [(3, m) for m in models if m != "debugmodel"]
    for replicas, model in plan:
        for mode in ("peer", "restart"):
            rows = measure(replicas, model, mode, faults)
            failures += rows
            print(f"R={replicas} {model:<10} {mode:<7} " + ", ".join(
                f"{k}={v:.3f}" for r in rows for k, v in r.items() if isinstance(v, float)), flush=True)
    return failures


def summarize(failures: list[dict]) -> dict:
    """Everything but the failures themselves: the fit, the measured cost per group count, and
    the seed's clusters (costmodel.extrapolate, the code bench/seed_clusters.py runs)."""
    model = fit(failures)
    measured = {}
    for r in sorted({f["replicas"] for f in failures}):
        for mode in ("peer", "restart"):
            rows = [f for f in failures if f["replicas"] == r and f["mode"] == mode and f["model"] == "debugmodel"]
            if not rows:
                continue
            if mode == "peer":
                cost = statistics.mean(f["back_s"] + (r - 1) * (f["stall_s"] or 0) for f in rows)
            else:
                cost = statistics.mean(r * (f["restart_s"] + 10 / 2 * f["step_s"]) for f in rows)
            measured[f"{mode}-{r}"] = cost
    clusters = [extrapolate(model, c) for c in SEED_CLUSTERS]
    return {"failures": failures, "fit": model.to_dict(), "measured_group_s": measured, "clusters": clusters}


def _plot(model, measured: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.subplots()
    sizes = [2, 4, 8, 16, 32, 64]
    seed = SEED_CLUSTERS[0]
    at = [extrapolate(model, Cluster(f"{n} groups", groups=n, params_b=seed.params_b)) for n in sizes]
    ax.plot(sizes, [c["restart_group_s"] for c in at], "o-", color="#D55E00",
            label="checkpoint-restart (Llama 3 8B, model)")
    ax.plot(sizes, [c["peer_group_s"] for c in at], "o-", color="#0072B2", label="peer recovery (model)")
    ax.plot(sizes, [c["peer_spare_group_s"] for c in at], "o--", color="#56B4E9", label="peer + warm spare (model)")
    for mode, colour in (("peer", "#0072B2"), ("restart", "#D55E00")):
        pts = sorted((int(k.split("-")[1]), v) for k, v in measured.items() if k.startswith(mode))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "s:", color=colour, alpha=0.6,
                    label=f"{mode}, measured here (6M params)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("replica groups")
    ax.set_ylabel("group-seconds lost per failure")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
