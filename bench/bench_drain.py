"""What a planned move costs the run: ``run.drain(R)`` with and without a warm spare, side by side.

One invocation, one run per configuration (R groups of a model, ``--spares 0,1``): after a warm-up,
group 1 is drained ``--repeats`` times (each time the newest group standing in for it). Each
record: ``seconds`` (draining -> drained), ``lost_steps`` (steps a survivor did not commit, or
skipped, while the move ran), ``stall_steps`` (the survivors' longest wait between two committed
steps from draining until 3 steps after drained, in median steps of the warm-up, less the one step
it is anyway; ``stall_join_steps`` before the group was told to leave, while the replacement
joined and healed, and ``stall_leave_steps`` after), ``wait_join_steps`` / ``wait_leave_steps`` (the
survivor's longest wait for the others in one step - quorum, gradient average, commit - beyond its
usual wait, in median steps: the stall without the slower compute of one more group on this host's
cores), ``identical`` (every group's digests at a common step after it), ``from_spare``.

    python bench/bench_drain.py [--quick] [--replicas 3] [--spares 0,1] [--repeats 2] [--heartbeat-timeout-ms N]
                                [--seq-len N] [--batch-size N]
                                [--out bench/results/drain.json]
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
AFTER_STEPS = 3  # steps past the move kept in the window
sys.path.insert(0, str(REPO))


def _waited(e) -> float:
    """What a survivor's step spent waiting for the others: its quorum, gradient average and commit."""
    return (e.quorum_s or 0.0) + (e.average_s or 0.0) + (e.commit_s or 0.0)


def _in_steps(extra: list[float], step_s: float) -> float | None:
    return round(max(extra or [0.0]) / step_s, 2) if step_s > 0 else None


def one_run(spares: int, a: argparse.Namespace, root: str) -> list[dict]:
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.ft.control.waiting import wait_for_spares
    from monarch_nb.telemetry.events import FailureDetected, ReplicaState, Step

    beat = {"heartbeat_timeout_ms": a.heartbeat_timeout_ms} if a.heartbeat_timeout_ms else {}
    beat.update({k: v for k, v in (("seq_len", a.seq_len), ("batch_size", a.batch_size)) if v})
    run = FTRun(RunConfig(replicas=a.replicas, model=a.model, spares=spares, runs_root=root,
                          run_name=f"drain-spares{spares}", **beat))
    records = []
    try:
        run.start()
        run.wait_for_step(a.warmup, timeout=300)
        victim = 1
        for _ in range(a.repeats):
            if spares:
                wait_for_spares(run, timeout=600)
            t_warm = time.time()
            run.wait_for_step(max(g.step for g in run.groups.active()) + 10, timeout=300)
            warm_steps = [e for e in run.events.events(Step) if e.replica == 0 and e.committed and e.t >= t_warm]
            warm = [e.t for e in warm_steps]
            step_s = statistics.median(b - a_ for a_, b in zip(warm, warm[1:]))
            usual_wait = statistics.median(_waited(e) for e in warm_steps)
            since = time.time()
            moved = run.drain(victim, timeout=600)
            survivors = [g.index for g in run.groups.active() if g.index not in (victim, moved.replacement)]
            # the window runs past the move by a few steps: the first quorum without the leaver
            # (it waits for the leaver's heartbeat to lapse) is part of what the move costs
            run.wait_for_step(max(g.step for g in run.groups.active()) + AFTER_STEPS, timeout=300)
            until = time.time()
            window = [e for e in run.events.events(Step) if e.replica in survivors and since <= e.t <= until]
            lost = sum(1 for e in window if not e.committed)
            mine = sorted((e for e in window if e.replica == survivors[0] and e.committed), key=lambda e: e.t)
            steps = [e.step for e in mine]
            lost += sum(b - a_ - 1 for a_, b in zip(steps, steps[1:]) if b - a_ > 1)
            times = [since] + [e.t for e in mine]
            gaps = list(zip(times, times[1:]))
            stall = max(b - a_ for a_, b in gaps) / step_s - 1 if step_s > 0 else None
            left = next((e.t for e in run.events.events(ReplicaState)
                         if e.replica == victim and e.state == "retiring" and e.t >= since), moved.t)
            join = [b - a_ for a_, b in gaps if b <= left] or [0.0]
            leave = [b - a_ for a_, b in gaps if b > left] or [0.0]
            waits = [(e.t, _waited(e) - usual_wait) for e in mine]
            same = run.check_identical(timeout=180)
            records.append({"spares": spares, "replicas": a.replicas, "model": a.model, "seconds": moved.seconds,
                            "seq_len": run.config.seq_len, "batch_size": run.config.batch_size,
                            "lost_steps": lost, "stall_steps": round(stall, 2) if stall is not None else None,
                            "stall_join_steps": round(max(join) / step_s - 1, 2) if step_s > 0 else None,
                            "stall_leave_steps": round(max(leave) / step_s - 1, 2) if step_s > 0 else None,
                            "wait_join_steps": _in_steps([w for t, w in waits if t <= left], step_s),
                            "wait_leave_steps": _in_steps([w for t, w in waits if t > left], step_s),
                            "identical": bool(same is not None and same.identical), "from_spare": moved.from_spare,
                            "step_s": step_s, "heartbeat_timeout_ms": run.config.heartbeat_timeout_ms,
                            # any failure in the run so far (a lower heartbeat timeout may count a live group out)
                            "failures": len(run.events.events(FailureDetected))})
            victim = moved.replacement
    finally:
        run.stop()
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--spares", default="0,1", help="configurations to compare, e.g. 0,1")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="one drain per configuration")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=None,
                   help="the Lighthouse's heartbeat timeout (default: RunConfig's); the leave waits it out")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence: longer steps (default RunConfig's)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default RunConfig's)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.quick:
        a.repeats = 1
    root = tempfile.mkdtemp(prefix="bench-drain-")
    records = [r for spares in (int(s) for s in a.spares.split(",")) for r in one_run(spares, a, root)]
    summary = []
    for spares in sorted({r["spares"] for r in records}):
        rows = [r for r in records if r["spares"] == spares]
        summary.append(f"spares={spares}: moved in {statistics.median(r['seconds'] for r in rows):.1f} s (median of "
                       f"{len(rows)}), lost steps {max(r['lost_steps'] for r in rows)}, survivors' longest stall "
                       f"{max(r['stall_steps'] for r in rows):.1f} steps (longest wait for the others "
                       f"{max(max(r['wait_join_steps'], r['wait_leave_steps']) for r in rows):.1f}), identical "
                       f"{all(r['identical'] for r in rows)}")
    print("\n".join(summary))
    if a.out:
        Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "records": records,
                                           "summary": summary, "command": " ".join(sys.argv)}, indent=1))


if __name__ == "__main__":
    main()
