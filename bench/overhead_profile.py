"""Where a fault-free step's time goes inside one worker, sampled with py-spy: the training
thread's samples split into the step's parts (compute, the gradient average, torchft's quorum
and should_commit, the optimizer), and what the quorum's and should_commit's samples were
doing. bench_overhead.py measures the cost side by side with plain torchtitan; this says which
code holds it (ours, or torchft's).

py-spy counts samples of threads that are not idle (a thread waiting on a socket inside a
native call still counts), so a share here is a share of the busy training thread's samples.

Usage: python bench/overhead_profile.py [--model tiny] [--groups 3] [--quorum sync] [--seconds 20]
       [--out bench/results/overhead_profile.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The step's parts, matched on the training thread's stack in this order (first match wins).
PARTS = (("start_quorum", "quorum"), ("should_commit", "should_commit"), ("_average", "average"),
         ("_compute", "compute"), ("clip_grad_norm", "clip"), ("optimizer.py", "optimizer"))
DETAIL = ("start_quorum", "should_commit")  # what these parts' samples were doing, three frames down


def classify(raw: str) -> dict:
    """Shares of the training thread's samples per part, and the top sub-stacks of DETAIL."""
    parts: collections.Counter[str] = collections.Counter()
    detail: dict[str, collections.Counter[str]] = {k: collections.Counter() for k in DETAIL}
    total = training = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        if "TrainerActor._loop" not in stack:
            continue
        training += n
        frames = stack.split(";")
        parts[next((name for key, name in PARTS if key in stack), "other")] += n
        for key in DETAIL:
            at = [i for i, f in enumerate(frames) if key in f]
            if at:
                below = frames[at[-1] + 1:at[-1] + 4]
                detail[key][" > ".join(f.split(" (")[0] for f in below) or "(in the call itself)"] += n
    return {"samples": total, "training_thread_samples": training,
            "shares": {k: round(v / max(training, 1), 4) for k, v in parts.most_common()},
            "detail": {k: [{"share": round(v / max(training, 1), 4), "below": s} for s, v in c.most_common(6)]
                       for k, c in detail.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--quorum", default="sync", choices=["sync", "async"])
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--out")
    a = p.parse_args(argv)
    from monarch_nb.ft import FTRun, RunConfig

    run = FTRun(RunConfig(replicas=a.groups, model=a.model, quorum=a.quorum, check_identical=False,
                          runs_root=tempfile.mkdtemp(prefix="overhead-profile-"), run_name="overhead-profile"))
    raw = Path(tempfile.mkdtemp()) / "raw.txt"
    try:
        run.start()
        run.wait_for_step(30, timeout=300)
        pid = run.groups[1 % a.groups].pids[0]
        spy = Path(sys.executable).with_name("py-spy")
        subprocess.run([str(spy), "record", "-d", str(a.seconds), "-r", "200", "-p", str(pid), "-f", "raw",
                        "-o", str(raw), "--nonblocking"], check=True, capture_output=True)
    finally:
        run.stop()
    result = {"command": "python bench/overhead_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "model": a.model, "groups": a.groups, "quorum": a.quorum, "seconds": a.seconds,
              **classify(raw.read_text())}
    print(json.dumps({k: result[k] for k in ("shares", "detail")}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
