"""Soak: many consecutive faults of every kind into one run, and whether it survived them alone.

Every ``--every`` seconds one fault goes to a random target: a random kind (``--kinds all``:
kill, segfault, exit, exception, comms, hang), one group; one time in five two groups at once;
one time in five the next fault is aimed at a group that is healing (mid-heal). Nobody
intervenes. At the end the run is stopped and the report says:

  survived       faults after which every group was training again before the next one
  goodput        committed steps per second over the soak, as a ratio to the run's first
                 fault-free minute (the same run, before the first fault)
  identical      identity checks that passed / ran
  event log      its size, and the largest count of one event kind
  processes      worker/Lighthouse processes of the run still alive after stop() (must be 0)

The recovery figures (recoveries, recovered, gave_up, median/max recovery time, identity checks,
event counts) come from the run's event log alone. ``--reread RUN_DIR --out FILE.json`` recomputes
them from RUN_DIR/events.jsonl with this checkout's recovery model (after the model changed) and
rewrites them in FILE.json, keeping what only the live run knew (faults sent, goodput, the final
identity check, processes left, shots), and says so in ``note``.

Not part of CI (minutes long). Usage:
  python bench/soak.py --faults 50 --every 8 --kinds all [--replicas 3] [--spares 1] [--out FILE.json]
  python bench/soak.py --reread runs/soak-RUN_ID --out FILE.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FaultKind, FTRun, RunConfig, open_run  # noqa: E402
from monarch_nb.ft.faults import CLUSTER_KINDS  # noqa: E402
from monarch_nb.ft.history import RunHistory  # noqa: E402
from monarch_nb.meshes import pid_alive  # noqa: E402


def log_fields(history: RunHistory, log: Path) -> dict:
    """The report's fields that the event log alone gives: the live run and --reread share them."""
    recoveries = history.recoveries()
    totals = sorted(r.total_s for r in recoveries if r.status == "recovered" and r.total_s is not None)
    return {
        "recoveries": len(recoveries),
        "recovered": sum(1 for r in recoveries if r.status == "recovered"),
        "gave_up": sum(1 for r in recoveries if r.gave_up),
        "identity": [(e.step, e.identical) for e in history.identity_checks()],
        "event_log_bytes": os.path.getsize(log),
        "events_by_kind": dict(collections.Counter(e.kind for e in history.events).most_common()),
        "median_total_s": totals[len(totals) // 2] if totals else None,
        "max_total_s": totals[-1] if totals else None,
    }


def reread(run_dir: str, out: Path) -> dict:
    """``out``'s report with the log's fields recomputed from ``run_dir``'s event log."""
    report = json.loads(out.read_text()) if out.exists() else {}
    history = open_run(run_dir)
    report.update(log_fields(history, history.events.path))
    report["survived_without_intervention"] = (report["recovered"] == report["recoveries"]
                                               and history.summary()["state"] == "stopped")
    report["run_dir"] = str(run_dir)
    report["note"] = (f"recoveries, recovered, gave_up, identity, event_log_bytes, events_by_kind, median_total_s, "
                      f"max_total_s and survived_without_intervention re-read from {history.events.path} by "
                      f"bench/soak.py --reread on {time.strftime('%Y-%m-%d')}; the other fields are the live run's")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--every", type=float, default=8.0, help="seconds between faults")
    p.add_argument("--kinds", default="all")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--warmup", type=float, default=30.0, help="fault-free seconds measured first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--reread", metavar="RUN_DIR", help="recompute the log's fields of --out from RUN_DIR; no run")
    a = p.parse_args(argv)
    if a.reread:
        if not a.out:
            p.error("--reread needs --out (the report to update)")
        report = reread(a.reread, Path(a.out))
        Path(a.out).write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if k not in ("shots", "identity")}, indent=1))
        return 0
    kinds = [k.value for k in FaultKind if k not in CLUSTER_KINDS] if a.kinds == "all" else a.kinds.split(",")
    rng = random.Random(a.seed)
    run = FTRun(RunConfig(replicas=a.replicas, spares=a.spares, hang_timeout_s=3.0,
                          run_name=f"soak-{time.strftime('%Y%m%d-%H%M%S')}"))
    shots: list[dict] = []
    try:
        run.start()
        t_warm = time.time()
        time.sleep(a.warmup)  # a measured fault-free interval, not a synchronisation
        steps_warm = max((e.step for e in run.history().steps()), default=0)
        base_rate = steps_warm / (time.time() - t_warm)
        t_soak = time.time()
        for n in range(a.faults):
            time.sleep(a.every)  # the fault schedule itself: one fault every `every` seconds
            status = {k: v for k, v in run.status().items() if isinstance(k, int)}
            training = [g for g, s in status.items() if s["state"] == "training"]
            healing = [g for g, s in status.items() if s["state"] == "healing"]
            shape = rng.random()
            if shape < 0.2 and healing:
                targets = [healing[0]]
                how = "mid-heal"
            elif shape < 0.4 and len(training) >= 3:
                targets = rng.sample(training, 2)
                how = "two at once"
            else:
                targets = [rng.choice(training)] if len(training) >= 2 else []
                how = "one"
            kind = rng.choice(kinds)
            sent = []
            for target in targets:
                try:
                    run.inject(kind, replica=target, hang_s=10.0)
                    sent.append(target)
                except Exception as exc:  # the target left training meanwhile: recorded, not fatal
                    shots.append({"n": n, "kind": kind, "targets": [target], "how": how, "refused": str(exc)})
            if sent:
                shots.append({"n": n, "kind": kind, "targets": sent, "how": how, "t": time.time()})
            print(f"[{n + 1}/{a.faults}] {kind} -> {sent or 'nobody (no eligible group)'} ({how})", flush=True)
        time.sleep(a.every)
        deadline = time.time() + 180
        while time.time() < deadline and any(s["state"] != "training" for k, s in run.status().items()
                                             if isinstance(k, int) and s["state"] != "gave_up"):
            time.sleep(0.5)
        t_end = time.time()
        steps_end = max((e.step for e in run.history().steps()), default=0)
        check = run.check_identical(timeout=120)
    finally:
        run.stop()
    from_log = log_fields(run.history(), run.run_dir / "events.jsonl")
    alive = [pid for pid in run.spawned_pids + [run.lighthouse_pid] if pid and pid_alive(pid)]
    soak_rate = (steps_end - steps_warm) / max(t_end - t_soak, 1e-9)
    report = {
        "faults_sent": sum(len(s.get("targets", [])) for s in shots if "refused" not in s),
        **from_log,
        "survived_without_intervention": from_log["recovered"] == from_log["recoveries"] and all(
            s["state"] == "stopped" for s in run.status().values()),
        "goodput_ratio": soak_rate / base_rate if base_rate else None,
        "final_identical": bool(check and check.identical),
        "processes_left": alive,
        "run_dir": str(run.run_dir), "args": vars(a), "shots": shots,
    }
    print(json.dumps({k: v for k, v in report.items() if k not in ("shots", "identity")}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0 if report["final_identical"] and not alive and report["gave_up"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
