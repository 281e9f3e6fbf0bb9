"""The control plane from 2 to 32 replica groups: what a failure costs, and what the controller
and the dashboard cost while training, against the number of groups R, in one invocation.

For each R in --groups, one peer-recovery run (torchtitan's Llama 3 ``tiny`` flavour, one
process per group, one warm spare) with a dashboard attached in this process:

* start: ``FTRun.start()`` until every group trains (groups start in parallel); RSS and PSS
  of each worker, and each worker's CPU-seconds to get there;
* a quiet training window: median step, the controller's CPU (this process minus the
  dashboard's threads) and the Lighthouse's, as a fraction of one core, events/s, the
  dashboard's CPU, and the CPU-seconds one step costs one group;
* faults, one at a time, each waited out: ``kill`` while a spare is ready, ``comms`` at once
  after (the recovery ladder repairs it in place, rung ``communicator``; each record names the
  rung that fixed its fault), then (not with --quick) after the
  spare is ready again ``comms`` with it and ``kill`` without. Whether a spare served is read
  from the recovery's ``acquired`` event, not assumed. Per recovery: detection, the survivors'
  longest stall (seconds and median steps), the victim back (fault -> first committed step),
  the heal; and its cost in CPU-seconds: every worker's and the controller's CPU over the
  recovery, per group, beside the box's busy fraction (on this 2-core box all R groups and
  the controller share two cores, so wall seconds grow with R for reasons a cluster with a
  node per group would not have; CPU-seconds per group do not).

and for R <= --restart-max, the same failure with ``on_failure="restart"`` (every group restarts
from the last durable checkpoint; ``back_s`` is the time until every group committed again).

``--communicators gloo,subprocess`` measures the peer runs once with each cross-group communicator:
gloo in the worker (today's) and torchft's ProcessGroupBabyGloo (``pg_subprocess``: gloo in a
subprocess, which an abort kills). Each record and run says which; ``communicators`` in the JSON
compares them per R (the comms fault's victim back and the survivors' stall) and says whether the
subprocess won at every R. A run that could not start or recover is kept in ``failures``.

Writes ``{"records": [...], "runs": [...], "parallel_on_a_cluster": {...}, ...}`` and one PNG
per figure against R beside the JSON.

Usage: python bench/bench_scale.py --groups 2,4,8,16,32 --out bench/results/scale.json [--quick]
       [--communicators gloo,subprocess]
       [--job slurm]   (the cluster needs R + 1 one-CPU slots: MONARCH_NB_SLURM_CPUS, see README)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import monarch_nb  # noqa: E402,F401  (first: Monarch's supervision settings)
from monarch_nb.ft import FTRun, RunConfig  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")

# What a cluster with one node per group does in parallel, and what it does not (the note in
# the JSON); on this box every item below shares the same two cores.
PARALLEL_ON_A_CLUSTER = {
    "start": "each group's process start, imports and model build run on its own node; only the "
             "controller's calls (ms each) and the Lighthouse's first quorum are shared",
    "step": "each group's forward/backward on its own node; the cross-group allreduce and the "
            "Lighthouse quorum are the shared parts",
    "recovery": "the victim's respawn, build and heal run on its node (and the donor's); survivors "
                "only wait for the quorum without the victim (heartbeat timeout) and for the heal "
                "to be served by one of them",
    "controller": "one process for every R: its per-group polls are the part that grows with R",
}


@dataclass
class Record:
    """One failure at one R (the JSON's ``records``; field names as the issue asks)."""

    groups: int
    kind: str
    spare: bool
    mode: str  # "peer" or "restart"
    detect_s: float | None
    stall_steps: float | None
    stall_s: float | None
    back_s: float | None
    heal_s: float | None
    controller_cpu: float  # while training, fraction of one core (the run's window)
    dashboard_cpu: float
    rss_mb_per_group: float
    pss_mb_per_group: float
    start_s: float
    step_s: float
    cpu_s_per_group: float | None  # every worker's + the controller's CPU over the recovery / R
    victim_cpu_s: float | None  # the victim's new process: CPU-seconds from its start to its rejoin
    box_busy: float | None  # fraction of the box's CPUs busy during the recovery
    acquired_how: str | None
    heal_MB: float | None
    rung: str | None = None  # the recovery ladder's rung that fixed it (communicator, process, ...)
    communicator: str = "gloo"  # the cross-group communicator: "gloo" (in the worker) or "subprocess"


# ---- /proc readings -----------------------------------------------------------------------


def cpu_s(pid: int) -> float | None:
    """User + system CPU-seconds of a live process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB: PSS splits the shared libraries' pages between the processes mapping them."""
    out = {"Rss": 0.0, "Pss": 0.0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in out:
                out[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out["Rss"], out["Pss"]


def box_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def worker_pids(run: FTRun) -> dict[int, list[int]]:
    return {g.index: list(g.pids) for g in run.groups}


def total_cpu(pids: list[int]) -> float:
    return sum(c for c in (cpu_s(p) for p in pids) if c is not None)


# ---- one run ------------------------------------------------------------------------------


def check_slurm_slots(needed: int) -> None:
    """A clear error before a start that SLURM could not place: R + spares one-CPU allocations."""
    import subprocess

    out = subprocess.run(["sinfo", "-h", "-o", "%C"], capture_output=True, text=True, timeout=30).stdout.split()
    idle = int(out[0].split("/")[1]) if out else 0
    if idle < needed:
        raise SystemExit(f"--job slurm: the cluster has {idle} idle CPUs, the run needs {needed} one-CPU allocations; "
                         f"restart it with more CPUs per virtual node: ./run.sh slurm down && "
                         f"MONARCH_NB_SLURM_CPUS={(needed + 1) // 2} ./run.sh slurm up")


def start_run(replicas: int, mode: str, job: str, spares: int, checkpoint_every: int | None = None,
              communicator: str = "gloo", start_timeout: float = 900.0) -> tuple[FTRun, float]:
    if job == "slurm":
        check_slurm_slots(replicas + spares)
    cfg = RunConfig(replicas=replicas, model="tiny", job=job, spares=spares, on_failure=mode,
                    checkpoint_every=10 if mode == "restart" else checkpoint_every, init_timeout_s=start_timeout,
                    pg_subprocess=communicator == "subprocess",
                    run_name=f"scale-{mode}-{communicator}-r{replicas}-{time.strftime('%H%M%S')}")
    run = FTRun(cfg)
    t0 = time.monotonic()
    try:
        run.start(timeout=start_timeout)
    except BaseException:
        run.stop("it did not start")
        raise
    return run, time.monotonic() - t0


def training_window(run: FTRun, dash: Any, seconds: float) -> dict[str, float]:
    """Controller, Lighthouse and dashboard CPU, events/s and the step while nothing fails."""
    pids = [p for ps in worker_pids(run).values() for p in ps]
    lh = run.lighthouse.pid if run.lighthouse else None
    reaper = getattr(getattr(getattr(run._session, "_reaper", None), "_proc", None), "pid", None)
    w0, l0, r0 = total_cpu(pids), cpu_s(lh) if lh else 0.0, (cpu_s(reaper) or 0.0) if reaper else 0.0
    d0 = dash.stats.flusher_cpu_s + dash.stats.observer_cpu_s
    c0, n0, t0, wall0 = time.process_time(), len(run.events), time.time(), time.monotonic()
    time.sleep(seconds)  # the measured window itself: nothing to wait for, the run trains on
    wall = time.monotonic() - wall0
    dash_cpu = dash.stats.flusher_cpu_s + dash.stats.observer_cpu_s - d0
    steps = [e for e in run.history().steps(0) if e.t >= t0]
    gaps = [b.t - a.t for a, b in zip(steps, steps[1:])]
    step_s = statistics.median(gaps) if gaps else float("nan")
    worker_cpu = total_cpu(pids) - w0
    return {"controller_cpu": (time.process_time() - c0 - dash_cpu) / wall, "dashboard_cpu": dash_cpu / wall,
            "lighthouse_cpu": ((cpu_s(lh) or 0.0) - (l0 or 0.0)) / wall if lh else None,
            "reaper_cpu": ((cpu_s(reaper) or 0.0) - r0) / wall if reaper else None,
            "events_per_s": (len(run.events) - n0) / wall, "step_s": step_s,
            "steps_in_window": len(steps),
            "step_cpu_s_per_group": worker_cpu / len(pids) / len(steps) if steps else None}


def wait_spare_ready(run: FTRun, timeout: float = 600.0) -> bool:
    pool = run.supervisor.spares if run.supervisor else None
    if pool is None:
        return False
    run.wait_for(lambda e: e.kind == "spare_state" and e.state == "ready" and pool.ready() > 0, timeout=timeout,
                 what="a ready warm spare")
    return True


def one_failure(run: FTRun, kind: str, victim: int, mode: str, timeout: float = 600.0
                ) -> tuple[Any, dict[str, float | None]]:
    """Inject ``kind`` into ``victim`` and wait out the recovery; returns it and its CPU cost."""
    pids = worker_pids(run)
    before = {p: cpu_s(p) for ps in pids.values() for p in ps}
    c0, b0 = time.process_time(), box_ticks()
    since = time.time()
    run.inject(kind, replica=victim)
    if mode == "peer":
        run.wait_for(lambda e: e.kind == "rejoined" and e.replica == victim, timeout=timeout, since=since)
    else:
        run.wait_for(lambda e: e.kind == "restarted_from_checkpoint", timeout=900, since=since)
        for r in range(len(list(run.groups))):
            run.wait_for(lambda e, r=r: e.kind == "rejoined" and e.replica == r, timeout=600, since=since)
    controller = time.process_time() - c0
    b1 = box_ticks()
    new = worker_pids(run)
    workers = 0.0
    for ps in new.values():
        for p in ps:
            now = cpu_s(p) or 0.0
            workers += now - before[p] if before.get(p) is not None else now  # a new process: all its CPU
    victim_cpu = sum(cpu_s(p) or 0.0 for p in new[victim] if p not in before) or None
    # the survivors' figures need commits after the rejoin: wait two more steps of the run
    run.wait_for_step(max(g.step for g in run.groups) + 2, timeout=timeout)
    rec = next(r for r in reversed(run.history().recoveries()) if r.replica == victim and (r.start_t or 0) >= since - 1)
    cost = {"cpu_s_per_group": (workers + controller) / len(new), "victim_cpu_s": victim_cpu,
            "box_busy": (b1[0] - b0[0]) / max(1, b1[1] - b0[1])}
    return rec, cost


def measure(replicas: int, mode: str, job: str, quick: bool, window_s: float,
            checkpoint_every: int | None = None, communicator: str = "gloo",
            start_timeout: float = 900.0, faults: tuple[str, ...] | None = None,
            fault_timeout: float = 600.0) -> tuple[list[Record], dict]:
    from monarch_nb.notebook.dashboard import Dashboard

    spares = 1 if mode == "peer" else 0
    run, start_s = start_run(replicas, mode, job, spares, checkpoint_every, communicator, start_timeout)
    dash = Dashboard(run.events, controls=run)
    records: list[Record] = []
    try:
        start_cpu = [cpu_s(p) for ps in worker_pids(run).values() for p in ps]
        if mode == "restart":
            run.wait_for(lambda e: e.kind == "checkpoint_saved", timeout=600)
        else:
            wait_spare_ready(run)
            run.wait_for_step(5, timeout=600)
        mem = [memory_mb(p) for ps in worker_pids(run).values() for p in ps]
        window = training_window(run, dash, window_s)
        plan = [("kill", "ready"), ("comms", "now")] if mode == "peer" else [("kill", "now")]
        if mode == "peer" and not quick:
            plan += [("comms", "ready"), ("kill", "now")]
        if faults:  # only these kinds, in this order
            plan = [(k, "ready" if k == "kill" and mode == "peer" else "now") for k in faults]
        unrecovered: list[dict] = []
        for n, (kind, when) in enumerate(plan):
            if when == "ready":
                wait_spare_ready(run)
            victim = 1 + n % (replicas - 1)
            try:
                rec, cost = one_failure(run, kind, victim, mode, fault_timeout)
            except TimeoutError as exc:  # kept as a failure of this fault; the run is not trusted after it
                unrecovered.append({"kind": kind, "error": f"not recovered in {fault_timeout:g} s: "
                                                          f"{str(exc).splitlines()[0][:300]}"})
                print(f"R={replicas} {communicator} {kind}: NOT RECOVERED in {fault_timeout:g} s", flush=True)
                break
            stall_s = rec.survivor_stall_s if mode == "peer" else rec.total_s
            records.append(Record(
                groups=replicas, kind=kind, spare=rec.acquired_how == "spare", mode=mode,
                detect_s=rec.detection_s, stall_s=stall_s,
                stall_steps=(rec.survivor_stall_steps if mode == "peer"
                             else (stall_s / window["step_s"] if stall_s else None)),
                back_s=rec.total_s, heal_s=rec.heal_s, controller_cpu=window["controller_cpu"],
                dashboard_cpu=window["dashboard_cpu"],
                rss_mb_per_group=statistics.mean(m[0] for m in mem), pss_mb_per_group=statistics.mean(m[1] for m in mem),
                start_s=start_s, step_s=window["step_s"], acquired_how=rec.acquired_how,
                heal_MB=rec.heal_bytes / 1e6 if rec.heal_bytes else None, rung=rec.rung,
                communicator=communicator, **cost))
            print(f"R={replicas:<3} {mode:<7} {communicator:<10} {kind:<5} rung={rec.rung} "
                  f"spare={records[-1].spare!s:<5} detect={rec.detection_s}"
                  f" stall={stall_s} back={rec.total_s} heal={rec.heal_s} cpu/group={cost['cpu_s_per_group']:.2f}",
                  flush=True)
        # one check across every group after the last recovery (the rejoins' own checks may have
        # been overtaken by the next fault)
        final = None
        if mode == "peer" and not unrecovered:
            try:
                final = run.check_identical(timeout=300)
            except TimeoutError as exc:  # recorded as no verdict: the figures above still count
                print(f"R={replicas}: no final identity verdict: {str(exc).splitlines()[0]}", flush=True)
        history = run.history()
        checks = history.identity_checks()
        summary = {"groups": replicas, "mode": mode, "communicator": communicator, "start_s": start_s,
                   "unrecovered": unrecovered,
                   "identity_checks": len(checks), "all_identical": all(c.identical for c in checks),
                   "final_identical": None if final is None else final.identical,
                   "final_identity_groups": None if final is None else len({k.split("/")[0] for k in final.hashes}),
                   "checkpoints_saved": len(run.events.events("checkpoint_saved")),
                   # heals beyond one per fault: groups dropped from a quorum (a starved box) catching up
                   "healed_events": len(run.events.events("healed")),
                   "needless_heals": sum(1 for e in run.events.events("healed") if e.needless),
                   "join_timeout_ms": next((e.join_timeout_ms for e in run.events.events("lighthouse_started")), None),
                   "faults": len(run.events.events("fault_injected")),
                   "start_cpu_s_per_group": statistics.mean(c for c in start_cpu if c is not None),
                   "rss_mb_per_group": statistics.mean(m[0] for m in mem),
                   "pss_mb_per_group": statistics.mean(m[1] for m in mem), **window}
    finally:
        dash.close(final_flush=False)
        run.stop()
    return records, summary


# ---- figures ------------------------------------------------------------------------------

FIGURES = {
    "recovery": ("seconds", [("detect_s", "detection"), ("stall_s", "survivor stall"), ("back_s", "victim back"),
                             ("heal_s", "heal")]),
    "stall_steps": ("median steps", [("stall_steps", "survivor stall")]),
    "cpu": ("CPU-seconds per group", [("cpu_s_per_group", "recovery, all processes / R"),
                                      ("victim_cpu_s", "victim's new process")]),
}
RUN_FIGURES = {
    "control_plane": ("fraction of one core", [("controller_cpu", "controller"), ("dashboard_cpu", "dashboard"),
                                               ("lighthouse_cpu", "Lighthouse"), ("reaper_cpu", "orphan reaper")]),
    "start_step": ("seconds", [("start_s", "start (all groups training)"), ("step_s", "median step")]),
    "memory": ("MB per group", [("rss_mb_per_group", "RSS"), ("pss_mb_per_group", "PSS")]),
}


def plot(records: list[dict], runs: list[dict], out: Path) -> list[str]:
    from matplotlib.figure import Figure

    written = []
    for name, (ylabel, series) in {**FIGURES, **RUN_FIGURES}.items():
        rows = records if name in FIGURES else runs
        fig = Figure(figsize=(7, 4), dpi=100)
        ax = fig.subplots()
        for key, label in series:
            for mode, comm, style in (("peer", "gloo", "o-"), ("restart", "gloo", "s--"),
                                      ("peer", "subprocess", "^:")):
                groups_of = {}
                for r in rows:
                    if r["mode"] == mode and r.get("communicator", "gloo") == comm and r.get(key) is not None:
                        groups_of.setdefault(r["groups"], []).append(r[key])
                if groups_of:
                    xs = sorted(groups_of)
                    tag = mode if comm == "gloo" else f"{mode}, gloo in a subprocess"
                    ax.plot(xs, [statistics.median(groups_of[x]) for x in xs], style,
                            label=f"{label} ({tag})" if name in FIGURES or mode == "restart" or comm != "gloo"
                            else label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replica groups R")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name.replace('_', ' ')} against R (2-core box)", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out.with_name(f"{out.stem}-{name}.png")
        fig.savefig(path)
        written.append(str(path))
    return written


def compare_communicators(records: list[dict], failures: list[dict]) -> dict[str, Any]:
    """Per R, the comms fault (the communicator rung's fault) with each communicator: medians of the
    victim back and the survivors' stall; ``subprocess_wins``: faster back and no longer stall at
    every R measured with both, and no subprocess run that failed (None: nothing to compare)."""
    per: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["mode"] == "peer" and r["kind"] == "comms":
            cell = per.setdefault(str(r["groups"]), {}).setdefault(r.get("communicator", "gloo"),
                                                                  {"back_s": [], "stall_steps": [], "rungs": []})
            cell["back_s"].append(r["back_s"])
            cell["stall_steps"].append(r["stall_steps"])
            cell["rungs"].append(r["rung"])

    def med(xs: list[float | None]) -> float | None:
        known = [x for x in xs if x is not None]
        return statistics.median(known) if known else None

    table = {g: {c: {"back_s": med(v["back_s"]), "stall_steps": med(v["stall_steps"]), "rungs": v["rungs"]}
                 for c, v in by.items()} for g, by in sorted(per.items(), key=lambda kv: int(kv[0]))}
    both = [t for t in table.values() if {"gloo", "subprocess"} <= set(t)]
    failed = [f for f in failures if f.get("communicator") == "subprocess"]
    wins = None
    if both or failed:
        wins = not failed and all(
            t["subprocess"]["back_s"] is not None and t["gloo"]["back_s"] is not None
            and t["subprocess"]["back_s"] < t["gloo"]["back_s"]
            and (t["subprocess"]["stall_steps"] or 0.0) <= (t["gloo"]["stall_steps"] or 0.0) for t in both)
    return {"comms_fault_by_groups": table, "subprocess_failures": len(failed), "subprocess_wins": wins}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default="2,4,8,16,32")
    p.add_argument("--restart-max", type=int, default=16, help="restart mode for R up to this")
    p.add_argument("--quick", action="store_true",
                   help="two faults per R (kill with a spare, comms without), restart mode for R <= 8, 8 s windows")
    p.add_argument("--window-s", type=float, default=15.0, help="the quiet training window measured at each R")
    p.add_argument("--job", default="local", choices=("local", "slurm"))
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="durable checkpoints in the peer runs too (restart runs save every 10 steps)")
    p.add_argument("--communicators", default="gloo",
                   help="cross-group communicators to compare: gloo (in the worker), subprocess (ProcessGroupBabyGloo)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds a run may take to start")
    p.add_argument("--faults", default=None, help="only these fault kinds, in order (e.g. comms,kill)")
    p.add_argument("--fault-timeout", type=float, default=600.0, help="seconds a fault may take to recover")
    p.add_argument("--merge", help="a JSON this script wrote: its records and runs for the other R are kept")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    groups = [int(g) for g in a.groups.split(",")]
    communicators = a.communicators.split(",")
    if set(communicators) - {"gloo", "subprocess"}:
        p.error(f"--communicators: {a.communicators!r}; allowed: gloo, subprocess (comma-separated)")
    restart_max = min(a.restart_max, 8) if a.quick else a.restart_max
    window_s = min(a.window_s, 8.0) if a.quick else a.window_s
    t0 = time.monotonic()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    base = json.loads(Path(a.merge).read_text()) if a.merge else {"records": [], "runs": [], "seconds": 0.0}
    kept = lambda rows: [r for r in rows if r["groups"] not in groups]  # noqa: E731
    rows: list[dict] = []
    runs: list[dict] = []
    failures: list[dict] = []

    def write() -> dict:
        """After every R: what was measured so far survives a later crash."""
        result = {"command": command + (f" (merged with {base['command']})" if a.merge else ""),
                  "job": a.job, "model": "tiny", "cpus": os.cpu_count(),
                  "seconds": time.monotonic() - t0 + (base["seconds"] if a.merge else 0.0),
                  "records": sorted(kept(base["records"]) + rows, key=lambda r: (r["mode"], r["groups"])),
                  "runs": sorted(kept(base["runs"]) + runs, key=lambda r: (r["mode"], r["groups"])),
                  "failures": kept(base.get("failures", [])) + failures,
                  "parallel_on_a_cluster": PARALLEL_ON_A_CLUSTER}
        out.write_text(json.dumps(result, indent=1, default=str))
        return result

    for replicas in groups:
        for communicator in communicators:
            for mode in ("peer", "restart"):
                if mode == "restart" and (replicas > restart_max or communicator != "gloo"):
                    continue
                try:
                    recs, summary = measure(replicas, mode, a.job, a.quick, window_s, a.checkpoint_every,
                                            communicator, a.start_timeout,
                                            tuple(a.faults.split(",")) if a.faults else None, a.fault_timeout)
                except Exception as exc:  # noqa: BLE001 - kept in the JSON; the other runs still count
                    failures.append({"groups": replicas, "mode": mode, "communicator": communicator,
                                     "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
                    print(f"R={replicas} {mode} {communicator}: FAILED {failures[-1]['error']}", flush=True)
                    write()
                    continue
                rows += [asdict(r) for r in recs]
                runs.append(summary)
                failures += [{"groups": replicas, "mode": mode, "communicator": communicator, **u}
                             for u in summary["unrecovered"]]
                print(json.dumps(summary), flush=True)
                write()
    result = write()
    if len(communicators) > 1:
        result["communicators"] = compare_communicators(result["records"], result["failures"])
        print(json.dumps(result["communicators"]), flush=True)
    result["figures"] = plot(result["records"], result["runs"], out)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out} and {len(result['figures'])} PNGs in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
