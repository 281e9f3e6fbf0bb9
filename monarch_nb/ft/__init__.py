"""Fault-tolerant training from the controller: torchft replica groups on Monarch meshes.

``FTRun`` starts a torchft Lighthouse and R replica groups (Monarch proc meshes running
torchtitan's Llama 3 under a torchft Manager), respawns failed groups under a
``RespawnPolicy``, injects faults on demand (``FaultKind``, ``FaultSchedule``), proves that
healed replicas are bit-identical, and records everything in ``<run_dir>/events.jsonl``;
``open_run`` rebuilds a run's history from that file alone.
"""

from .config import RunConfig
from .faults import Fault, FaultKind, FaultSchedule
from .history import RunHistory
from .platform import Platform, select_platform
from .recovery import Phase, Recovery, RecoveryTracker
from .respawn import RespawnPolicy
from .run import FTRun, StopReport, open_run

__all__ = ["FTRun", "Fault", "FaultKind", "FaultSchedule", "Phase", "Platform", "Recovery", "RecoveryTracker",
           "RespawnPolicy", "RunConfig", "RunHistory", "StopReport", "open_run", "select_platform"]
