"""Checkpoint-less (peer recovery) vs checkpoint-restart, measured side by side.

One invocation runs the same model, data and fault schedule several ways ("arms"), one after
the other on this machine, each until the same target step:

  no_faults        the reference: nothing injected
  peer             recovery="peer": a failed group heals from a live peer, the others train on
                   (durable checkpoints off)
  restart          recovery="restart": on any failure every group stops and all restart from
                   the newest durable checkpoint, taken every K steps with K from Young/Daly:
                   K = sqrt(2 * save_cost * MTBF) / step_time, save_cost measured (the step
                   stall of an asynchronous DCP save) and MTBF the fault period
  restart_fixed_k  the same with one common fixed K (--fixed-k, default 50)
  peer_spare       peer with one warm spare group (spares=1): the victim's replacement is
                   already built, so the respawn's imports and model build do not compete with
                   training for this machine's two cores at the moment of the fault

Faults: ``--kind`` (kill) into a rotating victim every ``--period`` seconds of wall time,
counted from the arm's first committed step - the same schedule for every arm. A fault that
falls due while the arm has no training group (a restart in progress) waits until one trains
again, so every arm receives the same number of faults per unit of training time (dropping
them would flatter the slower arm). Each arm uses torchtitan's own settings otherwise.

Per arm: goodput = target steps / wall time, as a ratio to no_faults; the same for committed
tokens (a step committed by fewer live groups trains on fewer tokens); steps lost and redone
(restart: the run's step minus the checkpoint's, per restart); faults; wall time to the
target. PNGs: loss against wall time for all arms, live groups over time. JSON: one record
per arm; copies go to bench/results/.

Usage:
  python bench/bench_goodput.py --out bench/results/goodput.json            # period 30 s
  python bench/bench_goodput.py --quick --out /tmp/goodput.json             # CI-sized (period 20 s)
  python bench/bench_goodput.py --sweep --out bench/results/goodput-sweep.json   # 10, 20, 30, 60 s
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402


def calibrate(a: argparse.Namespace) -> tuple[float, float]:
    """(median step time, median checkpoint stall) of this model on this machine."""
    run = FTRun(RunConfig(replicas=a.replicas, checkpoint_every=5, steps=None,
                          run_name=f"goodput-calibrate-{time.strftime('%H%M%S')}"))
    try:
        run.start()
        run.wait_for(lambda e: e.kind == "checkpoint_saved" and e.step >= 20, timeout=600)
    finally:
        run.stop()
    times = [e.t for e in run.history().steps(0)]
    step = statistics.median(b - x for x, b in zip(times, times[1:]))
    stall = statistics.median(e.stall for e in run.events.events("checkpoint_saved"))
    return step, stall


def young_daly_k(save_cost: float, mtbf: float, step_time: float) -> int:
    return max(1, round(math.sqrt(2 * save_cost * mtbf) / step_time))


def useful_tokens(steps: list, config: RunConfig, until_t: float) -> int:
    """Tokens of the committed group-steps up to ``until_t``, each (group, step) once: work a
    restart threw away and redid counts one time, and a step committed by fewer live groups
    counts fewer tokens."""
    done = {(e.replica, e.step) for e in steps if e.t <= until_t}
    return len(done) * config.seq_len * config.batch_size * config.group_size


def run_arm(arm: str, config: RunConfig, a: argparse.Namespace, period: float) -> dict:
    run = FTRun(config)
    faults: list[float] = []
    stop = threading.Event()

    def inject_on_schedule(t0: float) -> None:
        n = 0
        while not stop.is_set():
            due = t0 + (n + 1) * period
            if stop.wait(max(0.0, due - time.time())):
                return
            while not stop.is_set():  # a fault due while no group trains waits for one
                training = [g.index for g in run.groups if g.state == "training"]
                victim = n % a.replicas
                if victim in training and len(training) >= 1:
                    try:
                        run.inject(a.kind, replica=victim)
                        faults.append(time.time())
                        break
                    except Exception:
                        pass
                stop.wait(0.1)
            n += 1

    t_start = time.time()
    try:
        run.start()
        first = run.wait_for(lambda e: e.kind == "step" and e.committed, timeout=a.timeout)
        if arm != "no_faults":
            threading.Thread(target=inject_on_schedule, args=(first.t,), daemon=True).start()
        done = run.wait_for(lambda e: e.kind == "step" and e.committed and e.step >= a.target, timeout=a.timeout)
        stop.set()
    finally:
        stop.set()
        run.stop()
    history = run.history()
    steps = history.steps()
    wall = done.t - first.t
    tokens = useful_tokens(steps, config, done.t)
    lost = sum(e.lost_steps for e in run.events.events("restarted_from_checkpoint"))
    redone = sum(1 for e in run.events.events("resumed"))
    restarts = run.events.events("restarted_from_checkpoint")
    return {
        "arm": arm, "recovery": config.recovery, "checkpoint_every": config.checkpoint_every,
        "period_s": period if arm != "no_faults" else None, "target_step": a.target,
        "wall_s": wall, "faults": len(faults), "steps_lost": lost, "restarts": len(restarts),
        "resumes": redone, "tokens": tokens,
        "steps_per_s": a.target / wall,
        "checkpoint_stall_s": statistics.median([e.stall for e in run.events.events("checkpoint_saved")] or [0.0]),
        "checkpoints": len(run.events.events("checkpoint_saved")),
        "recoveries": [r.row() for r in history.recoveries()],
        "loss": [(e.t - first.t, e.step, e.loss) for e in steps if e.replica == 0],
        "live_groups": [(t - first.t, n) for t, n in history.live_groups()],
        "run_dir": str(run.run_dir),
    }


def plot(records: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    colours = {"no_faults": "#999999", "peer": "#0072B2", "restart": "#D55E00", "restart_fixed_k": "#E69F00",
               "peer_spare": "#009E73"}
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.subplots()
    for r in records:
        pts = [(t, loss) for t, _, loss in r["loss"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.1, color=colours.get(r["arm"]),
                label=f"{r['arm']} ({r['faults']} faults, {r['wall_s']:.0f} s)")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("committed loss (group 0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "-loss.png"))
    fig = Figure(figsize=(8, 3), dpi=100)
    ax = fig.subplots()
    for r in records:
        xs, ys = [], []
        for t, n in r["live_groups"]:
            if xs:
                xs.append(t)
                ys.append(ys[-1])
            xs.append(t)
            ys.append(n)
        ax.plot(xs, ys, lw=1.2, color=colours.get(r["arm"]), label=r["arm"])
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("groups training")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "-groups.png"))


def compare(a: argparse.Namespace, period: float, step_time: float, stall: float,
            reference: dict | None = None) -> list[dict]:
    """Every arm at one fault period; ``reference`` (a no_faults record) is reused when given."""
    base = dict(replicas=a.replicas, steps=None, seq_len=a.seq_len)
    k = young_daly_k(stall, period, step_time)
    arms = [("no_faults", RunConfig(**base)),
            ("peer", RunConfig(**base)),
            ("restart", RunConfig(**base, recovery="restart", checkpoint_every=k)),
            ("restart_fixed_k", RunConfig(**base, recovery="restart", checkpoint_every=a.fixed_k)),
            ("peer_spare", RunConfig(**base, spares=1))]
    if a.quick:
        arms = arms[:3]
    if reference is not None:
        arms = arms[1:]
    records = [dict(reference, reused=True)] if reference is not None else []
    for arm, cfg in arms:
        cfg = cfg.replace(run_name=f"goodput-{arm}-p{period:g}-{time.strftime('%H%M%S')}")
        rec = run_arm(arm, cfg, a, period)
        records.append(rec)
        print(f"[period {period:g} s] {arm:<16} {rec['wall_s']:7.1f} s to step {a.target}, {rec['faults']} faults, "
              f"{rec['steps_lost']} steps lost, K={cfg.checkpoint_every}", flush=True)
    ref = records[0]
    for r in records:
        r["goodput"] = ref["wall_s"] / r["wall_s"]
        r["token_goodput"] = (r["tokens"] / r["wall_s"]) / (ref["tokens"] / ref["wall_s"])
        r["young_daly_k"] = k
        r["step_time_s"], r["save_stall_s"] = step_time, stall
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--period", type=float, default=30.0, help="seconds between faults")
    p.add_argument("--sweep", action="store_true", help="periods 10, 20, 30 and 60 s")
    p.add_argument("--quick", action="store_true", help="CI size: no fixed-K arm, a short target")
    p.add_argument("--target", type=int, default=None, help="the step every arm trains to")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--kind", default="kill")
    p.add_argument("--fixed-k", type=int, default=50)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True, help="JSON results; PNGs are written beside it")
    a = p.parse_args(argv)
    if a.target is None:
        a.target = 120 if a.quick else 400
    if a.quick and a.period == 30.0:
        a.period = 20.0  # above one restart (7-16 s here, by load): below it the restart arm never progresses
    step_time, stall = calibrate(a)
    print(f"calibration: median step {step_time:.3f} s, checkpoint stall {stall:.3f} s", flush=True)
    records = []
    reference = None
    for period in ([10.0, 20.0, 30.0, 60.0] if a.sweep else [a.period]):
        got = compare(a, period, step_time, stall, reference)
        reference = got[0]  # no faults does not depend on the period: measured once
        records += got
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"records": records}, indent=1))
    shown = [r for r in records if r["period_s"] in (None, a.period if not a.sweep else 30.0) and not r.get("reused")]
    plot(shown, out)
    print()
    print(f"{'period':>7} {'arm':<16} {'K':>4} {'wall s':>7} {'goodput':>8} {'tokens':>7} {'faults':>7} {'lost':>5}")
    for r in records:
        print(f"{r['period_s'] or '-':>7} {r['arm']:<16} {r['checkpoint_every'] or '-':>4} {r['wall_s']:>7.1f} "
              f"{r['goodput']:>8.3f} {r['token_goodput']:>7.3f} {r['faults']:>7} {r['steps_lost']:>5}")
    peer = next(r for r in records if r["arm"] == "peer")
    restart = next(r for r in records if r["arm"] == "restart")
    print(f"\npeer / restart goodput: {peer['goodput'] / restart['goodput']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
