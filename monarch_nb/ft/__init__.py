"""Fault-tolerant training from the controller: torchft replica groups on Monarch meshes.

``FTRun`` starts a torchft Lighthouse and R replica groups (Monarch proc meshes running
torchtitan's Llama 3 under a torchft Manager), respawns failed groups under a
``RespawnBackoff``, injects faults on demand (``FaultKind``, ``FaultSchedule``), proves that
healed replicas are bit-identical, and records everything in ``<run_dir>/events.jsonl``;
``open_run`` rebuilds a run's history from that file alone.
"""

from .control.run import FTRun, StopReport, open_run
from .record.history import RunHistory
from .record.recovery import Phase, Recovery, RecoveryTracker
from .settings.config import RunConfig
from .settings.faults import Fault, FaultKind, FaultSchedule
from .settings.platform import Platform, select_platform
from .settings.respawn import RespawnBackoff

__all__ = ["FTRun", "Fault", "FaultKind", "FaultSchedule", "Phase", "Platform", "Recovery", "RecoveryTracker",
           "RespawnBackoff", "RunConfig", "RunHistory", "StopReport", "open_run", "select_platform"]
