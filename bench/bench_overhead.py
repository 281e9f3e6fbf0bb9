"""What fault tolerance costs on every step when nothing fails, side by side in one invocation.

For each model and group count, fault-free runs one after the other on this machine:

  plain          plain torchtitan as users run it without torchft: one process group over every
                 group (``on_failure="plain_restart"``), no quorum, no should_commit
  <quorum>       peer recovery (torchft's Manager) with ``RunConfig(quorum=...)`` for each setting
                 in --quorums: ``sync`` (the quorum before the forward pass) and ``async`` (the
                 quorum overlapped with the forward and backward passes)

Per run, over ``--steps`` committed steps after ``--warm`` (every group's steps): the step time
(the gap between a group's consecutive commits) median and p95, the share of the step spent in
the quorum, the cross-group gradient average and should_commit (the step record's own timings),
and the controller's CPU (the kernel's share of a core: the monitor, the event ingest). The
ratio ``vs_plain`` is a mode's median step over plain's at the same model and size: the steady
cost of fault tolerance.

JSON: ``{"records": [{"model", "groups", "mode", "default", "step_s_median", "step_s_p95",
"vs_plain", "quorum_share", "average_share", "commit_share", "controller_cpu", "steps"}],
"argv": [...], "cpus": N}``.

Usage: python bench/bench_overhead.py --quick --out bench/results/overhead.json
       (quick: tiny and debugmodel at 3 and 8 groups; without --quick also 16 groups)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402

DEFAULT_QUORUM = RunConfig().quorum


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(model: str, groups: int, mode: str, warm: int, steps: int) -> dict[str, Any]:
    """One fault-free run of ``mode``; its step figures over ``steps`` commits after ``warm``."""
    extra = {"on_failure": "plain_restart"} if mode == "plain" else {"quorum": mode}
    cfg = RunConfig(replicas=groups, model=model, init_timeout_s=900,
                    run_name=f"overhead-{model}-{groups}-{mode}-{time.strftime('%H%M%S')}", **extra)
    run = FTRun(cfg)
    run.start(timeout=900)
    try:
        run.wait_for_step(warm, timeout=600)
        since, c0, wall0 = time.time(), time.process_time(), time.monotonic()
        run.wait_for_step(warm + steps, timeout=1800)
        controller = (time.process_time() - c0) / (time.monotonic() - wall0)
        records = [e for e in run.events.events("step") if e.t >= since and e.committed]
    finally:
        run.stop()
    gaps: list[float] = []
    for r in range(groups):
        times = sorted(e.t for e in records if e.replica == r)
        gaps += [b - a for a, b in zip(times, times[1:])]
    median = statistics.median(gaps)
    mean_step = statistics.mean(gaps)

    def share(field: str) -> float | None:
        values = [getattr(e, field) for e in records if getattr(e, field) is not None]
        return statistics.mean(values) / mean_step if values else None

    return {"model": model, "groups": groups, "mode": mode,
            "default": mode == DEFAULT_QUORUM, "step_s_median": median, "step_s_p95": percentile(gaps, 0.95),
            "quorum_share": share("quorum_s"), "average_share": share("average_s"),
            "commit_share": share("commit_s"), "controller_cpu": controller, "steps": len(gaps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 and 8 groups only")
    p.add_argument("--models", default="tiny,debugmodel")
    p.add_argument("--groups", default=None, help="default 3,8 (--quick) or 3,8,16")
    p.add_argument("--quorums", default="sync,async", help="the fault-tolerant settings measured beside plain")
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="committed steps measured per run (debugmodel: half)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    groups = [int(g) for g in (a.groups or ("3,8" if a.quick else "3,8,16")).split(",")]
    out = Path(a.out)
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for model in a.models.split(","):
        steps = a.steps if model == "tiny" else max(10, a.steps // 2)
        for g in groups:
            for mode in ["plain", *a.quorums.split(",")]:
                rec = measure(model, g, mode, a.warm, steps)
                records.append(rec)
                plain = next(r for r in records if r["model"] == model and r["groups"] == g and r["mode"] == "plain")
                rec["vs_plain"] = rec["step_s_median"] / plain["step_s_median"]
                print(f"{model:<10} R={g:<3} {mode:<6} step {rec['step_s_median'] * 1000:7.1f} ms "
                      f"(p95 {rec['step_s_p95'] * 1000:7.1f}) vs plain {rec['vs_plain']:.3f} "
                      f"quorum {rec['quorum_share'] or 0:.1%} average {rec['average_share'] or 0:.1%} "
                      f"commit {rec['commit_share'] or 0:.1%}", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"records": records, "argv": sys.argv[1:] if argv is None else argv,
                                           "cpus": os.cpu_count(), "seconds": time.monotonic() - t0},
                                          indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
