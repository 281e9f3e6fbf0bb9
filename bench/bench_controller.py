"""Controller overhead and failure detection, measured side by side in one run.

* no-op call latency: raw Monarch ``call().get()`` and ``call_one().get()`` against the
  controller's deadline call (``session.deadline(...).noop.call()``), interleaved round by
  round so machine noise hits both alike; reported as medians, p99 and the ratio.
* failure detection: SIGKILL a worker, time until the controller's ``on_failure`` fires.

Run: ``.venv/bin/python bench/bench_controller.py [--rounds 300] [--kills 5] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import threading
import time

import monarch_nb  # first: sets Monarch's supervision poll before monarch is imported
from monarch.actor import Actor, endpoint


class Noop(Actor):
    @endpoint
    def noop(self) -> None:
        return None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_calls(session: monarch_nb.Session, procs: int, rounds: int) -> dict:
    session.up("bench", procs=procs)
    actors = session.spawn("noop", Noop, mesh="bench")
    one = actors.slice(gpus=0)
    timed = session.deadline(actors, 10)
    timed_one = session.deadline(one, 10)
    samples: dict[str, list[float]] = {k: [] for k in ("raw_call", "nb_call", "raw_call_one", "nb_call_one")}
    for _ in range(20):  # warm up both paths
        actors.noop.call().get()
        timed.noop.call()
    for _ in range(rounds):
        for name, fn in (("raw_call", lambda: actors.noop.call().get()), ("nb_call", timed.noop.call),
                         ("raw_call_one", lambda: one.noop.call_one().get()), ("nb_call_one", timed_one.noop.call_one)):
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    session.down("bench")
    out = {k: {"median_ms": statistics.median(v), "p99_ms": pct(v, 0.99)} for k, v in samples.items()}
    out["ratio_call"] = out["nb_call"]["median_ms"] / out["raw_call"]["median_ms"]
    out["ratio_call_one"] = out["nb_call_one"]["median_ms"] / out["raw_call_one"]["median_ms"]
    return out


def bench_detection(session: monarch_nb.Session, kills: int) -> dict:
    latencies = []
    for i in range(kills):
        mesh = session.up(f"victim{i}", procs=2)
        fired = threading.Event()
        remove = session.on_failure(lambda ev: fired.set())
        start = time.monotonic()
        os.kill(mesh.procs[1].pid, signal.SIGKILL)
        fired.wait(30)
        latencies.append(time.monotonic() - start if fired.is_set() else float("inf"))
        remove()
        session.down(f"victim{i}")
    return {"detection_s": latencies, "median_s": statistics.median(latencies), "max_s": max(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with monarch_nb.Session() as session:
        calls = bench_calls(session, args.procs, args.rounds)
        detection = bench_detection(session, args.kills)
    print(f"no-op call latency over {args.rounds} interleaved rounds, {args.procs} actors (ms)")
    print(f"{'path':<14}{'median':>10}{'p99':>10}")
    for name in ("raw_call", "nb_call", "raw_call_one", "nb_call_one"):
        print(f"{name:<14}{calls[name]['median_ms']:>10.3f}{calls[name]['p99_ms']:>10.3f}")
    print(f"controller/raw ratio: call {calls['ratio_call']:.2f}x, call_one {calls['ratio_call_one']:.2f}x")
    print(f"failure detection after SIGKILL ({args.kills} kills): median {detection['median_s']:.3f} s, "
          f"max {detection['max_s']:.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": calls, "detection": detection}, f, indent=2)


if __name__ == "__main__":
    main()
