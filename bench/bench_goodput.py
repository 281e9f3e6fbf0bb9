"""Checkpoint-less (peer recovery) vs checkpoint-restart, measured side by side.

One invocation runs the same model, data and fault schedule several ways ("arms"), one after
the other on this machine, each until the same target step (or, if it gets no further, for
``--arm-limit`` times the no_faults arm's wall time: an arm whose recovery outlasts the fault period
never reaches it, and its goodput is then its rate of progress):

  no_faults            the reference: nothing injected, no durable checkpoints
  peer                 on_failure="peer": a failed group heals from a live peer, the others train
                       on; durable checkpoints every K steps like the restart arms (a user of peer
                       recovery still keeps them, for a total loss), so the race is fair
  peer_no_checkpoints  the same without durable checkpoints: what they cost
  restart              on_failure="restart": on any failure every group stops and all restart from
                       the newest durable checkpoint, taken every K steps with K from Young/Daly:
                       K = sqrt(2 * save_cost * MTBF) / step_time, save_cost measured (an
                       asynchronous DCP save's stall plus its write's slowdown of the next steps,
                       see Calibration) and MTBF the fault period; torchft's quorum per step
                       still runs
  plain_restart        on_failure="plain_restart": the old way as users run it - no torchft, one
                       process group over every group (torchtitan under torchrun), every process
                       restarted on any failure and loading the newest checkpoint, all at once
  restart_fixed_k      restart with one common fixed K (--fixed-k, default 50)
  peer_spare           peer with one warm spare group (spares=1) and checkpoints every K: the
                       victim's replacement is already built

Faults: ``--kind`` (kill) into a rotating victim every ``--period`` seconds of wall time,
counted from the arm's first committed step - the same schedule for every arm. A fault that
falls due while the arm has no training group (a restart in progress) waits until one trains
again, so every arm receives the same number of faults per unit of training time (dropping
them would flatter the slower arm). Each arm uses torchtitan's own settings otherwise.

Per arm: goodput = target steps / wall time, as a ratio to no_faults; the same for committed
tokens (a step committed by fewer live groups trains on fewer tokens); faults; wall time to the
target; ``lost_s``, where the time lost against no_faults went: detect (failure to detection),
respawn (a restart's teardown, processes and start-up, all groups down), load (checkpoint reads,
the slowest group's per restart), redo (steps lost to a restart, at the calibrated step time),
checkpoint_stalls (the training thread's share of the saves), survivor_stalls (peer arms: the
gap in commits at each fault beyond one step), steady_steps (the arm's own pace between faults
against the reference's, over the target's steps: negative for a plain job, which pays no quorum
per step) and other (the rest of the difference, which may be negative: noise);
``peer_ceiling``, the arm's wall time over the time a peer arm that lost nothing to its faults
would take at its own pace: the most peer's goodput ratio against this arm could be. ``--reread``
recomputes these derived figures from the records in ``--out``. ``--groups 3,8`` runs every arm at each size (a calibration per size).
PNGs: loss against wall time for all arms, live groups over time. JSON: ``{"records": [...],
"args": {...}, "argv": [...]}``, one record per (groups, arm).

Usage:
  python bench/bench_goodput.py --out bench/results/goodput.json            # period 30 s
  python bench/bench_goodput.py --quick --groups 3,8 --out bench/results/goodput.json  # 60 s races, see below
  python bench/bench_goodput.py --groups 3:debugmodel,8:tiny --out FILE.json           # a flavour per race

``--groups`` lists races: a size ``R`` (the ``--model`` flavour) or ``R:flavour``. ``--quick`` races the
tiny flavour at every size and the debugmodel flavour at the smallest size as well. Why both: the tiny
model's step (tens of ms at 3 groups) is so short that torchft's fixed per-step cost (quorum and
should_commit, ~8 ms) is a large share of it, and its processes rebuild in seconds, so against a 30 s
fault period recovery can gain little on it (``peer_ceiling`` says how little); debugmodel's step is
~10x longer and its rebuild about twice as long, closer to a real model's proportions. At 8 groups on this
2-core box debugmodel's restarts (all 8 rebuilding on two cores) take longer than the fault period,
so the 8-group race, and the comparison across sizes, is the tiny model's.
  python bench/bench_goodput.py --sweep --out bench/results/goodput-sweep.json   # 10, 20, 30, 60 s
  python bench/bench_goodput.py --groups 8:debugmodel --arms no_faults,peer,plain_restart --periods 30,300 \
      --target-periods 2 --out bench/results/goodput_periods.json   # the crossover's measured points
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goodput_records import race, reached  # noqa: E402

from monarch_nb.ft import FTRun, RunConfig  # noqa: E402
from monarch_nb.ft.settings.config import MODELS as FLAVOURS  # noqa: E402


CALIBRATION_EVERY = 10  # steps between the calibration run's saves: most steps are untouched by one


@dataclasses.dataclass(frozen=True)
class Calibration:
    """This model at this size on this machine, from one fault-free run saving every
    CALIBRATION_EVERY steps. ``save_cost_s`` is what one asynchronous save costs the training in
    all: the training thread's stall while it stages a copy, plus the slowdown of the following
    steps while its background thread writes (on a small box that thread competes with the
    training for the same cores). Young/Daly's rule wants the whole cost, not only the stall."""

    step_s: float  # median time between committed steps
    save_stall_s: float  # median stall of the training thread per save
    save_cost_s: float  # total excess step time per save (at least the stall)


def calibrate(groups: int, model: str, a: argparse.Namespace) -> Calibration:
    run = FTRun(RunConfig(replicas=groups, model=model, seq_len=a.seq_len, checkpoint_every=CALIBRATION_EVERY,
                          steps=None, run_name=f"goodput-calibrate-g{groups}-{time.strftime('%H%M%S')}"))
    try:
        run.start()
        run.wait_for(lambda e: e.kind == "checkpoint_saved" and e.step >= 4 * CALIBRATION_EVERY, timeout=a.timeout)
    finally:
        run.stop()
    return calibration(run.history().steps(0), run.events.events("checkpoint_saved"))


def calibration(steps: list, saves: list) -> Calibration:
    """Step time, save stall and save cost from group 0's committed steps and the saves: the
    cost is the time the steps between the first and the last save took beyond the median step,
    per save in that span."""
    at = {e.step: e.t for e in steps}
    gaps = {s: at[s] - at[s - 1] for s in at if s - 1 in at}
    step = statistics.median(gaps.values())
    stall = statistics.median(e.stall for e in saves)
    saved = sorted(e.step for e in saves)
    span = [g for s, g in gaps.items() if saved[0] < s <= saved[-1]]
    per_save = sum(g - step for g in span) / (len(saved) - 1) if len(saved) > 1 and span else stall
    return Calibration(step_s=step, save_stall_s=stall, save_cost_s=max(stall, per_save))


def young_daly_k(save_cost: float, mtbf: float, step_time: float) -> int:
    return max(1, round(math.sqrt(2 * save_cost * mtbf) / step_time))


def useful_tokens(steps: list, config: RunConfig, until_t: float) -> int:
    """Tokens of the committed group-steps up to ``until_t``, each (group, step) once: work a
    restart threw away and redid counts one time, and a step committed by fewer live groups
    counts fewer tokens."""
    done = {(e.replica, e.step) for e in steps if e.t <= until_t}
    return len(done) * config.seq_len * config.batch_size * config.group_size


def lost_time(run: FTRun, faults: list[float], until_t: float, step_time: float) -> dict[str, float]:
    """Where an arm's time went beyond training, from its event log (see the module docstring).
    ``other`` is filled in by the caller, which knows the reference's wall time."""
    ev = run.events
    detect = sum(e.detection_s or 0.0 for e in ev.events("failure_detected") if e.t <= until_t)
    restarts = [e for e in ev.events("restarted_from_checkpoint") if e.t <= until_t]
    loads = ev.events("checkpoint_loaded")
    load = 0.0
    for r in restarts:  # the slowest group's read of each restart (they read at once)
        window = [e.seconds for e in loads if r.t - r.seconds <= e.t <= r.t]
        load += max(window, default=0.0)
    respawn = sum(r.seconds for r in restarts) - load
    redo = sum(r.lost_steps for r in restarts) * step_time
    saves = sum(e.stall for e in ev.events("checkpoint_saved") if e.t <= until_t)
    survivor = 0.0
    if run.config.on_failure == "peer":
        commits = sorted(e.t for e in run.history().steps() if e.t <= until_t)
        for tf in faults:
            before = [t for t in commits if t <= tf]
            after = [t for t in commits if t > tf]
            if before and after:
                survivor += max(0.0, after[0] - before[-1] - step_time)
    return {"detect": detect, "respawn": respawn, "load": load, "redo": redo,
            "checkpoint_stalls": saves, "survivor_stalls": survivor}


def run_arm(arm: str, config: RunConfig, a: argparse.Namespace, period: float, step_time: float,
            limit_s: float | None = None) -> dict:
    """One arm to the target step, or for ``limit_s`` seconds from its first committed step if
    it gets no further (an arm whose recovery takes longer than the fault period never would)."""
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
                victim = n % config.replicas
                if victim in training:
                    try:
                        run.inject(a.kind, replica=victim)
                        faults.append(time.time())
                        break
                    except Exception:
                        pass
                stop.wait(0.1)
            n += 1

    try:
        run.start()
        first = run.wait_for(lambda e: e.kind == "step" and e.committed, timeout=a.timeout)
        if arm != "no_faults":
            threading.Thread(target=inject_on_schedule, args=(first.t,), daemon=True).start()
        try:
            done = run.wait_for(lambda e: e.kind == "step" and e.committed and e.step >= a.target,
                                timeout=min(a.timeout, limit_s or a.timeout))
        except TimeoutError:
            if limit_s is None:
                raise
            done = max(run.history().steps(), key=lambda e: e.step)  # the furthest it got
            done = dataclasses.replace(done, t=first.t + limit_s)
        stop.set()
    finally:
        stop.set()
        run.stop()
    history = run.history()
    steps = history.steps()
    wall = done.t - first.t
    tokens = useful_tokens(steps, config, done.t)
    restarts = run.events.events("restarted_from_checkpoint")
    return {
        "groups": config.replicas, "arm": arm, "on_failure": config.on_failure, "model": config.model,
        "checkpoint_every": config.checkpoint_every, "spares": config.spares,
        "period_s": period if arm != "no_faults" else None, "target_step": a.target,
        "reached_step": min(done.step, a.target), "limit_s": limit_s, "wall_s": wall, "faults": len(faults),
        "steps_lost": sum(e.lost_steps for e in restarts),
        "restarts": len(restarts), "resumes": len(run.events.events("resumed")), "tokens": tokens,
        "steps_per_s": min(done.step, a.target) / wall,
        "checkpoint_stall_s": statistics.median([e.stall for e in run.events.events("checkpoint_saved")] or [0.0]),
        "checkpoints": len(run.events.events("checkpoint_saved")),
        "lost_s": lost_time(run, faults, done.t, step_time),
        "recoveries": [r.row() for r in history.recoveries()],
        "loss": [(e.t - first.t, e.step, e.loss) for e in steps if e.replica == 0],
        "live_groups": [(t - first.t, n) for t, n in history.live_groups()],
        "run_dir": str(run.run_dir),
    }


def plot(records: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    colours = {"no_faults": "#999999", "peer": "#0072B2", "peer_no_checkpoints": "#56B4E9", "restart": "#D55E00",
               "plain_restart": "#CC79A7", "restart_fixed_k": "#E69F00", "peer_spare": "#009E73"}
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


ARMS = ("no_faults", "peer", "peer_no_checkpoints", "restart", "plain_restart", "restart_fixed_k", "peer_spare")
QUICK_ARMS = ("no_faults", "peer", "restart", "plain_restart")


def arm_config(arm: str, base: dict, k: int, fixed_k: int) -> RunConfig:
    return {"no_faults": lambda: RunConfig(**base),
            "peer": lambda: RunConfig(**base, checkpoint_every=k),
            "peer_no_checkpoints": lambda: RunConfig(**base),
            "restart": lambda: RunConfig(**base, on_failure="restart", checkpoint_every=k),
            "plain_restart": lambda: RunConfig(**base, on_failure="plain_restart", checkpoint_every=k),
            "restart_fixed_k": lambda: RunConfig(**base, on_failure="restart", checkpoint_every=fixed_k),
            "peer_spare": lambda: RunConfig(**base, spares=1, checkpoint_every=k)}[arm]()


def compare(a: argparse.Namespace, groups: int, model: str, period: float, cal: Calibration,
            reference: dict | None = None) -> list[dict]:
    """Every arm of one race (size, flavour) at one fault period; ``reference`` (a no_faults
    record) is reused when given."""
    base = dict(replicas=groups, steps=None, seq_len=a.seq_len, model=model)
    step_time, cost = cal.step_s, cal.save_cost_s
    k = young_daly_k(cost, period, step_time)
    arms = list(a.arms or (QUICK_ARMS if a.quick else ARMS))
    if reference is not None:
        arms = [arm for arm in arms if arm != "no_faults"]
    records = [dict(reference, reused=True)] if reference is not None else []
    for arm in arms:
        cfg = arm_config(arm, base, k, a.fixed_k)
        cfg = cfg.replace(run_name=f"goodput-g{groups}-{model}-{arm}-p{period:g}-{time.strftime('%H%M%S')}")
        ref = records[0] if records and records[0]["arm"] == "no_faults" else None
        limit = a.arm_limit * ref["wall_s"] * a.target / ref["target_step"] if ref else None
        rec = run_arm(arm, cfg, a, period, step_time, limit)
        records.append(rec)
        print(f"[{groups} groups, {model}, period {period:g} s] {arm:<20} {rec['wall_s']:7.1f} s to step {rec['reached_step']}, "
              f"{rec['faults']} faults, {rec['steps_lost']} steps lost, K={cfg.checkpoint_every}", flush=True)
    ref = records[0]
    for r in records:
        r["young_daly_k"] = k
        r["checkpoint_rule"] = (f"K = round(sqrt(2 * save_cost * period) / step_time) = round(sqrt(2 * {cost:.4f} "
                                f"* {period:g}) / {step_time:.4f}) = {k}")
        r["step_time_s"], r["save_stall_s"], r["save_cost_s"] = step_time, cal.save_stall_s, cost
    derive(records)
    return records


def steady_step_s(record: dict) -> float:
    """The arm's median time between group 0's consecutive committed steps: its pace when
    nothing is failing (a plain job pays no quorum per step)."""
    times = [t for t, _, _ in record["loss"]]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def derive(records: list[dict]) -> None:
    """The figures that compare an arm with its race's no_faults reference (the first record of
    each race): goodputs, and the total time lost split into its parts; ``steady_steps`` is
    what the arm's own pace between faults costs or saves over the target's steps, ``other``
    the rest."""
    for key in dict.fromkeys(race(r) for r in records):
        same = [r for r in records if race(r) == key]
        ref = same[0]
        for r in same:
            r["goodput"] = (reached(r) / r["wall_s"]) / (ref["target_step"] / ref["wall_s"])
            r["token_goodput"] = (r["tokens"] / r["wall_s"]) / (ref["tokens"] / ref["wall_s"])
            parts = {n: v for n, v in r["lost_s"].items() if n not in ("steady_steps", "other", "total")}
            parts["steady_steps"] = (steady_step_s(r) - steady_step_s(ref)) * reached(r)
            total = r["wall_s"] - ref["wall_s"] * reached(r) / ref["target_step"]
            r["lost_s"] = {**parts, "total": total, "other": total - sum(parts.values())}
        peers = [r for r in same if r["arm"] == "peer"]
        for r in same:
            # A peer arm that lost nothing to its faults still trains at its own pace (it pays
            # torchft's quorum every step): the most its goodput could be against each arm (the
            # peer arm of the same fault period; an arm stopped short: its time to the target at its rate).
            peer = next((q for q in peers if q["period_s"] == r["period_s"]), peers[0] if peers else None)
            if peer is not None:
                pace_wall = ref["wall_s"] * peer["target_step"] / ref["target_step"] + peer["lost_s"]["steady_steps"]
                r["peer_ceiling"] = r["wall_s"] * peer["target_step"] / reached(r) / pace_wall


def write(out: Path, records: list[dict], a: argparse.Namespace, argv: list[str] | None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"records": records, "args": vars(a), "argv": sys.argv[1:] if argv is None else argv},
                              indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--period", type=float, default=None, help="seconds between faults (default 30)")
    p.add_argument("--sweep", action="store_true", help="periods 10, 20, 30 and 60 s")
    p.add_argument("--periods", default=None,
                   help="comma-separated fault periods in seconds, each a race of its own (e.g. 30,300: the "
                        "crossover's measured points); the no_faults reference is measured once, at the first")
    p.add_argument("--target-periods", type=float, default=None,
                   help="instead of --target: each period's target is the step a fault-free run reaches in this "
                        "many periods (so a long period still sees faults)")
    p.add_argument("--quick", action="store_true",
                   help="the tiny model at every size and debugmodel at the smallest too, each race as long as "
                        "60 s of fault-free training, no fixed-K, spare or no-checkpoint arm")
    p.add_argument("--target", type=int, default=None, help="the step every arm trains to")
    p.add_argument("--target-seconds", type=float, default=None,
                   help="instead of --target: the step a fault-free run reaches in this long at each size "
                        "(from the calibrated step time), so every size races for the same time")
    p.add_argument("--groups", default="3", help="comma-separated races, each R or R:flavour (default 3)")
    p.add_argument("--arms", default="", help=f"comma-separated arms (default: {', '.join(ARMS)}; "
                                                f"--quick: {', '.join(QUICK_ARMS)})")
    p.add_argument("--model", default=None, help="model flavour (default debugmodel; --quick: tiny)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--kind", default="kill")
    p.add_argument("--fixed-k", type=int, default=50)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--arm-limit", type=float, default=2.0,
                   help="an arm that has not reached the target after this many times the no_faults arm's wall "
                        "time stops there; its goodput is its rate of progress (default 2)")
    p.add_argument("--out", required=True, help="JSON results; PNGs are written beside it")
    p.add_argument("--reread", action="store_true",
                   help="measure nothing: recompute the derived figures (goodput, lost_s) of --out's records")
    a = p.parse_args(argv)
    if a.reread:
        out = Path(a.out)
        result = json.loads(out.read_text())
        derive(result["records"])
        result["reread"] = "derived figures recomputed by --reread from the measured records"
        out.write_text(json.dumps(result, indent=1))
        return 0
    a.arms = [x.strip() for x in a.arms.split(",") if x.strip()] or None
    unknown = sorted(set(a.arms or ()) - set(ARMS))
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
    try:
        races = [(int(r), f) for r, _, f in (x.strip().partition(":") for x in a.groups.split(","))]
    except ValueError:
        p.error(f"--groups: comma-separated R or R:flavour (R an integer), got {a.groups!r}")
    unknown = sorted({f for _, f in races if f} - set(FLAVOURS))
    if unknown:
        p.error(f"--groups: unknown flavour {', '.join(unknown)}; allowed: {', '.join(FLAVOURS)}")
    if a.model is None:
        a.model = "tiny" if a.quick else "debugmodel"
    if a.quick and not any(f for _, f in races):  # the heavier model where its restarts fit the period
        races = [(min(r for r, _ in races), "debugmodel")] + races
    a.races = races = [(r, f or a.model) for r, f in races]
    if a.periods:
        try:
            a.periods = sorted(float(x) for x in a.periods.split(","))
        except ValueError:
            p.error(f"--periods: comma-separated seconds, got {a.periods!r}")
    a.periods = a.periods or ([10.0, 20.0, 30.0, 60.0] if a.sweep else None)
    if a.target is None and a.target_seconds is None and a.target_periods is None:
        if a.quick:
            a.target_seconds = 60.0  # two faults' worth at the default period, in every race
        else:
            a.target = 400
    if a.period is None:
        a.period = 30.0
    records = []
    out = Path(a.out)
    for groups, model in races:
        cal = calibrate(groups, model, a)
        if a.target_seconds:
            a.target = max(20, round(a.target_seconds / cal.step_s))
        print(f"calibration, {groups} groups, {model}: median step {cal.step_s:.3f} s, save stall {cal.save_stall_s:.3f} s, "
              f"save cost {cal.save_cost_s:.3f} s" + ("" if a.target_periods else f"; target step {a.target}"), flush=True)
        reference = None
        for period in a.periods or [a.period]:
            if a.target_periods:
                a.target = max(20, round(a.target_periods * period / cal.step_s))
            got = compare(a, groups, model, period, cal, reference)
            reference = got[0]  # no faults does not depend on the period: measured once
            records += got
            write(out, records, a, argv)  # after every race: a later failure keeps what was measured
    shown = [r for r in records if race(r) == races[0] and not r.get("reused")
             and r["period_s"] in (None, (a.periods or [a.period])[0])]
    plot(shown, out)
    print()
    print(f"{'groups':>6} {'model':>10} {'period':>7} {'arm':<20} {'K':>4} {'wall s':>7} {'goodput':>8} {'tokens':>7} {'faults':>7} "
          f"{'lost':>5}")
    for r in records:
        print(f"{r['groups']:>6} {r['model']:>10} {r['period_s'] or '-':>7} {r['arm']:<20} {r['checkpoint_every'] or '-':>4} "
              f"{r['wall_s']:>7.1f} {r['goodput']:>8.3f} {r['token_goodput']:>7.3f} {r['faults']:>7} {r['steps_lost']:>5}")
    for key in races:
        arms = {r["arm"]: r for r in records if race(r) == key}
        if "peer" in arms:
            for other in ("restart", "plain_restart"):
                if other in arms:
                    print(f"{key[0]} groups, {key[1]}: peer / {other} goodput {arms['peer']['goodput'] / arms[other]['goodput']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
