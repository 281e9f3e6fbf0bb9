"""When and how often a failed replica group is brought back.

The supervisor in :mod:`monarch_nb.ft.control.supervisor` asks the backoff before every attempt to
bring a group back. The first attempt after a group trained is immediate - a recovery must
not wait for nothing - and each further attempt in a row (the respawn itself failed, or the
group failed again before it rejoined) waits longer: ``backoff_s`` times ``backoff_factor``
per attempt, capped at ``max_backoff_s``, so a cause that does not go away (a lost
Lighthouse, a full node) never turns into a tight loop. After ``max_respawns`` attempts in a
row without the group training in between, the supervisor gives up on it: the run records
``gave_up`` and carries on with the others. A group that trains again starts afresh, so a long
run survives any number of failures spread over time (failures are routine at scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RespawnBackoff:
    """Args:
        max_respawns: attempts in a row to bring one group back without it training in
            between (0: never bring it back).
        backoff_s: wait before the second attempt in a row, in seconds.
        backoff_factor: each further attempt in a row waits this many times longer.
        max_backoff_s: the longest wait between attempts, in seconds.
    """

    max_respawns: int = 10
    backoff_s: float = 1.0
    backoff_factor: float = 2.0
    max_backoff_s: float = 30.0

    def validate(self) -> None:
        if not isinstance(self.max_respawns, int) or isinstance(self.max_respawns, bool) or self.max_respawns < 0:
            raise ValueError(f"respawn.max_respawns: must be an integer >= 0, got {self.max_respawns!r}")
        for name in ("backoff_s", "backoff_factor", "max_backoff_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or isinstance(value, float) and not math.isfinite(value)):
                raise ValueError(f"respawn.{name}: must be a finite number, got {value!r}")
        if self.backoff_s < 0:
            raise ValueError(f"respawn.backoff_s: must be >= 0 seconds, got {self.backoff_s!r}")
        if self.backoff_factor < 1:
            raise ValueError(f"respawn.backoff_factor: must be >= 1, got {self.backoff_factor!r}")
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"respawn.max_backoff_s: must be >= backoff_s ({self.backoff_s}), got {self.max_backoff_s!r}")

    def allows(self, in_a_row: int) -> bool:
        """May the group be brought back an ``in_a_row``-th time since it last trained?"""
        return in_a_row <= self.max_respawns

    def wait_before(self, in_a_row: int) -> float:
        """Seconds to wait before the ``in_a_row``-th consecutive attempt (1: none)."""
        if in_a_row < 1:
            raise ValueError(f"in_a_row: must be >= 1, got {in_a_row}")
        if in_a_row == 1:
            return 0.0
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** (in_a_row - 2))
