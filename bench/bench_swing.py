"""The seed's experiment: 16 replica groups, waves of comms faults, the live groups swinging 8 <-> 16.

The seed's run injected an RCCL failure every 180 s into 16 nodes training Llama 3 8B; the
active workers swung between 8 and 16 with a stable loss and no restart. Here: ``--groups``
replica groups of the ``tiny`` Llama 3 flavour; every ``--every`` seconds a wave of up to
``--at-once`` ``comms`` faults (a broken collective, what an RCCL error is to torchft), never
leaving fewer than ``--keep`` groups training (default groups - at-once: a wave that finds the
previous wave's victims still out is smaller, or skipped). The waves go on until a group has
committed ``--steps``; then every victim is waited for and one identity check compares all
groups. A fault-free run of the same config to the same step is the reference.

Writes JSON (``lab.swing.SwingResult``: faults sent and recovered, survivor restarts,
identical at the end, the live-groups timeline, min/max live groups, time at each count, the
loss band check, per-fault recovery times, both loss curves) and a PNG beside it (the loss
against the reference over the live-groups strip). Exit status 0 iff no promise was broken
(``SwingResult.problems()``).

Usage: python bench/bench_swing.py --groups 16 --every 20 --at-once 8 --steps 200 \\
           --out bench/results/swing.json [--job local|slurm] [--lowest-rung process]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from lab.swing import SwingPlan, SwingResult, drive_faults, drive_reference, figure, measure  # noqa: E402


def parser(doc: str = __doc__, *, groups: int = 16, every: float = 20.0, at_once: int = 8, steps: int = 200,
           model: str = "tiny") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", "--replicas", type=int, default=groups, dest="groups")
    p.add_argument("--every", type=float, default=every, help="seconds between waves")
    p.add_argument("--at-once", type=int, default=at_once, help="faults per wave, at most")
    p.add_argument("--keep", type=int, default=None, help="training groups a wave leaves (default groups - at-once)")
    p.add_argument("--steps", type=int, default=steps, help="waves until a group committed this step")
    p.add_argument("--model", default=model)
    p.add_argument("--job", default="local", choices=["local", "slurm"])
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--lowest-rung", default="communicator", choices=["communicator", "process"],
                   help="process: every fault replaces the process, as the reference run did")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--name", default="bench-swing", help="run directory names start with this")
    p.add_argument("--out", help="JSON results (a PNG is written beside it)")
    return p


def main(argv: list[str] | None = None, p: argparse.ArgumentParser | None = None) -> int:
    a = (p or parser()).parse_args(argv)
    plan = SwingPlan(replicas=a.groups, every_s=a.every, at_once=a.at_once, steps=a.steps, seed=a.seed, keep=a.keep,
                     timeout_s=a.timeout)
    stamp = time.strftime("%H%M%S")
    config = RunConfig(replicas=a.groups, model=a.model, job=a.job, spares=a.spares, lowest_rung=a.lowest_rung)
    t0 = time.monotonic()
    faults = FTRun(config, run_name=f"{a.name}-faults-{stamp}")
    drive_faults(faults, plan, log=lambda s: print(f"[{time.monotonic() - t0:5.0f} s] {s}", flush=True))
    last = max(e.step for e in faults.history().steps())
    print(f"[{time.monotonic() - t0:5.0f} s] reference: the same config without faults, to step {last}", flush=True)
    reference = FTRun(config, run_name=f"{a.name}-reference-{stamp}")
    drive_reference(reference, last, timeout=a.timeout)
    result = measure(faults.history(), reference.history(), plan)
    print(f"[{time.monotonic() - t0:5.0f} s] {result.describe()}")
    problems = result.problems()
    print("promises kept" if not problems else "BROKEN: " + "; ".join(problems))
    if a.out:
        result.save(a.out)
        figure(result).savefig(Path(a.out).with_suffix(".png"))
        print(f"wrote {a.out} and {Path(a.out).with_suffix('.png')}")
    return 0 if not problems else 1


def replot(path: str) -> None:
    """Redraw the PNG from a JSON this script wrote (no run needed)."""
    figure(SwingResult.load(path)).savefig(Path(path).with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
