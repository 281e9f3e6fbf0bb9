"""Proof that replicas are bit-identical: digests of every rank compared at one step.

Training never pauses for a check. :meth:`IdentityChecks.request` asks every training
group to report digests of its parameters and optimizer state right after committing one
future step (a few steps ahead, so every group reaches it); the reports come back with the
groups' telemetry (:class:`~monarch_nb.ft.record.ingest.HashReport`) and, once every asked rank
has answered, one ``ReplicasIdentical`` event records whether rank k of every group holds
the same digests. A group that could not be asked is left out of that check, and so is one
that healed past the step instead of committing it (:class:`~monarch_nb.ft.record.ingest.HashSkipped`),
or that failed before committing it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ...telemetry.events import Event, ReplicasIdentical
from ..record.ingest import HashReport, HashSkipped


ASK_THREADS = 32  # groups asked at once by one check


def _ask_all(replicas: list[int], target: int, ask: Callable[[int, int], bool | None]) -> dict[int, bool | None]:
    """Every group asked at once: one after another, 32 groups answering in ~1 s each on a busy
    host took longer than the steps ahead the check aimed at, so every attempt found a group
    already past its step and no check completed at R = 32 (bench_scale, 2026-12-02)."""
    if len(replicas) <= 1:
        return {r: ask(r, target) for r in replicas}
    with ThreadPoolExecutor(max_workers=min(len(replicas), ASK_THREADS), thread_name_prefix="ft-identity") as pool:
        futures = {r: pool.submit(ask, r, target) for r in replicas}
    return {r: f.result() for r, f in futures.items()}


@dataclass
class _Pending:
    expected: set[tuple[int, int]]
    got: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    armed: set[int] = field(default_factory=set)  # groups some request armed for this step


class IdentityChecks:
    """Checks at steps that are multiples of ``every``: 1 under per-step sync; the sync period
    under LocalSGD or DiLoCo, where the groups are equal only right after they met (``None``:
    never - streaming DiLoCo meets one fragment at a time, so its groups are never all equal)."""

    def __init__(self, group_size: int, emit: Callable[[Event], None], every: int | None = 1) -> None:
        self.group_size = group_size
        self.every = every
        self._emit = emit
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}

    def request(self, groups: Iterable[tuple[int, int]] | Callable[[], Iterable[tuple[int, int]]],
                ask: Callable[[int, int], bool | None], ahead: int = 3, attempts: int = 6) -> int | None:
        """Check at a step ``ahead`` of the furthest group. ``groups`` are (replica, step) of the
        training groups, as far as the controller knows (or a function giving them now);
        ``ask(replica, step)`` asks one for digests: True (armed), False (it is already past that
        step), None (it could not be asked: left out). Fast steps (a GPU commits many between two
        polls) can outrun the controller's view: then the check moves further ahead, 4x each
        time, asking the groups training then, from where they are then (a group that died during
        an attempt is not waited for again while the others run on).
        Returns the step checked, or None with fewer than two groups."""
        view = groups if callable(groups) else (lambda fixed=list(groups): fixed)
        groups = list(view())
        if len(groups) < 2 or self.every is None:
            return None
        # A check already waiting at the same step is joined, not replaced: a rejoin's own check and
        # the user's ``check_identical`` right after it both aim at the next meeting; the second used
        # to drop the first's reports, and its unanswered asks to leave healthy groups out. Requests
        # run side by side (one waiting for another would aim from a step view gone stale meanwhile).
        base = max(step for _, step in groups)
        for _ in range(attempts):
            target = -(-(base + ahead) // self.every) * self.every  # the next step the groups meet at
            with self._lock:
                pending = self._pending.setdefault(target, _Pending(set()))
                pending.expected |= {(r, k) for r, _ in groups for k in range(self.group_size)} - set(pending.got)
            answers = _ask_all([replica for replica, _ in groups], target, ask)
            if False not in answers.values():
                break
            with self._lock:  # a group is already past it: this target can never complete
                if self._pending.get(target) is pending:
                    del self._pending[target]
            groups = list(view())
            if len(groups) < 2:
                return None
            base, ahead = max(target, max(step for _, step in groups)), ahead * 4
        else:
            return None
        with self._lock:
            pending.armed |= {replica for replica, answer in answers.items() if answer}
            for replica, answer in answers.items():
                ranks = {(replica, k) for k in range(self.group_size)}
                if answer:  # armed here, even if another request could not ask it
                    pending.expected |= ranks - set(pending.got)
                elif answer is None and replica not in pending.armed:
                    pending.expected -= ranks
        self._maybe_complete(target)
        return target

    def record(self, report: HashReport) -> None:
        with self._lock:
            pending = self._pending.get(report.step)
            if pending is None:
                return
            pending.got[(report.replica, report.rank)] = (report.params, report.optim)
        self._maybe_complete(report.step)

    def left_out(self, replica: int) -> None:
        """The group failed: every check still waiting on it compares the others (at R = 32 a
        check asked after one rejoin was still waiting when the next fault took a group it had
        asked, and no check of that run completed)."""
        self._forget({(replica, k) for k in range(self.group_size)})

    def skipped(self, report: HashSkipped) -> None:
        """That rank never committed the step (it healed past it): the check goes on without it."""
        self._forget({(report.replica, report.rank)}, step=report.step)

    def _forget(self, ranks: set[tuple[int, int]], step: int | None = None) -> None:
        """(replica, rank)s that will never report: out of the check at ``step`` (every pending
        check by default), which may then be complete."""
        with self._lock:
            steps = list(self._pending) if step is None else [step]
            for pending in (self._pending[s] for s in steps if s in self._pending):
                pending.expected -= ranks
                for key in ranks:
                    pending.got.pop(key, None)
        for s in steps:
            self._maybe_complete(s)

    def _maybe_complete(self, step: int) -> None:
        with self._lock:
            pending = self._pending.get(step)
            if pending is not None and not pending.expected:  # every asked rank skipped it
                del self._pending[step]
                return
            if pending is None or not pending.expected <= set(pending.got):
                return
            del self._pending[step]
        got = pending.got
        identical = all(len({v for (_, rank), v in got.items() if rank == k}) == 1 for k in range(self.group_size))
        hashes = {f"replica{r}/rank{k}": f"params:{p} optim:{o}" for (r, k), (p, o) in sorted(got.items())}
        self._emit(ReplicasIdentical(step=step, identical=identical, hashes=hashes))
