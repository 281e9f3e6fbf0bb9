"""What the live dashboard costs: iopub messages per second and controller CPU share.

Starts a real Jupyter kernel (jupyter_client), displays a Dashboard in it and lets a run with
injected faults go on while no cell executes, exactly as in a notebook. The client side counts
every iopub message the kernel publishes (what the Jupyter server relays, and drops above
1000 msg/s); the kernel side reports the CPU time of the dashboard's flusher thread and store
observer, and of the whole kernel process, against wall time. The same run without a
dashboard gives the baseline.

Scenarios: ``synthetic`` (scripted telemetry at a training-like rate), ``stress`` (thousands
of events per second: throttling must hold the message rate), ``real`` (an FTRun: torchtitan
replicas in Monarch actors with kills, minutes on a small CPU box).

    python bench/bench_dashboard.py                 # synthetic + stress, with and without UI
    python bench/bench_dashboard.py --real --seconds 60
    python bench/bench_dashboard.py --groups 2,8,16,32 --label after --json bench/results/dashboard_scale.json

``--groups`` measures only the dashboard at each number of replica groups (synthetic run, group
size 1, a training-like step rate, ``--faults`` kills with overlapping recoveries) and writes one
row per R: UI CPU share, iopub msgs/s, frames and CPU per panel. With ``--label`` the JSON file
keeps the rows of other labels (e.g. ``before``/``after`` a change) and replaces this label's.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SETUP_SYNTHETIC = """
from monarch_nb.notebook.synthetic_run import SyntheticRun
run = SyntheticRun(replicas={replicas}, group_size={group_size}, step_hz={step_hz}, phase_s={phase_s})
run.start()
def _inject(i):
    run.inject("kill", replica=i % {replicas})
"""

SETUP_REAL = """
from monarch_nb.ft.control.run import FTRun
from monarch_nb.ft.settings.config import RunConfig
run = FTRun(RunConfig(replicas={replicas}, group_size={group_size}))
run.start()
def _inject(i):
    run.inject("kill", replica=i % {replicas})
"""

# Runs in the kernel, then returns: faults are injected by a background thread, so during the
# measured window no cell executes.
START = """
import threading, time, json
from IPython.display import display
{setup}
_dash = None
if {with_dash}:
    from monarch_nb.notebook.dashboard import Dashboard
    _dash = Dashboard(run.events, controls=run)
    display(_dash)
_t0, _c0 = time.monotonic(), time.process_time()
_n0 = len(run.events)
if _dash is not None:  # what the dashboard cost before the window (history, first frames)
    _s0 = (_dash.stats.flusher_cpu_s, _dash.stats.observer_cpu_s, dict(_dash.stats.renders),
           dict(_dash.stats.cpu_s), _dash.stats.total_messages)
def _faults():
    period = {seconds} / ({faults} + 1)
    for i in range({faults}):
        time.sleep(period)
        try:
            _inject(i)
        except Exception as e:
            print("inject failed:", e)
threading.Thread(target=_faults, daemon=True).start()
"""

FINISH = """
_wall, _cpu = time.monotonic() - _t0, time.process_time() - _c0
_events = len(run.events) - _n0
_res = dict(wall=_wall, kernel_cpu=_cpu, events=_events,
            recoveries=sum(1 for e in run.events if e.kind == "rejoined"))
if _dash is not None:
    s = _dash.stats
    _res.update(flusher_cpu=s.flusher_cpu_s - _s0[0], observer_cpu=s.observer_cpu_s - _s0[1],
                widget_msgs=s.total_messages - _s0[4],
                plot_render_ms=1000 * s.plot_render_s, plot_interval_s=s.plot_interval_s,
                overhead_share=getattr(s, "overhead_share", None),
                panel_cpu={p: v - _s0[3][p] for p, v in s.cpu_s.items()},
                renders={p: v - _s0[2][p] for p, v in s.renders.items()})
    _dash.close(final_flush=False)
run.stop()
print("BENCH " + json.dumps(_res))
"""


def _drain(kc, msg_id: str, timeout: float) -> tuple[list[dict], str]:
    """Run until the execute_request ``msg_id`` finished; returns its iopub messages and stdout."""
    out, msgs = [], []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("kernel did not finish the cell") from None
        msgs.append(msg)
        if msg["parent_header"].get("msg_id") == msg_id:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise RuntimeError("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return msgs, "".join(out)


def measure(scenario: str, *, with_dash: bool, seconds: float, faults: int, **params) -> dict:
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("MONARCH_NB_RUNS", str(REPO / "runs" / "bench"))
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(REPO))
    try:
        setup = (SETUP_REAL if scenario == "real" else SETUP_SYNTHETIC).format(**params)
        code = START.format(setup=textwrap.dedent(setup), with_dash=with_dash, seconds=seconds, faults=faults)
        _drain(kc, kc.execute(code), timeout=600)
        # The measured window: no cell runs; count everything the kernel publishes.
        t0 = time.monotonic()
        per_second: Counter[int] = Counter()
        kinds: Counter[str] = Counter()
        nbytes = 0
        while (now := time.monotonic()) - t0 < seconds:
            try:
                msg = kc.get_iopub_msg(timeout=max(0.05, seconds - (now - t0)))
            except queue.Empty:
                continue
            per_second[int(time.monotonic() - t0)] += 1
            kinds[msg["msg_type"]] += 1
            nbytes += len(json.dumps(msg["content"], default=str)) + sum(len(b) for b in msg.get("buffers", []))
        _, out = _drain(kc, kc.execute(FINISH), timeout=120)
        res = json.loads(out.split("BENCH ", 1)[1].splitlines()[0])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    total = sum(per_second.values())
    res.update(scenario=scenario, dashboard=with_dash, window_s=seconds, iopub_msgs=total,
               iopub_per_s=total / seconds, iopub_peak_1s=max(per_second.values(), default=0),
               comm_msgs=kinds.get("comm_msg", 0), iopub_kb_per_s=nbytes / seconds / 1024,
               events_per_s=res["events"] / res["wall"])
    return res


def _commit() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "monarch_nb", "bench"],
                               cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def scale(groups: list[int], *, seconds: float, faults: int, step_hz: float, phase_s: float,
          label: str | None) -> list[dict]:
    """The dashboard alone at each R: one row per number of replica groups (see module doc)."""
    rows = []
    commit = _commit()
    for replicas in groups:
        print(f"measuring the dashboard at {replicas} groups ...", file=sys.stderr, flush=True)
        r = measure("synthetic", with_dash=True, seconds=seconds, faults=faults, replicas=replicas,
                    group_size=1, step_hz=step_hz, phase_s=phase_s)
        wall = r["wall"]
        rows.append(dict(
            label=label, commit=commit, replicas=replicas, group_size=1, step_hz=step_hz, phase_s=phase_s,
            faults=faults, recoveries=r["recoveries"], window_s=seconds, wall_s=round(wall, 2),
            events_per_s=round(r["events_per_s"], 1),
            ui_cpu_pct=round(100 * (r["flusher_cpu"] + r["observer_cpu"]) / wall, 3),
            flusher_cpu_pct=round(100 * r["flusher_cpu"] / wall, 3),
            observer_cpu_pct=round(100 * r["observer_cpu"] / wall, 3),
            kernel_cpu_pct=round(100 * r["kernel_cpu"] / wall, 2),
            iopub_per_s=round(r["iopub_per_s"], 2), iopub_peak_1s=r["iopub_peak_1s"],
            iopub_kb_per_s=round(r["iopub_kb_per_s"], 1),
            renders_per_s={p: round(n / wall, 2) for p, n in r["renders"].items()},
            ms_per_render={p: round(1000 * r["panel_cpu"][p] / n, 3) if n else None
                           for p, n in r["renders"].items()},
            plot_interval_s=round(r["plot_interval_s"], 2),
            outside_frames_pct=None if r["overhead_share"] is None else round(100 * r["overhead_share"], 3)))
    return rows


def _print_scale(rows: list[dict]) -> None:
    head = (f"{'R':>3} {'events/s':>9} {'UI CPU':>7} {'observer':>8} {'iopub/s':>8} "
            f"{'health ms':>9} {'health/s':>8} {'plot ms':>8} {'plot/s':>7} {'timeline ms':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        ms, hz = r["ms_per_render"], r["renders_per_s"]
        print(f"{r['replicas']:>3} {r['events_per_s']:>9.1f} {r['ui_cpu_pct']:>6.2f}% {r['observer_cpu_pct']:>7.2f}% "
              f"{r['iopub_per_s']:>8.1f} {ms['health'] or 0:>9.2f} {hz['health']:>8.2f} {ms['plot'] or 0:>8.1f} "
              f"{hz['plot']:>7.2f} {ms['timeline'] or 0:>11.2f}")
    print("\nUI CPU = dashboard flusher thread + store observer CPU time / wall time, % of one core.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per scenario")
    ap.add_argument("--faults", type=int, default=3, help="kills injected during the window")
    ap.add_argument("--real", action="store_true", help="also measure a real FTRun (slow)")
    ap.add_argument("--only-real", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--groups", help="comma-separated numbers of replica groups: the dashboard's cost per R only")
    ap.add_argument("--step-hz", type=float, default=3.0, help="steps/s per group with --groups")
    ap.add_argument("--phase-s", type=float, default=3.0, help="recovery phase scale with --groups")
    ap.add_argument("--label", help="with --groups and --json: keep other labels' rows in the file")
    args = ap.parse_args()

    if args.groups:
        groups = [int(g) for g in args.groups.split(",")]
        rows = scale(groups, seconds=args.seconds, faults=args.faults, step_hz=args.step_hz,
                     phase_s=args.phase_s, label=args.label)
        _print_scale(rows)
        if args.json:
            keep = []
            if args.label and args.json.exists():
                keep = [r for r in json.loads(args.json.read_text()) if r.get("label") != args.label]
            args.json.write_text(json.dumps(keep + rows, indent=2) + "\n")
        return

    scenarios = []
    if not args.only_real:
        scenarios += [("synthetic", dict(replicas=3, group_size=2, step_hz=5, phase_s=1.0)),
                      ("stress", dict(replicas=4, group_size=2, step_hz=250, phase_s=1.0))]
    if args.real or args.only_real:
        scenarios.append(("real", dict(replicas=3, group_size=1)))
    rows = []
    for name, params in scenarios:
        for with_dash in (False, True):
            print(f"measuring {name} {'with' if with_dash else 'without'} dashboard ...", file=sys.stderr, flush=True)
            rows.append(measure(name, with_dash=with_dash, seconds=args.seconds, faults=args.faults, **params))

    head = (f"{'scenario':<10} {'UI':<4} {'events/s':>9} {'iopub/s':>8} {'peak 1s':>8} {'comm/s':>7} "
            f"{'KB/s':>7} {'kernel CPU':>10} {'UI CPU':>7} {'plot ms':>8} {'plot every':>10} {'recovered':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        ui = (r.get("flusher_cpu", 0.0) + r.get("observer_cpu", 0.0)) / r["wall"]
        print(f"{r['scenario']:<10} {'yes' if r['dashboard'] else 'no':<4} {r['events_per_s']:>9.1f} "
              f"{r['iopub_per_s']:>8.1f} {r['iopub_peak_1s']:>8d} {r['comm_msgs'] / r['window_s']:>7.1f} "
              f"{r['iopub_kb_per_s']:>7.1f} {100 * r['kernel_cpu'] / r['wall']:>9.1f}% "
              f"{(100 * ui if r['dashboard'] else 0):>6.2f}% "
              f"{r.get('plot_render_ms', 0):>8.1f} {r.get('plot_interval_s', 0):>9.1f}s {r['recoveries']:>9d}")
    print("\nUI CPU = dashboard flusher thread + store observer CPU time / wall time (kernel side).\n"
          "kernel CPU = whole kernel process (the controller) CPU time / wall time; compare with/without UI.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
