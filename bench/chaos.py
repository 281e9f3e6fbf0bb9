"""Chaos: a second fault at a random phase of each recovery, and what survived (JSON).

Each trial kills one replica group and, while it is brought back, hits the run again at a
phase of that recovery drawn at random (detect, teardown, acquire, build, quorum, pg_setup,
heal, rejoin), on a random target (the victim again, the donor, another survivor), with a
random kind (kill, comms; with --slurm also preempt and node_down). Every cell is drawn once
before any repeats. See ``lab/chaos.py`` for what each record means. One run of
``--groups`` groups serves every trial; exit status 1 when any trial broke a promise.

Usage:
  python bench/chaos.py --trials 30 --out bench/results/chaos.json            # local processes
  python bench/chaos.py --trials 30 --slurm --out bench/results/chaos_slurm.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from lab.chaos import as_json, draw, run_trial  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--slurm", action="store_true", help="groups on SLURM allocations (./run.sh slurm up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=10,
                    help="durable checkpoints: a second fault that leaves no holder resumes from one")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args()
    cells = draw(args.trials, args.seed, args.slurm)
    run = FTRun(RunConfig(replicas=args.groups, job="slurm" if args.slurm else "local",
                          checkpoint_every=args.checkpoint_every))
    records = []
    t0 = time.time()
    try:
        run.start()
        run.wait_for_step(3, timeout=300)
        for n, cell in enumerate(cells):
            rec = run_trial(run, cell, trial=n)
            records.append(rec)
            print(f"trial {n:2d} {cell.phase:>8} {cell.target:>8} {cell.kind:>9}: "
                  f"{'ok' if rec.ok else 'BROKEN'} fired={rec.fired} healthy_failed={rec.healthy_failed} "
                  f"holders_left={rec.holders_left} "
                  f"lost={rec.state_lost} back={rec.recovered} identical={rec.identical} "
                  f"squeue={rec.left_in_squeue} {rec.seconds:.1f}s {rec.detail}", flush=True)
            if not rec.recovered:
                break  # the run is no longer fit for another trial; the record says why
    finally:
        run.stop()
    out = as_json(records)
    left = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout if args.slurm else ""
    out["summary"].update(wall_s=round(time.time() - t0, 1), groups=args.groups, seed=args.seed,
                          left_in_squeue_after_stop=sum("monarch_nb-" in line for line in left.splitlines()),
                          run_dir=str(run.run_dir))
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(json.dumps(out["summary"]))
    return 0 if out["summary"]["ok"] == len(records) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
