"""What a run answers from its own event log and files: the same whether its controller is this
process (``FTRun``) or a host of its own (``RunClient``). The class using it has ``events``,
``run_dir``, ``run_id``, ``started_t`` and ``groups``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ... import worker_logs
from ...telemetry.events import Event, Step
from ..record.history import RunHistory


class FromTheLog:
    events: Any
    run_dir: Path
    run_id: str
    started_t: float | None
    groups: Any

    def history(self) -> RunHistory:
        return RunHistory(self.events, self.run_dir)

    @property
    def log_dir(self) -> Path:
        """Every worker's output, one file per group and rank (``replica1-rank0.log``)."""
        return self.run_dir / "logs"

    def logs(self, replica: int | None = None, rank: int | None = None, grep: str | None = None,
             tail: int = 40) -> worker_logs.LogView:
        """The workers' log lines (of one group and rank, containing ``grep``), aggregated; the
        full text is in ``log_dir``."""
        if replica is not None and replica not in [g.index for g in self.groups]:
            known = ", ".join(str(g.index) for g in self.groups) or "none"
            raise ValueError(f"replica: {replica!r} is not a replica group of run {self.run_id}; groups: {known}")
        return worker_logs.view(self.log_dir, f"replica{replica}" if replica is not None else None, rank, grep, tail)

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 60.0, *, since: float | None = None,
                 what: str | None = None) -> Event:
        """Block until an event satisfying ``predicate`` (recorded at or after ``since``; default: the
        run's start here, so a resumed run's older events never answer) exists; a ``TimeoutError``
        names ``what`` (default: the predicate's source) and the last events."""
        since = (self.started_t or 0.0) if since is None else since
        return self.events.wait_for(predicate, timeout, since=since, what=what)

    def wait_for_step(self, step: int, replicas: list[int] | None = None, timeout: float = 120.0) -> None:
        """Block until the given groups committed ``step``; by default every live group (the
        retired and given-up ones are no longer part of the run)."""
        want = set(replicas if replicas is not None else [g.index for g in self.groups.live()])
        done: set[int] = set()

        def pred(e: Event) -> bool:
            if isinstance(e, Step) and e.committed and e.step >= step and e.replica in want:
                done.add(e.replica)
            return done >= want

        self.events.wait_for(pred, timeout, since=self.started_t or 0.0,
                             what=f"step {step} committed by groups {sorted(want)}")
