"""What fault tolerance costs on every step when nothing fails, side by side in one invocation.

For each model and group count, fault-free runs one after the other on this machine:

  plain          plain torchtitan as users run it without torchft: one process group over every
                 group (``on_failure="plain_restart"``), no quorum, no should_commit
  sync           peer recovery (torchft's Manager): a quorum before each step's forward pass,
                 gradients averaged every step (``RunConfig(quorum="sync")``, the default)
  async          the same with torchft's async quorum (``quorum="async"``: the quorum beside the
                 forward pass)
  local_sgd      semi-synchronous: each group steps alone, parameters averaged every
                 ``--sync-every`` steps (``sync="local_sgd"``)
  diloco         semi-synchronous: pseudo-gradients averaged every ``--sync-every`` steps, then
                 an outer Nesterov step (``sync="diloco"``)

Per run, over ``--steps`` committed steps after ``--warm`` (every group's steps): the step time
(the gap between a group's consecutive commits) median, mean and p95 (semi-synchronous
modes: the mean includes the meetings), the share of the step spent in
the quorum, the cross-group gradient average and should_commit (the step record's own timings),
and the controller's CPU (the kernel's share of a core: the monitor, the event ingest). The
ratio ``vs_plain`` is a mode's median step over plain's at the same model and size (``vs_plain_mean``:
the means'): the steady cost of fault tolerance.

JSON: ``{"records": [{"model", "groups", "mode", "default", "step_s_median", "step_s_p95",
"step_s_mean", "vs_plain", "vs_plain_mean", "quorum_share", "average_share", "commit_share", "controller_cpu", "steps"}],
"argv": [...], "cpus": N}``.

Usage: python bench/bench_overhead.py --quick --out bench/results/overhead.json
       (quick: tiny and debugmodel at 3 and 8 groups; without --quick also 16 groups)
       python bench/bench_overhead.py --reflag --out FILE   (mark RunConfig's default again)
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

MODES = {"plain": {"on_failure": "plain_restart"}, "sync": {"quorum": "sync"}, "async": {"quorum": "async"},
         "local_sgd": {"sync": "local_sgd"}, "diloco": {"sync": "diloco"}}


def is_default(mode: str) -> bool:
    """The setting RunConfig uses when nothing is said."""
    default = RunConfig()
    return mode != "plain" and all(getattr(default, k) == v for k, v in MODES[mode].items()) \
        and default.sync == MODES[mode].get("sync", "step")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(model: str, groups: int, mode: str, warm: int, steps: int, sync_every: int) -> dict[str, Any]:
    """One fault-free run of ``mode``; its step figures over ``steps`` commits after ``warm``."""
    extra = dict(MODES[mode])
    if "sync" in extra:
        extra["sync_every"] = sync_every
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
    mean_step = statistics.mean(gaps)  # for a semi-synchronous mode, its meetings included

    def share(field: str) -> float | None:
        values = [getattr(e, field) for e in records if getattr(e, field) is not None]
        return statistics.mean(values) / mean_step if values else None

    return {"model": model, "groups": groups, "mode": mode,
            "default": is_default(mode), "step_s_median": median, "step_s_mean": mean_step,
            "step_s_p95": percentile(gaps, 0.95),
            "quorum_share": share("quorum_s"), "average_share": share("average_s"),
            "commit_share": share("commit_s"), "controller_cpu": controller, "steps": len(gaps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 and 8 groups only")
    p.add_argument("--models", default="tiny,debugmodel")
    p.add_argument("--groups", default=None, help="default 3,8 (--quick) or 3,8,16")
    p.add_argument("--modes", default="sync,async,local_sgd,diloco", help="the fault-tolerant settings beside plain")
    p.add_argument("--sync-every", type=int, default=20, help="local_sgd / diloco: steps between meetings")
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--steps", type=int, default=160, help="committed steps measured per run (debugmodel: a third)")
    p.add_argument("--out", required=True)
    p.add_argument("--reflag", action="store_true",
                   help="only mark again which records are RunConfig's default setting (after a default changed)")
    a = p.parse_args(argv)
    if a.reflag:
        data = json.loads(Path(a.out).read_text())
        for rec in data["records"]:
            rec["default"] = is_default(rec["mode"])
        Path(a.out).write_text(json.dumps(data, indent=1) + "\n")
        return 0
    groups = [int(g) for g in (a.groups or ("3,8" if a.quick else "3,8,16")).split(",")]
    out = Path(a.out)
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for model in a.models.split(","):
        steps = a.steps if model == "tiny" else max(20, a.steps // 3)
        for g in groups:
            for mode in ["plain", *a.modes.split(",")]:
                rec = measure(model, g, mode, a.warm, steps, a.sync_every)
                records.append(rec)
                plain = next(r for r in records if r["model"] == model and r["groups"] == g and r["mode"] == "plain")
                rec["vs_plain"] = rec["step_s_median"] / plain["step_s_median"]
                rec["vs_plain_mean"] = rec["step_s_mean"] / plain["step_s_mean"]
                print(f"{model:<10} R={g:<3} {mode:<9} step {rec['step_s_median'] * 1000:7.1f} ms "
                      f"(mean {rec['step_s_mean'] * 1000:7.1f}, p95 {rec['step_s_p95'] * 1000:7.1f}) "
                      f"vs plain {rec['vs_plain']:.3f} (mean {rec['vs_plain_mean']:.3f}) "
                      f"quorum {rec['quorum_share'] or 0:.1%} average {rec['average_share'] or 0:.1%} "
                      f"commit {rec['commit_share'] or 0:.1%}", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"records": records, "argv": sys.argv[1:] if argv is None else argv,
                                           "cpus": os.cpu_count(), "seconds": time.monotonic() - t0},
                                          indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
