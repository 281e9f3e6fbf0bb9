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
from monarch_nb.ft.run import FTRun
from monarch_nb.ft.config import RunConfig
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
    _res.update(flusher_cpu=s.flusher_cpu_s, observer_cpu=s.observer_cpu_s, widget_msgs=s.total_messages,
                plot_render_ms=1000 * s.plot_render_s, plot_interval_s=s.plot_interval_s,
                panel_cpu=dict(s.cpu_s), renders=dict(s.renders))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per scenario")
    ap.add_argument("--faults", type=int, default=3, help="kills injected during the window")
    ap.add_argument("--real", action="store_true", help="also measure a real FTRun (slow)")
    ap.add_argument("--only-real", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()

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
