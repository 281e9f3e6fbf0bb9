"""A communicator a worker rebuilds itself, at once, when its own collective failed: the
ladder's ``communicator`` rung without the controller's poll in the way (the others' next quorum
waits for this rebuild alone). The controller still climbs the ladder from the stall it sees:
its repair call collects the rebuild, or escalates when it does not come back. Worker side."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

# The rebuilding group stays a quorum member (heartbeating) so the others wait for it in the
# Lighthouse rather than reconfigure without it and again with it; a rebuild that takes longer
# than this (a stuck communicator) leaves the quorum, so they go on.
MEMBER_WAIT_S = 1.0


@dataclasses.dataclass
class OwnRepair:
    """One rebuild; the worker reports ``stalled`` until the controller collects it."""

    reason: str
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    seconds: float = 0.0
    kept_member: bool = False
    error: str | None = None

    def rebuild(self, repair: Callable[[], bool], leave_quorum: Callable[[], None],
                stop: threading.Event, stuck_s: float) -> bool:
        """``repair`` (the trainer's) now; a stuck communicator (``stuck_s``, the fault's
        ``stuck``) hangs first, leaving the quorum after MEMBER_WAIT_S. False if it raised."""
        t0, member = time.monotonic(), True
        while stuck_s and time.monotonic() - t0 < stuck_s and not stop.wait(0.1):
            if member and time.monotonic() - t0 > MEMBER_WAIT_S:
                leave_quorum()
                member = False
        try:
            self.kept_member = repair()
        except Exception as e:  # noqa: BLE001 - reported through the controller's repair call
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = time.monotonic() - t0
        return self.error is None

    def collected(self) -> float:
        """The rebuild's seconds once it is over (the controller bounds the wait); raises if it failed."""
        self.done.wait()
        if self.error is not None:
            raise RuntimeError(f"the communicator could not be rebuilt in place: {self.error}")
        return self.seconds
