"""Where a fault-tolerant run's controller grows: RSS (and, with ``--trim``, RSS once freed heap
is handed back), Python allocations by traceback and live objects by type, compared between the
end of a warm-up and ``--minutes`` later, one fault every ``--every`` seconds (``--no-faults``:
none). 3 groups, 1 spare, as the soak. Measured 2026-12-02: Python's own growth is the event
store's window filling (~1-2 MB, bounded); the RSS slope (450-640 MB/h, the same without faults)
is native, mostly Monarch's supervision polling (bench/supervision_growth.py).

Usage: python bench/controller_growth.py [--minutes 5] [--every 20] [--warmup 60] [--trim] [--no-faults]
       [--kinds comms,kill] [--dashboard] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import ctypes
import collections
import gc
import json
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from monarch_nb.calls import messages_sent  # noqa: E402
from monarch_nb.ft import FTRun, RunConfig  # noqa: E402

KINDS = ["kill", "segfault", "exit", "exception", "comms", "hang"]


def sample(proc: psutil.Process, t0: float, trim: bool) -> tuple[float, float, float]:
    """(seconds, RSS MB, RSS MB once freed heap is handed back) - the last only with ``trim``."""
    before = proc.memory_info().rss / 2**20
    if trim:
        ctypes.CDLL(None).malloc_trim(0)
    return round(time.time() - t0, 1), round(before, 1), round(proc.memory_info().rss / 2**20, 1)


def types_alive() -> collections.Counter:
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--every", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=60.0)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds to draw from")
    p.add_argument("--dashboard", action="store_true", help="with the live dashboard attached (headless), as a kernel has it")
    p.add_argument("--trim", action="store_true", help="malloc_trim at each sample")
    p.add_argument("--out")
    a = p.parse_args()
    rng = random.Random(0)
    proc = psutil.Process()
    run = FTRun(RunConfig(replicas=3, spares=1, hang_timeout_s=3.0, checkpoint_every=20,
                          run_name=f"growth-{time.strftime('%Y%m%d-%H%M%S')}"))
    rss: list[tuple[float, float, float]] = []
    t0 = time.time()
    report: dict = {}
    try:
        run.start()
        if a.dashboard:
            from monarch_nb.notebook.dashboard import Dashboard

            dashboard = Dashboard(run.events, controls=run)  # noqa: F841 - kept alive for the whole run
        time.sleep(a.warmup)  # a measured warm-up, not a synchronisation
        tracemalloc.start(a.frames)
        types0 = types_alive()
        snap0 = tracemalloc.take_snapshot()
        calls0, t1 = messages_sent(), time.time()
        rss.append(sample(proc, t0, a.trim))
        n = 0
        while time.time() - t1 < a.minutes * 60:
            time.sleep(a.every)  # the fault schedule
            rss.append(sample(proc, t0, a.trim))
            if a.no_faults:
                print(f"rss {rss[-1][1]:.1f} MB (trimmed {rss[-1][2]:.1f})", flush=True)
                continue
            status = {k: v for k, v in run.status().items() if isinstance(k, int)}
            training = [g for g, s in status.items() if s["state"] == "training"]
            if len(training) >= 2:
                kind = rng.choice(a.kinds.split(","))
                try:
                    run.inject(kind, replica=rng.choice(training), hang_s=10.0)
                    n += 1
                    print(f"[{n}] {kind}  rss {rss[-1][1]:.1f} MB (trimmed {rss[-1][2]:.1f})", flush=True)
                except Exception as exc:
                    print(f"refused: {exc}", flush=True)
        calls = messages_sent() - calls0
        elapsed = time.time() - t1
        snap1 = tracemalloc.take_snapshot()
        traced = tracemalloc.get_traced_memory()[0]
        types1 = types_alive()
        tracemalloc.stop()
        growth = snap1.compare_to(snap0, "traceback")
        print(f"\n{n} faults, {calls} calls ({calls / elapsed:.1f}/s) in {elapsed:.0f} s; traced now {traced / 1e6:.1f} MB")
        top = []
        for stat in growth[:25]:
            frames = [f"{f.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.lineno}"
                      for f in stat.traceback]
            top.append({"size_diff_kb": round(stat.size_diff / 1024, 1), "count_diff": stat.count_diff,
                        "traceback": frames})
            print(f"{stat.size_diff / 1024:9.1f} KB {stat.count_diff:+7d}  " + " <- ".join(frames[::-1][:4]))
        tgrowth = [(k, types1[k] - types0.get(k, 0)) for k in types1 if types1[k] - types0.get(k, 0) > 20]
        tgrowth.sort(key=lambda kv: -kv[1])
        print("\nobjects alive, growth by type:")
        for k, d in tgrowth[:25]:
            print(f"  {d:+7d} {k}")
        report = {"command": "python bench/controller_growth.py " + " ".join(sys.argv[1:]), "dashboard": a.dashboard,
                  "faults": n, "calls": calls, "seconds": elapsed, "rss_mb": rss, "top_growth": top,
                  "types_growth": tgrowth[:40],
                  "rss_slope_mb_per_h": (rss[-1][1] - rss[0][1]) / (rss[-1][0] - rss[0][0]) * 3600,
                  "trimmed_slope_mb_per_h": (rss[-1][2] - rss[0][2]) / (rss[-1][0] - rss[0][0]) * 3600}
        print(f"\nRSS {rss[0][1]:.1f} -> {rss[-1][1]:.1f} MB: {report['rss_slope_mb_per_h']:.0f} MB/h; trimmed "
              f"{rss[0][2]:.1f} -> {rss[-1][2]:.1f}: {report['trimmed_slope_mb_per_h']:.0f} MB/h")
    finally:
        run.stop()
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
