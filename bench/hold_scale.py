"""Does a run of R groups hold without faults? R tiny-flavour groups train for --watch-s seconds
after all of them committed step 3; every 5 s a sample of what could make the controller fail a
healthy group: polls sent and missed (no answer within their deadline), answer latency, the
groups' states, failures by detector, the controller's CPU and the box's load.

Written to find why 32 groups on this 2-core box were all failed as hung (answers took 0.5-0.7 s
against a fixed 0.5 s poll deadline: see ``supervisor.next_poll_deadline``). A run that holds
ends with every group training and no failure.

Usage: python bench/hold_scale.py --groups 32 --watch-s 150 --out bench/results/hold_32.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import monarch_nb  # noqa: E402,F401  (first: Monarch's supervision settings)
import psutil  # noqa: E402

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from monarch_nb.ft.control import supervisor as supervisor_module  # noqa: E402
from monarch_nb.telemetry.events import FailureDetected, Healed  # noqa: E402

SAMPLE_S = 5.0


def timed_polls() -> list[tuple[float, float, bool]]:
    """(unix time, seconds, missed) of every supervisor poll from now on."""
    polls: list[tuple[float, float, bool]] = []
    poll = supervisor_module.Supervisor.poll

    def timed(self, g, timeout):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        result = poll(self, g, timeout)
        polls.append((time.time(), time.monotonic() - t0, bool(result.missing)))
        return result

    supervisor_module.Supervisor.poll = timed
    return polls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--watch-s", type=float, default=150.0)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=None,
                   help="the Lighthouse's heartbeat timeout (default: RunConfig's rule)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    polls = timed_polls()
    me = psutil.Process()
    extra = {} if args.heartbeat_timeout_ms is None else {"heartbeat_timeout_ms": args.heartbeat_timeout_ms}
    run = FTRun(RunConfig(replicas=args.groups, model="tiny", **extra),
                run_name=f"hold{args.groups}-{time.strftime('%H%M%S')}")
    t0 = time.time()
    run.start()
    start_s = time.time() - t0
    run.wait_for_step(3, timeout=900)
    trained_s = time.time() - t0
    print(f"{args.groups} groups: started in {start_s:.0f} s, all at step 3 after {trained_s:.0f} s", flush=True)
    me.cpu_percent()
    samples = []
    watch_t0 = time.time()
    try:
        while time.time() < watch_t0 + args.watch_s:
            time.sleep(SAMPLE_S)
            now = time.time()
            recent = [(s, missed) for t, s, missed in polls if t >= now - SAMPLE_S]
            latencies = sorted(s for s, _ in recent)
            sample = {
                "t_s": round(now - watch_t0, 1),
                "controller_cpu": round(me.cpu_percent() / 100, 3),
                "polls": len(recent), "missed": sum(1 for _, m in recent if m),
                "poll_s_p50": round(latencies[len(latencies) // 2], 3) if latencies else None,
                "poll_s_max": round(latencies[-1], 3) if latencies else None,
                "step": max((g.step for g in run.groups), default=0),
                "states": dict(collections.Counter(g.state for g in run.groups)),
                "failures": dict(collections.Counter(e.source for e in run.events.events(FailureDetected)
                                                     if e.t >= watch_t0)),
                "load": round(os.getloadavg()[0], 1),
                # a heal with no fault: the group was left out of a quorum and caught up from a peer
                "healed": sum(1 for e in run.events.events(Healed) if e.t >= watch_t0),
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
    finally:
        stop = run.stop()
    last = samples[-1] if samples else {}
    out = {"groups": args.groups, "watch_s": args.watch_s, "heartbeat_timeout_ms": run.config.heartbeat_timeout_ms, "start_s": round(start_s, 1),
           "all_at_step_3_s": round(trained_s, 1), "stop_s": round(stop.seconds, 1),
           "held": bool(samples) and not last.get("failures") and last["states"] == {"training": args.groups},
           "samples": samples}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"held: {out['held']}; wrote {args.out}")


if __name__ == "__main__":
    main()
