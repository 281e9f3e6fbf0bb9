"""What happened in a run, rebuilt from its events alone.

``RunHistory`` reads an :class:`~monarch_nb.telemetry.EventStore` - live (``FTRun.history()``)
or reopened from disk (``open_run(path)``) - and derives the figures the notebook, tests
and benchmark report: loss per replica, and for every failure one :class:`Recovery` with
detection latency, respawn time, heal bytes/seconds/source, the first committed step after
healing, how long the survivors stalled, and whether replicas were bit-identical after it.
Nothing here talks to a process; the event log is the only input.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..telemetry import EventStore
from ..telemetry.events import (
    FailureDetected,
    FaultInjected,
    Healed,
    Rejoined,
    ReplicasIdentical,
    Respawned,
    RunStarted,
    Step,
)


@dataclass
class Recovery:
    replica: int
    fault: str | None  # injected kind, None for a failure nobody injected
    reason: str
    injected_t: float | None
    detected_t: float
    detection_s: float | None  # fault fired -> controller knew
    respawn_s: float | None  # respawn started -> trainer constructed
    heal_bytes: int | None
    heal_s: float | None
    heal_source: int | None
    rejoined_step: int | None
    down_s: float | None  # failure -> first committed step after heal
    survivor_commits_while_down: int
    survivor_stall_s: float | None  # longest gap between a survivor's commits around the failure
    survivor_stall_steps: float | None  # ... in units of the survivors' median step time
    identical: bool | None  # first identity check after the rejoin

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RunHistory:
    def __init__(self, events: EventStore, run_dir: str | Path | None = None) -> None:
        self.events = events
        self.run_dir = Path(run_dir) if run_dir is not None else None

    @property
    def config(self) -> dict[str, Any]:
        started = self.events.events(RunStarted)
        return dict(started[0].config) if started else {}

    def steps(self, replica: int | None = None, committed_only: bool = True) -> list[Step]:
        return [e for e in self.events.events(Step)  # type: ignore[misc]
                if (replica is None or e.replica == replica) and (e.committed or not committed_only)]

    def losses(self, replica: int = 0) -> list[tuple[int, float]]:
        return [(e.step, e.loss) for e in self.steps(replica)]

    def identity_checks(self) -> list[ReplicasIdentical]:
        return self.events.events(ReplicasIdentical)  # type: ignore[return-value]

    def recoveries(self) -> list[Recovery]:
        evs = list(self.events)
        out = []
        failures = [e for e in evs if isinstance(e, FailureDetected) and not e.reason.startswith("respawn failed")]
        for f in failures:
            nxt = min((x.t for x in failures if x.replica == f.replica and x.t > f.t), default=float("inf"))

            def first(cls: type, after: float = f.t) -> Any:
                return next((e for e in evs if isinstance(e, cls) and getattr(e, "replica", None) == f.replica
                             and after <= e.t < nxt), None)

            inj = None
            for e in evs:
                if isinstance(e, FaultInjected) and e.replica == f.replica and e.t <= f.t:
                    inj = e
            if inj is not None and any(isinstance(x, FailureDetected) and x.replica == f.replica
                                       and inj.t <= x.t < f.t for x in failures):
                inj = None  # that injection belongs to an earlier failure
            resp, healed, rej = first(Respawned), first(Healed), first(Rejoined)
            fired_t = f.t - f.detection_s if f.detection_s is not None else (inj.t if inj else f.t)
            end_t = rej.t if rej else (max((e.t for e in evs), default=f.t))
            survivors = sorted({e.replica for e in self.steps() if e.replica != f.replica})
            commits = [e for e in self.steps() if e.replica != f.replica and fired_t <= e.t <= end_t]
            stall_s, stall_steps = self._stall(survivors, fired_t, end_t)
            ident = next((e for e in evs if isinstance(e, ReplicasIdentical) and rej is not None and e.t >= rej.t
                          and e.step >= rej.step), None)
            out.append(Recovery(
                replica=f.replica, fault=inj.fault if inj else None, reason=f.reason,
                injected_t=inj.t if inj else None, detected_t=f.t, detection_s=f.detection_s,
                respawn_s=resp.seconds if resp else None, heal_bytes=healed.bytes if healed else None,
                heal_s=healed.seconds if healed else None, heal_source=healed.source_replica if healed else None,
                rejoined_step=rej.step if rej else None, down_s=(rej.t - fired_t) if rej else None,
                survivor_commits_while_down=len(commits), survivor_stall_s=stall_s,
                survivor_stall_steps=stall_steps, identical=ident.identical if ident else None))
        return out

    def _stall(self, survivors: list[int], t0: float, t1: float) -> tuple[float | None, float | None]:
        worst_s, worst_steps = None, None
        for r in survivors:
            times = [e.t for e in self.steps(r)]
            before = [b - a for a, b in zip(times, times[1:]) if b < t0]
            typical = statistics.median(before[-20:]) if before else None
            prev = max((t for t in times if t <= t0), default=None)
            window = [t for t in times if t0 < t <= t1]
            if prev is None or not window:
                continue
            pts = [prev] + window
            gap = max(b - a for a, b in zip(pts, pts[1:]))
            if worst_s is None or gap > worst_s:
                worst_s = gap
                worst_steps = gap / typical if typical else None
        return worst_s, worst_steps

    def summary(self) -> dict[str, Any]:
        steps = self.steps()
        first = [e.loss for e in steps[:3]]
        last = [e.loss for e in steps[-3:]]
        return {
            "committed_steps": max((e.step for e in steps), default=0),
            "loss_start": statistics.mean(first) if first else None,
            "loss_end": statistics.mean(last) if last else None,
            "failures": len(self.recoveries()),
            "identity_checks": [(e.step, e.identical) for e in self.identity_checks()],
        }

    def dashboard(self) -> Any:
        from ..notebook.dashboard import Dashboard

        return Dashboard(self.events, controls=None)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"RunHistory({self.run_dir}: {s['committed_steps']} steps, {s['failures']} failures, "
                f"loss {s['loss_start']} -> {s['loss_end']})")
