"""The seed's experiment, scaled down: waves of faults, live groups swinging, no restart.

The seed's run injected an RCCL fault every 180 s and the cluster moved between 8 and 16
workers with a stable loss curve. Here: 4 replica groups; every ``--every`` seconds a
``comms`` fault hits ``--at-once`` groups together (a few times a victim's recovery time), so
the number of live groups swings between 2 and 4. A run without faults, same model, data and
length in steps, is the reference: the wave run's committed loss must stay inside its band
(``RunHistory.loss_band``: the reference's mean over 20 steps +/- max(3 std, 5%)).

Reports the time spent at each group count, the band check, restarts of survivors (must be
none), and writes a PNG of both loss curves with the live-groups strip.

Usage: python bench/bench_waves.py [--steps 240] [--every 25] [--at-once 2] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from monarch_nb.telemetry.events import Respawned  # noqa: E402


def run_once(steps: int, replicas: int, faults: bool, a: argparse.Namespace) -> FTRun:
    run = FTRun(RunConfig(replicas=replicas, steps=steps, spares=a.spares,
                          run_name=f"bench-waves-{'faults' if faults else 'reference'}-{time.strftime('%H%M%S')}"))
    try:
        run.start()
        if faults:
            run.schedule(every=a.every, kinds=["comms"], at_once=a.at_once, seed=0)
        run.wait_for(lambda e: e.kind == "replica_state" and e.state == "finished", timeout=a.timeout)
        run.stop_schedule()
        for r in range(replicas):  # a group out when the others finished ends too (no peer left)
            run.wait_for(lambda e, r=r: e.kind == "replica_state" and e.state == "finished" and e.replica == r,
                         timeout=a.timeout)
    finally:
        run.stop()
    return run


def plot(reference: FTRun, waves: FTRun, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100)
    ax, strip = fig.subplots(2, 1, height_ratios=[3, 1])
    for run, label, colour in ((reference, "no faults", "#999999"), (waves, "waves of comms faults", "#0072B2")):
        h = run.history()
        pts = sorted({e.step: e.loss for e in h.steps()}.items())
        ax.plot([s for s, _ in pts], [v for _, v in pts], label=label, color=colour, lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("committed loss")
    ax.legend()
    series = waves.history().live_groups()
    t0 = series[0][0]
    xs, ys = [], []
    for t, n in series:
        if xs:
            xs.append(t - t0)
            ys.append(ys[-1])
        xs.append(t - t0)
        ys.append(n)
    strip.plot(xs, ys, color="#2e7d32")
    strip.set_xlabel("wall time (s)")
    strip.set_ylabel("groups")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--every", type=float, default=25.0, help="seconds between waves")
    p.add_argument("--at-once", type=int, default=2)
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", help="JSON results (a PNG is written beside it)")
    a = p.parse_args(argv)
    reference = run_once(a.steps, a.replicas, False, a)
    waves = run_once(a.steps, a.replicas, True, a)
    h = waves.history()
    band = h.loss_band(reference.history())
    spent = h.time_at_group_counts()
    faults = [e for e in waves.events if e.kind == "fault_injected"]
    victims = {e.replica for e in faults}
    survivors_restarted = sorted({e.replica for e in waves.events.events(Respawned)} - victims)
    print(f"waves: {len(faults)} faults into groups {sorted(victims)}; time at each group count: "
          + ", ".join(f"{n} groups {s:.0f} s" for n, s in spent.items()))
    print(f"loss: {band.describe()}")
    print(f"survivors restarted: {survivors_restarted or 'none'}")
    result = {"time_at_group_counts": spent, "band": {"checked": band.checked, "outside": band.outside,
                                                       "inside_fraction": band.inside_fraction, "rule": band.describe()},
              "faults": len(faults), "survivors_restarted": survivors_restarted,
              "reference_run": str(reference.run_dir), "waves_run": str(waves.run_dir)}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
        plot(reference, waves, Path(a.out).with_suffix(".png"))
    return 0 if band.within and not survivors_restarted else 1


if __name__ == "__main__":
    sys.exit(main())
