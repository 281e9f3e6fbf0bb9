"""torch's profiler over training steps, on the schedule a torchtitan 0.3 job's ``profiler`` section sets.

torchtitan's own ``Profiler`` names each trace by ``torch.distributed.get_rank()``, which a
one-process group (no default process group: torchft's Manager owns the cross-group one) does
not have; so the schedule is torch's ``torch.profiler.schedule`` with the job's numbers (wait =
freq - warmup - active, as torchtitan computes it), and the traces go where torchtitan puts them,
one folder per profiled window (named by the run's step at its end), by replica and rank: ``<run dir>/<folder>/iteration_<step>/
replica<R>_rank<r>_trace.json``.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable


class StepProfiler:
    """:meth:`step` after every training step (the first call starts it, in the training thread:
    torch's profiler must start and stop in one thread); :meth:`close` when training ends."""

    def __init__(self, cfg: dict[str, Any], replica: int | None, rank: int, current_step: Callable[[], int]) -> None:
        titan = cfg.get("titan") or {}
        self.freq, self.warmup, self.active = int(titan["profile_freq"]), int(titan["profile_warmup"]), \
            int(titan["profile_active"])
        self.current_step = current_step  # the run's step names a trace (a healed process joins mid-run)
        self.folder = os.path.join(cfg["run_dir"], titan["profile_folder"])
        self.name = f"replica{replica if replica is not None else 'spare'}_rank{rank}_trace.json"
        self._profiler: Any = None
        self._thread: int | None = None

    def _start(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, on_trace_ready=self._write,
            schedule=torch.profiler.schedule(wait=self.freq - self.warmup - self.active, warmup=self.warmup,
                                             active=self.active))
        self._profiler.__enter__()
        self._thread = threading.get_ident()

    def _write(self, prof: Any) -> None:
        where = os.path.join(self.folder, f"iteration_{self.current_step()}")
        os.makedirs(where, exist_ok=True)
        prof.export_chrome_trace(os.path.join(where, self.name))

    def step(self) -> None:
        if self._profiler is None:
            self._start()
        self._profiler.step()

    def close(self) -> None:
        """Stop profiling (a window cut short is not written); only from the thread that started it."""
        if self._profiler is None or threading.get_ident() != self._thread:
            return
        profiler, self._profiler = self._profiler, None
        profiler.on_trace_ready = None
        try:
            profiler.__exit__(None, None, None)
        except Exception:
            pass
