"""When and how often a failed replica group is brought back.

The supervisor in :mod:`monarch_nb.ft.run` asks the policy for the delay before each
respawn attempt; the policy answers with exponential backoff (capped) until the group has
used its ``max_restarts``, then ``None``: the run records ``gave_up`` and carries on with
the remaining groups. Attempts are counted per replica group over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 10
    backoff_s: float = 0.0
    backoff_factor: float = 2.0
    max_backoff_s: float = 30.0

    def validate(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"restart.max_restarts: must be an integer >= 0, got {self.max_restarts!r}")
        if self.backoff_s < 0:
            raise ValueError(f"restart.backoff_s: must be >= 0 seconds, got {self.backoff_s!r}")
        if self.backoff_factor < 1:
            raise ValueError(f"restart.backoff_factor: must be >= 1, got {self.backoff_factor!r}")
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"restart.max_backoff_s: must be >= backoff_s ({self.backoff_s}), got {self.max_backoff_s!r}")

    def delay(self, attempt: int) -> float | None:
        """Seconds to wait before respawn ``attempt`` (1-based); ``None`` once attempts are used up."""
        if attempt < 1:
            raise ValueError(f"attempt: must be >= 1, got {attempt}")
        if attempt > self.max_restarts:
            return None
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** (attempt - 1))
