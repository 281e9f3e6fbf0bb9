"""What a slow group costs the run, and what each straggler policy gives back; and false alarms.

One invocation runs the same slow run once per policy (``observe``, ``drain``, ``drop``), side by
side: R groups of a model, group 1 made ``--factor`` times slower (the ``slow`` fault) after a
warm-up. For each it records the run's throughput (steps per second committed by group 0, never
the victim) before the fault, while the slow group is in (until the policy acted; ``observe``:
the same window), and after (a drained or dropped group: once the spare it took is rebuilt); how many steps the rule took to name it and how long the policy's
move took. Then fault-free runs (``--quiet`` configurations, e.g. ``tiny:3,tiny:8,debugmodel:3``)
count the groups the rule named anyway: false alarms on this noisy machine.

    python bench/bench_stragglers.py [--quick] [--replicas 3] [--factor 2.5] [--window-steps 40]
        [--quiet tiny:3,tiny:8] [--quiet-steps 200] [--out bench/results/stragglers.json]

The JSON's ``records``: per slow run ``policy``, ``slow_factor``, ``named_after_steps``,
``steps_per_s`` (before, during, after); per fault-free run ``fault_free: true`` and
``stragglers_named``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rate(run, since: float, steps: int, timeout: float) -> tuple[float, float]:
    """Steps per second group 0 commits over its next ``steps`` committed steps after ``since``;
    returns (rate, when the window ended)."""
    from monarch_nb.telemetry.events import Step

    def mine() -> list:
        return [e for e in run.events.events(Step) if e.replica == 0 and e.committed and e.t >= since]

    first = run.wait_for(lambda e: isinstance(e, Step) and e.replica == 0 and e.committed, timeout=timeout,
                         since=since)
    run.wait_for(lambda e: isinstance(e, Step) and e.replica == 0 and e.committed and e.step >= first.step + steps,
                 timeout=timeout, since=since)
    window = [e for e in mine() if first.step <= e.step <= first.step + steps]
    span = window[-1].t - window[0].t
    return (len(window) - 1) / span if span > 0 else 0.0, window[-1].t


def slow_run(policy: str, a: argparse.Namespace, root: str) -> dict:
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.telemetry.events import Drained, Step, StragglerDetected

    run = FTRun(RunConfig(replicas=a.replicas, model=a.model, straggler=policy, spares=a.spares, runs_root=root,
                          run_name=f"slow-{policy}"))
    try:
        run.start()
        run.wait_for_step(a.warmup, timeout=300)
        if a.spares:
            from monarch_nb.ft.control.waiting import wait_for_spares

            wait_for_spares(run, timeout=600)  # a drain takes a ready spare; a spare being built slows everyone
        before, _ = _rate(run, time.time(), a.window_steps, 600)
        t_fault = time.time()
        run.inject("slow", replica=1, factor=a.factor)
        named = run.wait_for(lambda e: isinstance(e, StragglerDetected), timeout=600, since=t_fault)
        named_after = len([e for e in run.events.events(Step) if e.replica == 0 and e.committed
                           and t_fault <= e.t <= named.t])
        moved = None
        if policy == "observe":
            during, t_end = _rate(run, named.t, a.window_steps, 600)
        else:
            moved = run.wait_for(lambda e: isinstance(e, Drained), timeout=600, since=t_fault)
            steps = [e for e in run.events.events(Step) if e.replica == 0 and e.committed and t_fault <= e.t <= moved.t]
            during = (len(steps) - 1) / (steps[-1].t - steps[0].t) if len(steps) > 1 else 0.0
            t_end = moved.t
            if a.spares:  # the pool rebuilds the spare it gave: measure once that is done, not beside it
                from monarch_nb.ft.control.waiting import wait_for_spares

                wait_for_spares(run, timeout=600)
                t_end = time.time()
        after, _ = _rate(run, t_end, a.window_steps, 600)
        return {"policy": policy, "replicas": a.replicas, "model": a.model, "slow_factor": a.factor,
                "fault_free": False, "steps_per_s": {"before": before, "during": during, "after": after},
                "after_vs_before": after / before if before else None,
                "named_after_steps": named_after, "named_ratio": named.ratio,
                "move_s": moved.seconds if moved else None, "from_spare": moved.from_spare if moved else None}
    finally:
        run.stop()


def quiet_run(model: str, replicas: int, steps: int, root: str) -> dict:
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.telemetry.events import RunFinished, StragglerDetected

    run = FTRun(RunConfig(replicas=replicas, model=model, steps=steps, runs_root=root,
                          run_name=f"quiet-{model}-{replicas}"))
    try:
        run.start()
        run.wait_for(lambda e: isinstance(e, RunFinished), timeout=3600)
    finally:
        run.stop()
    named = run.events.events(StragglerDetected)
    return {"model": model, "replicas": replicas, "steps": steps, "fault_free": True, "slow_factor": None,
            "stragglers_named": len(named), "named": [(e.replica, round(e.ratio, 2)) for e in named]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--factor", type=float, default=2.5)
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--warmup", type=int, default=30, help="steps before anything is measured")
    p.add_argument("--window-steps", type=int, default=40, help="steps each throughput figure spans")
    p.add_argument("--policies", default="observe,drain,drop")
    p.add_argument("--quiet", default="tiny:3,tiny:8", help="fault-free MODEL:GROUPS runs counting false alarms")
    p.add_argument("--quiet-steps", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="short: observe and drop, tiny x 3 fault-free, 20-step windows")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.quick:
        a.policies, a.quiet, a.quiet_steps, a.window_steps, a.warmup = "observe,drop", "tiny:3", 100, 20, 20
    root = tempfile.mkdtemp(prefix="bench-stragglers-")
    slow = [slow_run(policy, a, root) for policy in a.policies.split(",") if policy]
    quiet = [quiet_run(spec.split(":")[0], int(spec.split(":")[1]), a.quiet_steps, root)
             for spec in a.quiet.split(",") if spec]
    summary = [f"{r['policy']}: {r['steps_per_s']['before']:.1f} -> {r['steps_per_s']['during']:.1f} -> "
               f"{r['steps_per_s']['after']:.1f} steps/s (after/before {r['after_vs_before']:.2f}x), named after "
               f"{r['named_after_steps']} steps" + (f", moved in {r['move_s']:.1f} s" if r["move_s"] else "")
               for r in slow]
    summary += [f"fault-free {q['model']} x {q['replicas']}: {q['stragglers_named']} named in {q['steps']} steps"
                for q in quiet]
    result = {"date": time.strftime("%Y-%m-%d"), "records": slow + quiet, "summary": summary,
              "command": " ".join(sys.argv)}
    print("\n".join(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
