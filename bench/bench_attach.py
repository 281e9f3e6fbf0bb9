"""What it costs that a named run lives in a process of its own: per-step time and event delivery.

One invocation runs the same run twice, side by side: in this process (``FTRun``, as an unnamed
or ``--attached`` run is) and detached (``FTRun.detached``: its own host process; this process
holds a ``RunClient`` following the run's log). For each it records the median step time of
the groups (what training pays), and for every committed step how long after the step's own
timestamp this process's store delivered it to an observer (what the dashboard and waits see:
in-kernel, the controller's poll of the groups; detached, that plus the follower's read of the
log), and the dashboard model's cost per event.

    python bench/bench_attach.py [--steps 80] [--replicas 2] [--model tiny] [--out bench/results/attach.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def measure(mode: str, steps: int, replicas: int, model: str, root: str) -> dict:
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.notebook.dashboard_model import DashboardModel
    from monarch_nb.telemetry.events import RunStopped, Step

    config = RunConfig(replicas=replicas, model=model, steps=steps, runs_root=root, run_name=f"bench-{mode}")
    run = FTRun.detached(config) if mode == "detached" else FTRun(config).start()
    seen: list[tuple[float, float]] = []  # (step's own time, when this process's store delivered it)
    model_s: list[float] = []
    dashboard = DashboardModel()

    def observe(e: object) -> None:
        now = time.time()
        if isinstance(e, Step) and e.committed:
            seen.append((e.t, now))
        t0 = time.perf_counter()
        dashboard.apply(e)
        model_s.append(time.perf_counter() - t0)

    unsubscribe = run.events.subscribe(observe)
    try:
        run.events.wait_for(lambda e: isinstance(e, RunStopped), timeout=600)
    finally:
        unsubscribe()
        run.stop()
    commits = sorted((e.replica, e.step, e.t) for e in run.events.events(Step) if e.committed)
    per_group: dict[int, list[float]] = {}
    for replica, _, t in commits:
        per_group.setdefault(replica, []).append(t)
    gaps = [b - a for ts in per_group.values() for a, b in zip(ts, ts[1:])]
    delays = [seen_at - t for t, seen_at in seen]
    if mode == "detached":
        run.detach()
    return {"mode": mode, "steps": steps, "replicas": replicas, "model": model,
            "step_s_median": statistics.median(gaps), "delivery_s_median": statistics.median(delays),
            "delivery_s_p95": sorted(delays)[int(0.95 * (len(delays) - 1))], "events": len(model_s),
            "dashboard_model_us_per_event": 1e6 * statistics.mean(model_s)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "attach.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_attach-") as root:
        records = [measure(mode, args.steps, args.replicas, args.model, root) for mode in ("in_kernel", "detached")]
    base, detached = records
    summary = {"step_time_ratio": detached["step_s_median"] / base["step_s_median"],
               "delivery_extra_s": detached["delivery_s_median"] - base["delivery_s_median"],
               "dashboard_model_ratio": detached["dashboard_model_us_per_event"] / base["dashboard_model_us_per_event"]}
    Path(args.out).write_text(json.dumps({"records": records, "summary": summary}, indent=1) + "\n")
    for r in records:
        print(f"{r['mode']:<10} step {r['step_s_median'] * 1000:6.1f} ms  delivered after {r['delivery_s_median'] * 1000:6.1f} "
              f"ms (p95 {r['delivery_s_p95'] * 1000:.0f})  dashboard model {r['dashboard_model_us_per_event']:.0f} us/event")
    print(f"detached / in-kernel: step time {summary['step_time_ratio']:.2f}x, events {summary['delivery_extra_s'] * 1000:+.0f} ms "
          f"later, dashboard model {summary['dashboard_model_ratio']:.2f}x -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
