"""Every group lost at once: no live peer holds the run's state.

A group behind the run's progress waits for a peer to heal from; when no group trains, every
group was lost. The run then resumes all of them from the newest complete durable checkpoint,
or says once that the state is lost and leaves the groups waiting for a state holder: they never
train on from their initial weights unless the user asks (``restart_from_scratch``). One
episode at a time (``_lock``); a failed load is tried again RESUME_RETRY_S later. Controller
side: runs in the kernel's threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...telemetry.events import AllGroupsLost, CheckpointLoadFailed, Event, Resumed, RungEscalated, RungStarted
from ..settings.checkpoint_format import latest_complete
from .groups import HEALING, TRAINING, WAITING, GroupTable

RESUME_RETRY_S = 5.0  # after a failed checkpoint load, the next try (at a poll that finds a group waiting)


class TotalLoss:
    """What happens when no live peer is left (see the module docstring)."""

    def __init__(self, groups: GroupTable, emit: Callable[[Event], None],
                 call: Callable[..., Any], progress: Callable[[], int]) -> None:
        """``call(group, endpoint, *args, timeout=)``: a bounded call of a group's trainers;
        ``progress()``: the run's last committed step."""
        self.groups, self._emit, self._call, self._progress = groups, emit, call, progress
        self.checkpoint_dir: str | None = None  # set by the run when durable checkpoints are on
        self._lock = threading.Lock()
        self._episode = False  # a loss is being handled; reset once a group trains again
        self._resume_again_at: float | None = None  # a failed resume is tried again after this

    def trains_again(self) -> None:
        """A group rejoined: the episode (if any) is over."""
        with self._lock:
            self._episode = False

    def no_peer_left(self) -> None:
        """Some group waits for a peer to heal from (it is behind the run's progress) and no group
        trains: every group was lost. Resume from the newest complete durable checkpoint, or say
        once that the state is lost and leave the groups waiting for a state holder (they never
        train on from scratch unless the user asks: ``FTRun.restart_from_scratch``)."""
        with self._lock:
            if any(g.state == TRAINING for g in self.groups):
                return
            first = not self._episode
            if not first and (self._resume_again_at is None or time.monotonic() < self._resume_again_at):
                return
            self._episode, self._resume_again_at = True, None
        checkpoint = latest_complete(self.checkpoint_dir) if self.checkpoint_dir else None
        step = self._progress()
        if checkpoint is None:
            self._emit(AllGroupsLost(step=step, checkpoint=None,
                                     detail=f"no live peer and no durable checkpoint: the model state of step {step} "
                                            "is lost; the groups wait for a state holder. run.restart_from_scratch() "
                                            "(%monarch restart --from-scratch) trains again from the initial weights; "
                                            "set checkpoint_every to survive this"))
            return
        waiting = [g for g in self.groups if g.state in (WAITING, HEALING)]
        if first:
            self._emit(AllGroupsLost(step=step, checkpoint=str(checkpoint.path),
                                     detail=f"no live peer: resuming from the checkpoint of step {checkpoint.step}"))
            for g in waiting:  # the ladder's last rung: the process rung brought them back without a state
                why = f"no live peer holds the run's state (step {step})"
                if g.rung in ("process", "hosts"):
                    self._emit(RungEscalated(replica=g.index, rung=g.rung, to="checkpoint", reason=why, seconds=0.0))
                self.groups.set_rung(g, "checkpoint")
                self._emit(RungStarted(replica=g.index, rung="checkpoint", reason=why))
        failed: dict[int, str] = {}
        for g in waiting:
            for attempt in range(2):  # one retry: a load can lose a race with a poll
                try:
                    self._call(g, "load_checkpoint", str(checkpoint.path), timeout=60.0)
                    failed.pop(g.index, None)
                    break
                except Exception as exc:
                    failed[g.index] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if failed or not waiting:
            # Not resumed: say so, and try again in a while (a respawned group may take the load).
            self._emit(CheckpointLoadFailed(step=checkpoint.step, checkpoint=str(checkpoint.path),
                                            replicas=sorted(failed),
                                            error="; ".join(f"replica {r}: {e}" for r, e in sorted(failed.items()))
                                            or "no group was waiting to load it"))
            with self._lock:
                self._resume_again_at = time.monotonic() + RESUME_RETRY_S
            return
        # The run's progress is the checkpoint's step now (the steps after it were lost):
        # groups respawned from here on may train from it, not wait for a step nobody holds.
        self.groups.rewind_progress(checkpoint.step)
        self._emit(Resumed(step=checkpoint.step, checkpoint=str(checkpoint.path), reason="all groups lost"))

    def restart_from_scratch(self) -> list[int]:
        """Every group was lost and no checkpoint exists: the groups waiting for a state holder
        train again from their initial weights (identical on every group: one seed), from
        step 0. Returns the groups told. Refused while any group holds the run's state."""
        holders = [g.index for g in self.groups if g.state == TRAINING]
        if holders:
            raise RuntimeError(f"restart_from_scratch: replica group(s) {', '.join(map(str, holders))} hold the "
                               "run's state and train: nothing is lost")
        waiting = [g for g in self.groups if g.state == WAITING]
        if not waiting:
            raise RuntimeError("restart_from_scratch: no group is waiting for a state holder (states: "
                               + ", ".join(f"replica{g.index}={g.state}" for g in self.groups) + ")")
        for g in waiting:
            self._call(g, "forget_progress", timeout=30.0)
        self.groups.rewind_progress(0)  # a group respawned from here on trains from the start as well
        return [g.index for g in waiting]
