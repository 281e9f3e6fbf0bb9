"""The seed's experiment as one measurement: waves of faults, the live groups swinging, no restart.

The seed's run: 16 nodes, an RCCL failure every 180 s into Llama 3 8B training; the loss stayed
stable while the active workers swung between 8 and 16, and nothing restarted. Here the same
shape at any size: R replica groups, every ``every_s`` seconds a ``comms`` fault (a broken
collective, what an RCCL/NCCL error is to torchft) into up to ``at_once`` training groups
together. A wave never leaves fewer than ``keep`` groups training (default ``R - at_once``,
the seed's 8 of 16): a wave that finds its predecessor's victims still out is smaller, or
skipped, so the live groups swing between ``keep`` and R.

Two runs of the same config: the fault run (:func:`drive_faults`: waves until a group has
committed ``steps``, then every victim back and one identity check across all R groups), and a
fault-free reference trained to the step the fault run ended at (:func:`drive_reference`).
:func:`measure` reads both event logs (live runs or ``open_run`` of their directories) and
returns a :class:`SwingResult`: faults sent and recovered, survivor restarts, identity at the
end, the live-groups timeline, the band check of the loss against the reference, per-fault
recovery times. :meth:`SwingResult.problems` lists the promises broken (none on a good run);
:func:`figure` draws the loss against the reference over the live-groups strip.

``bench/bench_swing.py`` (16 groups, JSON + PNG), ``bench/bench_waves.py`` (4 groups) and
``notebooks/06_seed_experiment.ipynb`` (the same, live on the dashboard) all use this module.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from monarch_nb.telemetry.events import (
    AllGroupsLost,
    FaultInjected,
    ReplicaState,
    RestartedFromCheckpoint,
    RestartedFromScratch,
    RunStarted,
    RunStopped,
    Step,
)
from monarch_nb.ft.record.history import RunHistory
from monarch_nb.ft.record.recovery import RecoveryTracker

SETTLE_QUIET_S = 2.0  # after stop_schedule: no injection for this long means no wave is mid-send


@dataclass(frozen=True)
class SwingPlan:
    """What the fault run does. ``keep`` None: ``replicas - at_once`` (at least 1)."""

    replicas: int = 16
    every_s: float = 20.0
    at_once: int = 8
    steps: int = 200  # the fault run's waves go on until a group has committed this step
    kinds: tuple[str, ...] = ("comms",)
    seed: int = 0
    keep: int | None = None
    timeout_s: float = 1800.0
    # The loss band's narrowest half width, a fraction of the reference's loss (RunHistory.loss_band's
    # floor; its default is 5%). While half the groups are out a step averages half the tokens, and
    # after a couple of hundred such steps the tiny model's loss lags the reference's by up to ~7%
    # (measured: 6.3% and 7.2% in two 8-group runs); a failed heal or a diverging run is off by far
    # more (a group starting over from initial weights: loss ~7.6 against ~1.3).
    band_floor: float = 0.10

    @property
    def keep_groups(self) -> int:
        return self.keep if self.keep is not None else max(1, self.replicas - self.at_once)


@dataclass(frozen=True)
class Wave:
    """Faults sent together: seconds from the first step, the step the run was at, the victims,
    and how many groups were training just before."""

    t_s: float
    step: int
    replicas: list[int]
    live_before: int


@dataclass(frozen=True)
class FaultRecovery:
    """One injected fault's recovery: ``status`` "recovered" once the victim committed again."""

    replica: int
    wave: int
    fault: str
    status: str
    total_s: float | None
    phases: dict[str, float | None]
    acquired_how: str | None
    rung: str | None = None  # the recovery ladder's rung that brought it back (None: a result from before it)


@dataclass(frozen=True)
class SurvivorRestart:
    """A failure, respawn or whole-run restart that no injected fault explains."""

    replica: int | None
    t_s: float
    what: str


@dataclass(frozen=True)
class BandCheck:
    """The fault run's committed loss against the reference's band (``RunHistory.loss_band``)."""

    checked: int
    outside: list[int]
    inside_fraction: float | None
    rule: str
    floor: float  # the band's narrowest half width, a fraction of its centre
    max_deviation: float | None  # largest |loss - band centre| / centre over the checked steps


@dataclass
class SwingResult:
    replicas: int
    every_s: float
    at_once: int
    keep: int
    model: str
    job: str
    steps: int  # last step the fault run committed
    reference_steps: int
    faults_sent: int
    faults_recovered: int
    survivor_restarts: list[SurvivorRestart]
    identical_at_end: bool
    identity_step: int | None
    identity_groups: int  # groups whose digests the final check compared
    identity_checks: int  # every check of the fault run (one after each rejoin, and the final one)
    identity_all_identical: bool
    min_live: int
    max_live: int
    time_at_group_counts: dict[int, float]
    live_groups: list[tuple[float, int]]  # (seconds from the first time all R trained, count)
    waves: list[Wave]
    recoveries: list[FaultRecovery]
    band: BandCheck
    loss: list[tuple[int, float]]  # the fault run's mean committed loss per step
    reference_loss: list[tuple[int, float]]
    reference_band: list[tuple[int, float, float]]  # (step, low, high)
    wall_s: dict[str, float | None] = field(default_factory=dict)
    run_dir: str | None = None
    reference_dir: str | None = None

    # ---- verdicts -----------------------------------------------------------------------

    def recovery_seconds(self) -> list[float]:
        return [r.total_s for r in self.recoveries if r.total_s is not None]

    def problems(self) -> list[str]:
        """The mechanisms' promises this run broke; empty on a good run (no wall-clock figure
        is judged: those depend on the machine)."""
        out = []
        if self.faults_sent == 0:
            out.append("no fault was sent")
        if self.faults_recovered != self.faults_sent:
            lost = [f"{r.replica} ({r.status})" for r in self.recoveries if r.status != "recovered"]
            out.append(f"{self.faults_recovered} of {self.faults_sent} faults recovered; not back: {', '.join(lost)}")
        if self.survivor_restarts:
            out.append("survivors restarted: " + "; ".join(
                f"group {s.replica} at {s.t_s:.0f} s: {s.what}" for s in self.survivor_restarts))
        if not self.identical_at_end:
            out.append(f"the final identity check (step {self.identity_step}) did not find all {self.replicas} "
                       f"groups bit-identical ({self.identity_groups} compared)")
        if not self.identity_all_identical:
            out.append("an identity check during the run found replicas that differ")
        if self.band.outside:
            out.append(f"loss outside the reference's band at steps {self.band.outside}")
        if not self.band.checked:
            out.append("no step of the fault run could be checked against the reference")
        if self.min_live < self.keep:
            out.append(f"the live groups fell to {self.min_live}, below the floor of {self.keep}")
        return out

    def describe(self) -> str:
        secs = self.recovery_seconds()
        rec = (f"; recovery median {_secs(statistics.median(secs))}, max {_secs(max(secs))}" if secs else "")
        spent = ", ".join(f"{n}: {_secs(s)}" for n, s in self.time_at_group_counts.items())
        sizes = "/".join(str(len(w.replicas)) for w in self.waves)
        return (f"{self.replicas} groups, {_plural(len(self.waves), 'wave')} ({sizes} "
                f"faults), {self.faults_sent} faults sent, {self.faults_recovered} recovered{rec}; "
                f"survivor restarts: {len(self.survivor_restarts)}; live groups {self.min_live}-{self.max_live} "
                f"(seconds at each count: {spent}); identical at the end: {self.identical_at_end} "
                f"(step {self.identity_step}, {self.identity_groups} groups); loss: {self.band.rule}"
                + (f", at most {self.band.max_deviation:.1%} off its centre" if self.band.max_deviation is not None
                   else ""))

    # ---- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = self.problems()
        data["time_at_group_counts"] = {str(k): v for k, v in self.time_at_group_counts.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SwingResult":
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        d["survivor_restarts"] = [SurvivorRestart(**s) for s in d["survivor_restarts"]]
        d["waves"] = [Wave(**w) for w in d["waves"]]
        d["recoveries"] = [FaultRecovery(**r) for r in d["recoveries"]]
        d["band"] = BandCheck(**d["band"])
        d["time_at_group_counts"] = {int(k): v for k, v in d["time_at_group_counts"].items()}
        for key in ("live_groups", "loss", "reference_loss", "reference_band"):
            d[key] = [tuple(p) for p in d[key]]
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "SwingResult":
        return cls.from_dict(json.loads(Path(path).read_text()))


# ---- driving the two runs --------------------------------------------------------------------


def drive_faults(run: Any, plan: SwingPlan, log: Callable[[str], None] = print) -> None:
    """Start ``run`` (an ``FTRun``, not started; display its dashboard first if you like), send
    waves until a group has committed ``plan.steps`` and one wave at least has gone out, stop the waves, wait until every victim
    is back, prove all groups bit-identical once more, and stop the run."""
    try:
        if not run.started:
            run.start()
        log(f"{run.config.replicas} groups training; a wave of up to {plan.at_once} {'/'.join(plan.kinds)} faults "
            f"every {plan.every_s:g} s, leaving at least {plan.keep_groups} training")
        run.schedule(plan.every_s, kinds=list(plan.kinds), at_once=plan.at_once, seed=plan.seed,
                     keep=plan.keep_groups)
        deadline = time.monotonic() + plan.timeout_s
        run.wait_for(lambda e: isinstance(e, Step) and e.committed and e.step >= plan.steps, timeout=plan.timeout_s,
                     what=f"step {plan.steps} committed")
        # A fast run can reach its step before the first wave (a wave needs more than `keep`
        # groups training, and groups that joined late are still healing): it goes on to one.
        run.wait_for(lambda e: isinstance(e, FaultInjected), timeout=max(1.0, deadline - time.monotonic()),
                     what="the first wave of faults")
        run.stop_schedule()
        sent = len(run.events.events(FaultInjected))
        log(f"step {plan.steps} reached after {sent} faults; waiting for every victim to rejoin")
        settle(run, plan.timeout_s)
        check = run.check_identical(timeout=300)
        if check is not None:
            log(f"final identity check at step {check.step}: {len(check.hashes)} ranks, "
                f"{'bit-identical' if check.identical else 'DIFFERENT'}")
    finally:
        run.stop()


def settle(run: Any, timeout: float) -> None:
    """Block until no recovery is under way (a wave still being sent is waited for too); a
    victim given up on, or the run stopping, ends the wait (the result records it)."""
    from monarch_nb.ft.control.waiting import wait_for_rejoin

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        faults = run.events.events(FaultInjected)
        if faults and time.time() - faults[-1].t < SETTLE_QUIET_S:
            time.sleep(0.2)
            continue
        tracker = RecoveryTracker()
        tracker.apply_all(run.events.events())
        active = {g.index for g in run.groups.active()}
        if not [r for r in tracker.recoveries if not r.finished and r.replica in active]:
            return
        try:
            wait_for_rejoin(run, timeout=max(1.0, deadline - time.monotonic()))
        except (RuntimeError, TimeoutError):
            return


def drive_reference(run: Any, steps: int, timeout: float = 1800.0) -> None:
    """Start ``run`` (the same config, no faults), train until every group committed ``steps``, stop."""
    try:
        if not run.started:
            run.start()
        run.wait_for_step(steps, timeout=timeout)
    finally:
        run.stop()


# ---- measuring -------------------------------------------------------------------------------


def _window(h: RunHistory, replicas: int) -> tuple[float | None, float | None]:
    """From the first moment all groups trained to the start of the stop (groups told to stop,
    or run_stopped): the part of the run the live-groups figures describe."""
    start = next((t for t, n in h.live_groups() if n >= replicas), None)
    ends = [e.t for e in h.events.events(ReplicaState)
            if e.state in ("stopped", "finished")]  # type: ignore[attr-defined]
    ends += [e.t for e in h.events.events(RunStopped)]
    return start, (min(ends) if ends else (h.events.events()[-1].t if len(h.events) else None))


def _live_in(h: RunHistory, start: float, end: float) -> list[tuple[float, int]]:
    series = h.live_groups()
    before = [n for t, n in series if t <= start]
    out = [(0.0, before[-1] if before else 0)]
    out += [(t - start, n) for t, n in series if start < t < end]
    out.append((end - start, out[-1][1]))
    return out


def _spent(live: list[tuple[float, int]]) -> dict[int, float]:
    spent: dict[int, float] = {}
    for (t, n), (t_next, _) in zip(live, live[1:]):
        spent[n] = spent.get(n, 0.0) + (t_next - t)
    return {n: s for n, s in sorted(spent.items()) if s > 0}


def _step_at(h: RunHistory, t: float) -> int:
    return max((e.step for e in h.steps() if e.t <= t), default=0)


def _waves(h: RunHistory, gap_s: float) -> list[list[FaultInjected]]:
    waves: list[list[FaultInjected]] = []
    for e in sorted(h.events.events(FaultInjected), key=lambda e: e.t):
        if waves and e.t - waves[-1][-1].t <= gap_s:
            waves[-1].append(e)  # type: ignore[arg-type]
        else:
            waves.append([e])  # type: ignore[list-item]
    return waves


def _wall(h: RunHistory) -> float | None:
    started, stopped = h.events.events(RunStarted), h.events.events(RunStopped)
    return stopped[-1].t - started[0].t if started and stopped else None


def measure(faults: RunHistory, reference: RunHistory, plan: SwingPlan) -> SwingResult:
    """Everything :class:`SwingResult` holds, from the two runs' event logs alone."""
    cfg = faults.config
    replicas = int(cfg.get("replicas", plan.replicas))
    start, end = _window(faults, replicas)
    if start is None or end is None:
        live: list[tuple[float, int]] = []
        start = end = 0.0
    else:
        live = _live_in(faults, start, end)
    counts = [n for _, n in live] or [0]

    tracker = RecoveryTracker()
    tracker.apply_all(faults.events)
    waves = _waves(faults, gap_s=min(5.0, plan.every_s / 2))
    wave_of = {id(e): i for i, w in enumerate(waves) for e in w}
    injected = sorted(faults.events.events(FaultInjected), key=lambda e: e.t)
    planned = [r for r in tracker.recoveries if r.fault is not None]
    recoveries = []
    for r in planned:
        first = next((e for e in injected if e.replica == r.replica and e.t == r.injected_t), None)
        recoveries.append(FaultRecovery(replica=r.replica, wave=wave_of.get(id(first), -1), fault=r.fault or "",
                                        status=r.status, total_s=r.total_s, phases=r.durations(),
                                        acquired_how=r.acquired_how, rung=r.rung))
    recovered = sum(r.injections for r in planned if r.status == "recovered")

    restarts = [SurvivorRestart(replica=r.replica, t_s=(r.start_t or start) - start,
                                what=f"unplanned failure ({r.reason or 'no reason recorded'}), {r.status}")
                for r in tracker.recoveries if r.fault is None]
    for e in faults.events:
        if isinstance(e, (AllGroupsLost, RestartedFromCheckpoint, RestartedFromScratch)):
            restarts.append(SurvivorRestart(replica=None, t_s=e.t - start, what=e.kind))

    checks = faults.identity_checks()
    final = checks[-1] if checks else None
    band = faults.loss_band(reference, floor=plan.band_floor)
    ref_band = reference.band(window=band.window, k=band.k, floor=band.floor)
    mean = faults.mean_losses()
    deviations = [abs(mean[s] - c) / c for s, (c, _) in ref_band.items() if s in mean and c]
    return SwingResult(
        replicas=replicas, every_s=plan.every_s, at_once=plan.at_once, keep=plan.keep_groups,
        model=str(cfg.get("model", "?")), job=str(cfg.get("job", "?")),
        steps=max((e.step for e in faults.steps()), default=0),
        reference_steps=max((e.step for e in reference.steps()), default=0),
        faults_sent=len(injected), faults_recovered=recovered, survivor_restarts=restarts,
        identical_at_end=bool(final and final.identical
                              and len(final.hashes) == replicas * int(cfg.get("group_size", 1))),
        identity_step=final.step if final else None, identity_groups=len(final.hashes) if final else 0,
        identity_checks=len(checks), identity_all_identical=all(c.identical for c in checks),
        min_live=min(counts), max_live=max(counts), time_at_group_counts=_spent(live), live_groups=live,
        waves=[Wave(t_s=w[0].t - start, step=_step_at(faults, w[0].t), replicas=[e.replica for e in w],
                    live_before=_live_before(faults, w[0].t)) for w in waves],
        recoveries=recoveries,
        band=BandCheck(checked=band.checked, outside=band.outside, inside_fraction=band.inside_fraction,
                       rule=band.describe(), floor=band.floor, max_deviation=max(deviations, default=None)),
        loss=sorted(faults.mean_losses().items()), reference_loss=sorted(reference.mean_losses().items()),
        reference_band=[(s, c - h, c + h) for s, (c, h) in sorted(ref_band.items())],
        wall_s={"fault_run": _wall(faults), "reference": _wall(reference)},
        run_dir=str(faults.run_dir) if faults.run_dir else None,
        reference_dir=str(reference.run_dir) if reference.run_dir else None,
    )


def _live_before(h: RunHistory, t: float) -> int:
    before = [n for tt, n in h.live_groups() if tt < t]
    return before[-1] if before else 0


# ---- figures ---------------------------------------------------------------------------------


def _secs(s: float) -> str:
    """Seconds as a reader wants them: a repair in place takes tenths, a rebuild tens."""
    return f"{s:.2f} s" if s < 10 else f"{s:.0f} s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def figure(result: SwingResult, panels: tuple[str, ...] = ("loss", "deviation", "live"), width: float = 9.0) -> Any:
    """A matplotlib Figure of any of three panels: ``loss`` (the fault run's committed loss
    against the reference and its band, waves marked), ``deviation`` (the same as
    percent off the band's centre, the reference's 20-step mean, inside the band's half width)
    and ``live`` (training groups over wall time, waves marked)."""
    from matplotlib.figure import Figure

    heights = {"loss": 2.6, "deviation": 1.6, "live": 1.6}
    fig = Figure(figsize=(width, sum(heights[p] for p in panels) + 0.7), dpi=100)
    axes = fig.subplots(len(panels), 1, height_ratios=[heights[p] for p in panels], squeeze=False)[:, 0]
    loss = dict(result.loss)
    kinds = "/".join(sorted({r.fault for r in result.recoveries})) or "no"
    for ax, panel in zip(axes, panels):
        if panel in ("loss", "deviation"):
            for i, w in enumerate(result.waves):
                ax.axvline(w.step, color="#D55E00", lw=0.8, ls=":", label="a wave" if i == 0 else None)
            ax.set_xlabel("step")
        if panel == "loss":
            if result.reference_band:
                s, lo, hi = zip(*result.reference_band)
                ax.fill_between(s, lo, hi, color="#bbbbbb", alpha=0.5, lw=0, label="reference band")
            if result.loss:
                ax.plot(*zip(*result.loss), color="#0072B2", lw=1.2, label=f"waves of {kinds} faults")
            if result.reference_loss:
                ax.plot(*zip(*result.reference_loss), color="#333333", lw=0.9, ls="--", label="no faults (reference)")
            if result.band.outside:
                ax.plot(result.band.outside, [loss[s] for s in result.band.outside], "x", color="#D55E00",
                        label="outside the band")
            ax.set_ylabel("committed loss")
            ax.set_title(f"{result.replicas} groups, {_plural(result.faults_sent, 'fault')} in "
                         f"{_plural(len(result.waves), 'wave')}: {result.band.rule}", fontsize=9)
            ax.legend(fontsize=8)
        elif panel == "deviation":
            rows = [(s, 100 * (loss[s] - (lo + hi) / 2) / ((lo + hi) / 2), 100 * (hi - lo) / (lo + hi))
                    for s, lo, hi in result.reference_band if s in loss and lo + hi]
            if rows:
                s, dev, half = zip(*rows)
                ax.fill_between(s, [-h for h in half], half, color="#bbbbbb", alpha=0.5, lw=0)
                ax.plot(s, dev, color="#0072B2", lw=1.0)
                ax.set_ylim(-3 * 100 * result.band.floor, 3 * 100 * result.band.floor)
            ax.axhline(0, color="#333333", lw=0.6)
            ax.set_ylabel("% off band centre")
        elif panel == "live":
            if result.live_groups:
                ax.step([t for t, _ in result.live_groups], [n for _, n in result.live_groups], where="post",
                        color="#2e7d32")
            for w in result.waves:
                ax.axvline(w.t_s, color="#D55E00", lw=0.8, ls=":")
                ax.annotate(f"-{len(w.replicas)}", (w.t_s, result.replicas + 0.3), fontsize=7, color="#D55E00")
            ax.set_ylim(0, result.replicas + 1.5)
            ax.set_yticks(sorted({0, result.keep, result.replicas}))
            ax.axhline(result.keep, color="#999999", lw=0.6, ls="--")
            ax.set_xlabel("wall time (s) from all groups training")
            ax.set_ylabel("training groups")
    fig.tight_layout()
    return fig
