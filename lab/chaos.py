"""Second faults during a recovery: the cells of the chaos matrix, and one trial of a cell.

A trial kills one group (the victim) and, while it is being brought back, hits the run again
at a chosen phase of that recovery, on a chosen target - the victim again, the donor (the
lowest-numbered survivor) or another survivor - with a chosen kind. Phases the controller
sees are waited for on the event log and the second fault is injected at once:

  detect    right after the first fault, before the controller noticed it
  teardown  the failure was detected (the victim's processes are being torn down)
  acquire   torn down (processes or an allocation are being acquired)
  build     acquired (the trainer is being built)
  quorum    respawned (the victim asks for its first quorum)
  formed    the victim's first quorum formed (its process group is being built through one
            group's store: the target ``store`` is that group, e.g. a node_down of its node)
  rejoin    healed (the victim is about to commit its first step)

Phases inside a worker are armed in the target (``FTRun.inject(..., during=...)``) and fire
exactly there: ``pg_setup`` - the target starts building the victim's quorum's process group;
``heal`` - the target starts serving its state to the victim (only if torchft picks it as the
victim's source; otherwise the fault never fires and the record says so).

Then the trial waits until every group trains again and records what must hold: no healthy
group failed, the state never lost while a group held it, every group back, replicas
bit-identical, nothing left in squeue. A second fault can leave no holder at all (a node_down
of the node every survivor is on): then the run must resume from its durable checkpoint, so
runs used for chaos keep them (``checkpoint_every``). ``bench/chaos.py`` draws cells at random; the suite
runs a fixed set.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from monarch_nb.jobs.slurm import jobs_named, resume_node
from monarch_nb.telemetry.events import (
    Acquired,
    AllGroupsLost,
    FailureDetected,
    FaultInjected,
    Healed,
    Quorum,
    Rejoined,
    Respawned,
    TornDown,
)

PHASES = ("detect", "teardown", "acquire", "build", "quorum", "formed", "pg_setup", "heal", "rejoin")
TARGETS = ("victim", "donor", "survivor", "store")
KINDS = ("kill", "comms")
SLURM_KINDS = ("preempt", "node_down")
# The event after which each controller-seen phase is under way (of the victim's recovery).
_PHASE_STARTS = {"teardown": FailureDetected, "acquire": TornDown, "build": Acquired, "quorum": Respawned,
                 "rejoin": Healed}
# Phases fired inside the target worker, and the worker phase each one is armed for.
_WORKER_PHASES = {"pg_setup": "pg_setup", "heal": "heal_send"}


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: the second fault's phase, target and kind."""

    phase: str
    target: str
    kind: str

    def why_impossible(self, slurm: bool) -> str | None:
        """None when the cell can be run; else why not (the victim has no process to hit yet,
        a worker phase needs a worker-side kind, a cluster kind needs SLURM)."""
        if self.kind in SLURM_KINDS and not slurm:
            return f"{self.kind} needs a run on SLURM"
        if self.target == "store" and self.phase != "formed":
            return "the quorum's store is known once the victim's quorum formed (phase formed)"
        if self.target == "victim" and self.phase in ("detect", "teardown", "acquire") and self.kind != "preempt":
            return "the victim has no process to hit before it is acquired"
        if self.target == "victim" and self.phase == "build" and self.kind not in SLURM_KINDS:
            return "the victim's trainer is still being built (no actor to arm)"
        if self.phase in _WORKER_PHASES and self.kind in SLURM_KINDS:
            return f"{self.phase} is a moment inside a worker; {self.kind} is done through the scheduler"
        if self.phase == "heal" and self.target == "victim":
            return "the victim receives the heal; hit its donor instead"
        return None


def cells(slurm: bool = False) -> list[Cell]:
    """Every runnable cell of the matrix."""
    kinds = KINDS + (SLURM_KINDS if slurm else ())
    out = [Cell(p, t, k) for p in PHASES for t in TARGETS for k in kinds]
    return [c for c in out if c.why_impossible(slurm) is None]


@dataclass(frozen=True)
class TrialRecord:
    """What one trial showed (one JSON record of ``bench/chaos.py``)."""

    trial: int
    phase: str
    target: str
    kind: str
    slurm: bool
    victim: int
    second: int  # the replica group the second fault was aimed at
    fired: bool  # the second fault happened (a heal-phase fault fires only if its target served the heal)
    healthy_failed: int  # failures of groups that were hit by neither fault
    holders_left: int  # groups hit by neither fault (0: a legitimate total loss, resumed from a checkpoint)
    state_lost: bool  # all_groups_lost while a group still held the state
    recovered: bool  # every group trains again
    identical: bool
    left_in_squeue: int
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.healthy_failed == 0 and not self.state_lost and self.recovered and self.identical \
            and self.left_in_squeue == 0


def run_trial(run: Any, cell: Cell, trial: int = 0, victim: int | None = None, timeout: float = 240.0) -> TrialRecord:
    """Run one trial of ``cell`` on a running ``run`` whose groups all train (see the module
    docstring); returns its record. The run is left with every group training again."""
    slurm = run.config.job == "slurm"
    why = cell.why_impossible(slurm)
    if why is not None:
        raise ValueError(f"cell {cell}: {why}")
    _all_training(run, timeout)
    live = sorted(g.index for g in run.groups.active())
    if len(live) < 3:
        raise ValueError(f"a second-fault trial needs at least 3 training groups; this run has {len(live)}")
    victim = live[trial % len(live)] if victim is None else victim
    survivors = [r for r in live if r != victim]
    second = {"victim": victim, "donor": survivors[0], "survivor": survivors[-1], "store": -1}[cell.target]
    nodes: dict[int, list[str]] = {}
    t0 = time.time()
    run.inject("kill", replica=victim)
    fired_at: float | None = None
    detail = ""
    try:
        fired_at, second, nodes = _second_fault(run, cell, victim, second, t0, timeout)
    except (TimeoutError, RuntimeError, ValueError) as exc:
        detail = f"second fault not sent: {exc}"
    back, recovered_detail = _wait_back(run, {victim} | ({second} if fired_at else set()), t0, timeout)
    if cell.phase in _WORKER_PHASES:
        run.disarm()  # a heal-phase fault whose target served no heal must not fire in a later trial
        fired_at = run.faults.fired_during_phase(second, t0)
    identical = False
    if back:
        verdict = run.check_identical(timeout=120)
        identical = bool(verdict and verdict.identical)
    window = [e for e in run.events.events() if e.t >= t0]
    hit = {victim} | ({second} if fired_at else set())
    if cell.kind == "node_down" and fired_at and nodes.get(second):
        down = nodes[second][0]  # the node the fault took down: every group on it failed with it
        hit |= {r for r, on in nodes.items() if down in on}
        resume_node(down)
    healthy_failed = len({e.replica for e in window if isinstance(e, FailureDetected) and e.replica not in hit})
    lost = [e for e in window if isinstance(e, AllGroupsLost)]
    holders = len(live) - len(hit)
    return TrialRecord(trial=trial, phase=cell.phase, target=cell.target, kind=cell.kind, slurm=slurm,
                       victim=victim, second=second, fired=fired_at is not None, healthy_failed=healthy_failed,
                       holders_left=holders, state_lost=bool(lost) and holders > 0, recovered=back, identical=identical,
                       left_in_squeue=_left_in_squeue(run) if slurm else 0, seconds=time.time() - t0,
                       detail="; ".join(d for d in (detail, recovered_detail) if d))


def _second_fault(run: Any, cell: Cell, victim: int, second: int, t0: float,
                  timeout: float) -> tuple[float | None, int, dict[int, list[str]]]:
    """Send the second fault at its phase; returns when it was sent (None: armed in a worker),
    the group it was aimed at, and (on SLURM) the nodes each group held just before it."""
    if cell.phase in _WORKER_PHASES:
        # Arm after the survivors' quorum, so the next process group built (or heal served) is
        # the victim's.
        survivors_quorum(run, victim, t0, timeout)
        run.inject(cell.kind, replica=second, during=_WORKER_PHASES[cell.phase])
        return None, second, {}
    if cell.phase == "formed":
        # After the survivors' quorum, the first one with the victim: the victim's.
        gone = survivors_quorum(run, victim, t0, timeout)
        formed = run.wait_for(lambda e: isinstance(e, Quorum) and victim in e.participants,
                              timeout=timeout, since=gone.t)
        if cell.target == "store":
            if formed.store_replica is None:
                raise ValueError(f"quorum {formed.quorum_id}: no group is known to hold its store")
            second = formed.store_replica
    elif cell.phase == "detect":
        run.wait_for(lambda e: isinstance(e, FaultInjected) and e.replica == victim, timeout=timeout, since=t0)
    else:
        kind = _PHASE_STARTS[cell.phase]
        run.wait_for(lambda e: isinstance(e, kind) and e.replica == victim, timeout=timeout, since=t0)
    nodes = _nodes(run) if run.config.job == "slurm" else {}
    run.inject(cell.kind, replica=second)
    return time.time(), second, nodes


def survivors_quorum(run: Any, victim: int, since: float, timeout: float) -> Quorum:
    """The survivors' quorum after ``victim`` dropped out (recorded at or after ``since``): it
    comes before the victim's own first quorum."""
    return run.wait_for(lambda e: isinstance(e, Quorum) and victim not in e.participants,
                        timeout=timeout, since=since, what=f"a quorum without replica {victim}")


def _wait_back(run: Any, hit: set[int], t0: float, timeout: float) -> tuple[bool, str]:
    """Every group hit is back (its last recovery rejoined) and every group trains."""
    deadline = time.monotonic() + timeout
    for r in sorted(hit):
        try:
            run.wait_for(lambda e, r=r: isinstance(e, Rejoined) and e.replica == r, since=t0,
                         timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            return False, f"replica {r} not back within {timeout:g} s"
    try:
        _all_training(run, max(1.0, deadline - time.monotonic()))
    except TimeoutError as exc:
        return False, str(exc)
    return True, ""


def _all_training(run: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        states = {g.index: g.state for g in run.groups.active()}
        if states and all(s == "training" for s in states.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every group trains after {timeout:g} s: {states}")
        time.sleep(0.1)


def _nodes(run: Any) -> dict[int, list[str]]:
    """The SLURM nodes each group's allocation holds."""
    out = {}
    for g in run.groups.active():
        allocation = run.session.meshes[g.name].allocation if g.name in run.session.meshes else None
        out[g.index] = list(getattr(allocation, "nodes", []) or [])
    return out


def _left_in_squeue(run: Any) -> int:
    """Jobs of this run in squeue that no group holds (released allocations that stayed)."""
    held = {getattr(run.session.mesh(g.name).allocation, "job_id", None) for g in run.groups.active()
            if g.name in run.session.meshes}
    return len([j for j in jobs_named("monarch_nb-replica") if j not in held])


def draw(n: int, seed: int, slurm: bool) -> list[Cell]:
    """``n`` cells drawn at random (seeded), every cell once before any repeats."""
    rng = random.Random(seed)
    pool: list[Cell] = []
    out = []
    for _ in range(n):
        if not pool:
            pool = cells(slurm)
            rng.shuffle(pool)
        out.append(pool.pop())
    return out


def as_json(records: list[TrialRecord]) -> dict[str, Any]:
    """``{"records": [...], "summary": {...}}``: the shape ``bench/chaos.py`` writes."""
    fired = [r for r in records if r.fired]
    return {"records": [asdict(r) for r in records],
            "summary": {"trials": len(records), "second_fault_fired": len(fired),
                        "ok": sum(r.ok for r in records),
                        "healthy_failed": sum(r.healthy_failed for r in records),
                        "state_lost": sum(r.state_lost for r in records),
                        "not_recovered": sum(not r.recovered for r in records),
                        "not_identical": sum(not r.identical for r in records)}}
