"""How a run stops, once, leaving no process behind and a complete checkpoint on disk.

``StopSequence`` owns the stop: whether the run is stopped, which thread stops it (a second
``stop()``, say a user's while a finished run stops itself, waits for the first and returns
its report), and the order of the phases - the supervisor's watch, each group finishing its
step and its save in flight (given :func:`save_deadline`), the groups' processes, the
Lighthouse, the last dashboard frame, the session. Saves that never completed are removed once
no writer is left, so the newest checkpoint directory is complete. ``StopReport`` says where
the seconds went.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from ...telemetry import EventStore
from ...telemetry.events import CheckpointAbandoned, CheckpointSaved, RunStopped
from ..settings.checkpoint_format import latest_complete
from .checkpoint_folder import remove_torn
from .coordinator import Coordinator
from .groups import FINISHED, GAVE_UP, RETIRED, STOPPED, GroupTable
from .placement import Placement
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ...session import Session

STOP_TIMEOUT_S = 3.0  # how long stop() waits for a group's polite stop before killing it
STOP_WAIT_S = 120.0  # a second stop() waits this long for the first (its saves have their own deadline)
SAVE_DEADLINE_MIN_S = 10.0  # stop() gives a save in flight at least this long...
SAVE_DEADLINE_FACTOR = 3.0  # ...or this many times the slowest save of the run


def save_deadline(save_seconds: list[float]) -> float:
    """How long a stop waits for a durable save in flight: long enough for any save this run
    has made so far, with room for a slower disk now."""
    return max([SAVE_DEADLINE_MIN_S] + [SAVE_DEADLINE_FACTOR * s for s in save_seconds])


@dataclasses.dataclass(frozen=True)
class StopReport:
    """What ``FTRun.stop()`` did: how long it took, the newest complete checkpoint left on
    disk, and any save it had to abandon (recorded as ``checkpoint_abandoned``)."""

    run_id: str
    seconds: float
    newest_checkpoint: int | None = None
    abandoned: tuple[CheckpointAbandoned, ...] = ()
    # where the seconds went, in order (they add up to ``seconds``)
    phases: tuple[tuple[str, float], ...] = ()

    def __str__(self) -> str:
        line = f"run {self.run_id} stopped in {self.seconds:.1f} s"
        if self.phases:
            line += " (" + ", ".join(f"{name} {secs:.1f} s" for name, secs in self.phases if secs >= 0.05) + ")"
        if self.newest_checkpoint is not None:
            line += f"; newest checkpoint: step {self.newest_checkpoint} (complete)"
        for a in self.abandoned:
            line += f"; the save of step {a.step} was abandoned: {a.reason}"
        return line

    __repr__ = __str__


class ShownView(Protocol):
    """A view on show (the run's dashboard), drawn once more while the stopping cell runs."""

    @property
    def closed(self) -> bool: ...

    def flush(self) -> None: ...


class StopSequence:
    """Stops a run once; see the module docstring.

    Args:
        run_id: the run's id (named in the report).
        events: the run's event store: ``run_stopped`` and abandoned saves go there, and it is
            closed last.
        groups: the run's group table; groups not already out are marked stopped.
        placement: where the groups run; closed once they are gone.
        coordinator: the run's Lighthouse or plain rendezvous.
        checkpoint_dir: the run's own checkpoint folder (torn saves are removed from it).
        quiet: stops what could start something new (the finish watch, the exit hook, the fault
            schedule, the Lighthouse watch); called first.
        own_session: the run made its session, so the stop shuts it down.
    """

    def __init__(self, run_id: str, events: EventStore, groups: GroupTable, placement: Placement,
                 coordinator: Coordinator, checkpoint_dir: Path, quiet: Callable[[], None], own_session: bool) -> None:
        self.run_id, self.events, self.groups, self.placement = run_id, events, groups, placement
        self.coordinator, self.checkpoint_dir, self._quiet = coordinator, checkpoint_dir, quiet
        self.own_session = own_session
        self.stopped = False
        self.report: StopReport | None = None
        self._stopper: int | None = None  # the thread that stops the run (a second stop() waits for it)
        self._done = threading.Event()

    def stop(self, reason: str, save_timeout: float | None, *, supervisor: Supervisor | None,
             session: Session | None, unsubscribe: Callable[[], None] | None,
             dashboard: Callable[[], ShownView | None]) -> StopReport:
        """Stop the run (``FTRun.stop``): the first call does it; any other waits for the first
        (unless it is the stopping thread itself) and returns its report. ``dashboard()`` is the
        run's dashboard on show when the stop gets to it, if any."""
        if self.stopped:  # again, or while another thread stops it (a finished run stops itself): wait for it
            if self._stopper != threading.get_ident():
                self._done.wait(STOP_WAIT_S)
            return self.report or StopReport(run_id=self.run_id, seconds=0.0)
        self.stopped = True
        self._stopper = threading.get_ident()
        try:
            return self._stop(reason, save_timeout, supervisor, session, unsubscribe, dashboard)
        finally:
            self._done.set()

    def _stop(self, reason: str, save_timeout: float | None, supervisor: Supervisor | None, session: Session | None,
              unsubscribe: Callable[[], None] | None, dashboard: Callable[[], ShownView | None]) -> StopReport:
        t0 = time.monotonic()
        phases: list[tuple[str, float]] = []
        mark = [t0]

        def phase(name: str) -> None:
            now = time.monotonic()
            phases.append((name, now - mark[0]))
            mark[0] = now

        self._quiet()
        if save_timeout is None:
            save_timeout = save_deadline([e.seconds for e in self.events.recent(CheckpointSaved)])
        if supervisor is not None:
            supervisor.stop(timeout=STOP_TIMEOUT_S)
            phase("supervisor")
            supervisor.finish_groups(save_timeout, join_timeout=STOP_TIMEOUT_S)
            phase("finish")  # each group ends its step, leaves the quorum, completes its save
        if unsubscribe is not None:
            unsubscribe()
        if session is not None and supervisor is not None:
            self._stop_groups(session, supervisor)
            phase("groups")
        abandoned = self._remove_torn_checkpoints()
        self.placement.close()
        self.coordinator.close()
        phase("lighthouse")
        self.events.append(RunStopped(run_id=self.run_id, reason=reason))
        _draw_final_frame(dashboard())
        phase("dashboard")
        newest = latest_complete(self.checkpoint_dir)  # this run's own folder (checkpoint_folder)
        if self.own_session and session is not None:
            try:
                session.shutdown()  # closes self.events too (it was handed over)
            except Exception:
                pass
            phase("session")
        self.report = StopReport(run_id=self.run_id, seconds=time.monotonic() - t0,
                                 newest_checkpoint=newest.step if newest else None,
                                 abandoned=tuple(abandoned), phases=tuple(phases))
        self.events.close()
        return self.report

    def _stop_groups(self, session: Session, supervisor: Supervisor) -> None:
        """All groups at once, each bounded. On this machine (and its virtual SLURM nodes) a
        group's processes are killed: its saves are finished or abandoned already, and its logs
        are written unbuffered, so nothing is lost, while Monarch's polite stop of a trainer took
        2.4 s idle and 4.4 s in a loaded kernel. Elsewhere Monarch's polite stop, and a hung
        group (GIL held), which cannot answer it, is killed after STOP_TIMEOUT_S."""
        meshes = session.meshes
        names = [g.name for g in self.groups if g.name in meshes]
        here = [n for n in names if meshes[n].local]
        session.down_many(here, timeout=STOP_TIMEOUT_S, kill=True)
        session.down_many([n for n in names if n not in here], timeout=STOP_TIMEOUT_S)
        for g in self.groups:
            if g.state not in (GAVE_UP, RETIRED, FINISHED):
                supervisor.set_state(g, STOPPED)

    def _remove_torn_checkpoints(self) -> list[CheckpointAbandoned]:
        """Once every writer is gone: remove saves that never completed, each recorded once
        (a worker that gave up on its save already reported it, with its reason)."""
        reported = {e.step: e for e in self.events.recent(CheckpointAbandoned)}
        out = []
        for torn in remove_torn(self.checkpoint_dir):
            event = reported.get(torn.step)
            if event is None:
                event = CheckpointAbandoned(step=torn.step, reason="its write had not finished when the run "
                                            "stopped (no COMPLETE marker): removed")
                self.events.append(event)
            out.append(event)
        return out


def _draw_final_frame(dashboard: ShownView | None) -> None:
    """The stopped state drawn while the stopping cell runs: a notebook executed headless
    (nbclient) records a displayed dashboard's static copy only from messages sent while a
    cell executes, and the dashboard's own thread drew the stop after the cell had ended, so
    the saved notebook showed the run as it was when the dashboard was shown."""
    if dashboard is None or dashboard.closed:
        return
    try:
        dashboard.flush()
    except Exception:  # the UI never stands in the way of a stop
        pass
