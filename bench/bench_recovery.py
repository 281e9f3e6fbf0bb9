"""Recovery figures per fault kind, measured on a real fault-tolerant run.

Starts one ``FTRun`` (R replica groups of the tiny Llama 3, CPU + gloo by default), injects
each fault kind in turn into a rotating victim, waits until the victim has rejoined and the
replicas were checked identical, and reports from the run's event log alone:

  phases      detect, teardown, acquire, build, heal, rejoin: back to back, each from the
              previous one's end, adding up to ``total`` = fault -> the victim's first
              committed step (monarch_nb.ft.recovery defines them)
  stall       longest gap between a survivor's committed steps around the failure,
              in units of its median step time before the fault (and in seconds)
  heal        bytes of the peer-to-peer state transfer, and the source group

Usage: python bench/bench_recovery.py [--kinds kill,exception,...] [--repeat N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FaultKind, FTRun, RunConfig  # noqa: E402
from monarch_nb.ft.recovery import PHASES  # noqa: E402
from monarch_nb.telemetry.events import Rejoined, ReplicasIdentical  # noqa: E402

COLUMNS = [("fault", "{}"), ("replica", "{}")] + [(f"{p}_s", "{:.2f}") for p in PHASES] + [
    ("total_s", "{:.2f}"), ("stall_steps", "{:.1f}"), ("stall_s", "{:.2f}"), ("heal_MB", "{:.1f}"),
    ("heal_source", "{}"), ("rejoined_step", "{}"), ("survivor_commits", "{}"), ("identical", "{}"),
]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(k.value for k in FaultKind))
    p.add_argument("--repeat", type=int, default=1, help="faults per kind")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--group-size", type=int, default=1)
    p.add_argument("--hang-s", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=240.0, help="per fault: inject -> identical check")
    p.add_argument("--json", help="write rows and the run directory here")
    a = p.parse_args(argv)
    kinds = [FaultKind.parse(k, "kinds") for k in a.kinds.split(",") if k]

    run = FTRun(RunConfig(replicas=a.replicas, group_size=a.group_size, run_name=f"bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    t0 = time.time()
    failures: list[str] = []
    try:
        run.start()
        print(f"started {a.replicas} groups in {time.time() - t0:.1f} s; run dir {run.run_dir}", flush=True)
        run.wait_for_step(5, timeout=180)
        n = 0
        for kind in kinds:
            for _ in range(a.repeat):
                victim = n % a.replicas
                n += 1
                since = time.time()
                try:
                    run.inject(kind, replica=victim, hang_s=a.hang_s)
                    rej = run.wait_for(lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v,
                                       timeout=a.timeout, since=since)
                    run.wait_for(lambda e, t=rej.t: isinstance(e, ReplicasIdentical) and e.t >= t, timeout=a.timeout)
                    print(f"  {kind.value:<9} replica {victim}: rejoined at step {rej.step} "
                          f"({rej.seconds_since_failure or 0:.1f} s after the failure)", flush=True)
                except TimeoutError as e:
                    failures.append(f"{kind.value} on replica {victim}: {e}")
                    print(f"  {kind.value:<9} replica {victim}: NOT RECOVERED ({e})", flush=True)
    finally:
        run.stop()

    history = run.history()
    rows = [r.row() for r in history.recoveries()]
    print()
    print(" | ".join(name for name, _ in COLUMNS))
    print("-|-".join("-" * len(name) for name, _ in COLUMNS))
    for row in rows:
        print(" | ".join(_fmt(row[name], spec) for name, spec in COLUMNS))
    step_times = []
    for r in range(a.replicas):
        ts = [e.t for e in history.steps(r)]
        step_times += [b - a_ for a_, b in zip(ts, ts[1:])]
    summary = history.summary()
    summary["median_step_s"] = statistics.median(step_times) if step_times else None
    print(f"\nmedian step {summary['median_step_s']:.3f} s; loss {summary['loss_start']:.2f} -> "
          f"{summary['loss_end']:.2f}; identity checks: {summary['identity_checks']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"run_dir": str(run.run_dir), "rows": rows, "summary": summary,
                                            "failures": failures}, indent=1, default=str))
    return 1 if failures or not all(r["identical"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
