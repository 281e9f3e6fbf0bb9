"""A run given ``steps`` ends itself once it has trained them: ``FinishWatch``.

It observes the run's events for the moment every group has reached ``steps`` (or left the
run: given up, retired) and then, in a thread of its own, saves the final state into the run's
own checkpoint folder (periodic checkpoints on or off, as torchtitan saves its last step) and
stops the run, which lets the workers, spares and Lighthouse go. History, checkpoints and
dashboard stay, and ``FTRun.resume`` continues the run for more steps. If no group can save,
the groups stay up (their memory is the only copy) and ``run_finished`` carries the error.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from ...telemetry import EventStore
from ...telemetry.events import Event, ReplicaState, RunFinished
from ..settings.config import RunConfig
from .groups import FINISHED, GAVE_UP, RETIRED, GroupTable
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ...session import Session

FINAL_SAVE_TIMEOUT_S = 600.0  # a finished run's last save (synchronous; a large model on a slow disk)


class FinishWatch:
    """Ends a finished run: the final save, then the run's stop.

    Args:
        config: the run's config (``checkpoint_every``: a periodic save may still be writing).
        groups: the run's group table.
        events: the run's event store; ``run_finished`` goes there.
        stopped: whether the run is stopping or stopped (then nothing is ended here).
        stop: the run's ``stop``, called with the reason ``"finished"``.
    """

    def __init__(self, config: RunConfig, groups: GroupTable, events: EventStore, stopped: Callable[[], bool],
                 stop: Callable[[str], object]) -> None:
        self.config, self.groups, self.events = config, groups, events
        self._stopped, self._stop_run = stopped, stop
        self._finishing = threading.Lock()  # taken once, by the thread that ends the run
        self._unsubscribe: Callable[[], None] | None = None
        self._supervisor: Supervisor | None = None
        self._session: Session | None = None

    def watch(self, supervisor: Supervisor, session: Session) -> None:
        """From now on, end the run once every group has finished."""
        self._supervisor, self._session = supervisor, session
        self._unsubscribe = self.events.subscribe(self._on_event)

    def cancel(self) -> None:
        """Watch no more (the run is stopping)."""
        if self._unsubscribe is not None:
            self._unsubscribe()

    def _on_event(self, event: Event) -> None:
        """Event observer (the emitting thread): once every group has reached ``steps``, the
        run ends itself in a thread of its own."""
        if not (isinstance(event, ReplicaState) and event.state == FINISHED) or self._stopped():
            return
        groups = list(self.groups)
        if any(g.state not in (FINISHED, GAVE_UP, RETIRED) for g in groups) or not any(
                g.state == FINISHED for g in groups):
            return
        if self._finishing.acquire(blocking=False):
            threading.Thread(target=self._finish, name="ft-finish", daemon=True).start()

    def _finish(self) -> None:
        """Settle the periodic saves, save the final state from the first group that can, record
        ``run_finished``, and stop the run if the state is safe on disk."""
        sup, session = self._supervisor, self._session
        assert sup is not None and session is not None
        t0 = time.monotonic()
        # (a group that finished while out, after its peers, had its processes stopped: no state)
        finished = sorted((g for g in self.groups if g.state == FINISHED and g.actors is not None
                           and g.name in session.meshes), key=lambda g: g.index)
        checkpoint, step, digest, errors = None, max((g.step for g in finished), default=0), "", []
        if self.config.checkpoint_every:  # a periodic save of the last step may still be writing
            try:
                sup.at_once(finished, lambda g: sup.call(g, "settle_saves", timeout=FINAL_SAVE_TIMEOUT_S), "ft-settle")
            except Exception as exc:  # a group that cannot answer is skipped below as well
                errors.append(f"settling periodic saves: {type(exc).__name__}: {exc}"[:300])
        for g in finished:
            try:
                result = sup.call(g, "save_final", timeout=FINAL_SAVE_TIMEOUT_S)
            except Exception as exc:
                errors.append(f"replica {g.index}: {type(exc).__name__}: {exc}"[:300])
                continue
            if result.errors or result.missing:
                errors.append(f"replica {g.index}: {next(iter(result.errors.values()), 'no answer')}"[:300])
                continue
            record = result.values[0]
            step, checkpoint, digest = int(record["step"]), str(record["path"]), str(record.get("digest", ""))
            break
        self.events.append(RunFinished(step=step, checkpoint=checkpoint, seconds=time.monotonic() - t0, digest=digest,
                                       error="; ".join(errors) if checkpoint is None else ""))
        if checkpoint is not None and not self._stopped():
            self._stop_run("finished")
