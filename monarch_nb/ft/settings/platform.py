"""Where tensors live and which collective backend moves them: decided here, and only here.

Everything else in ``monarch_nb.ft`` asks this module for a :class:`Platform` instead of
probing hardware itself, so a CPU laptop, an NVIDIA node and an AMD node run the same
code path. ROCm builds of PyTorch expose AMD GPUs through the ``torch.cuda`` API and
implement the ``nccl`` backend with RCCL, so "rocm" maps to device type ``cuda`` and
backend ``nccl``; ``torch.version.hip`` tells the two GPU vendors apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PLATFORMS = ("auto", "cpu", "cuda", "rocm")
DEVICE_SLOT_ENV = "MONARCH_NB_DEVICE_SLOT"  # which group's GPUs a process takes on a shared host


@dataclass(frozen=True)
class Platform:
    name: str  # "cpu", "cuda" or "rocm"
    device_type: str  # torch device type: "cpu" or "cuda" (ROCm uses the cuda API)
    backend: str  # torch.distributed / torchft process group backend: "gloo" or "nccl"

    def device(self, index: int = 0) -> Any:
        """The device of the process in slot ``index`` on its host (groups on one host get GPUs
        one after another; more slots than GPUs wrap around)."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, index % max(1, torch.cuda.device_count()))

    def describe(self) -> str:
        extra = " (RCCL)" if self.name == "rocm" else ""
        return f"{self.name}: device={self.device_type}, backend={self.backend}{extra}"


def _gpu_vendor(torch_module: Any) -> str | None:
    """'rocm', 'cuda' or None, from an imported torch (passed in so tests can fake one)."""
    if not torch_module.cuda.is_available():
        return None
    return "rocm" if getattr(torch_module.version, "hip", None) else "cuda"


def select_platform(requested: str = "auto", *, backend: str | None = None, torch_module: Any = None) -> Platform:
    """Resolve ``requested`` ("auto", "cpu", "cuda", "rocm") to a Platform.

    ``backend`` overrides the collective backend (e.g. "gloo" on GPUs for debugging).
    Raises ``ValueError`` naming the allowed values, or when a GPU platform is requested
    on a machine without one.
    """
    if requested not in PLATFORMS:
        raise ValueError(f"platform: unknown value {requested!r}; allowed values: {', '.join(PLATFORMS)}")
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: unknown value {backend!r}; allowed values: gloo, nccl")
    if torch_module is None:
        import torch as torch_module
    vendor = _gpu_vendor(torch_module)
    if requested == "auto":
        name = vendor or "cpu"
    else:
        name = requested
        if name != "cpu" and vendor != name:
            have = vendor or "no GPU"
            raise ValueError(f"platform: {name!r} requested but this machine has {have}; allowed here: auto, cpu"
                             + (f", {vendor}" if vendor else ""))
    if name == "cpu":
        if backend == "nccl":
            raise ValueError("backend: 'nccl' needs GPUs and this platform is cpu; use backend='gloo' (or None)")
        return Platform("cpu", "cpu", backend or "gloo")
    if backend == "gloo":
        return Platform(name, "cuda", "gloo")
    return Platform(name, "cuda", "nccl")


def check_gpu_sharing(platform: Platform, groups: int, group_size: int, devices: int) -> None:
    """NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected").
    The cross-replica communicator holds rank k of every group, so groups that share a host
    need a GPU each per rank. Raise, naming the numbers and the ways out, before anything starts."""
    if platform.device_type == "cpu" or platform.backend != "nccl":
        return
    need = groups * group_size
    if need > devices:
        raise ValueError(
            f"backend: nccl cannot put two ranks of one communicator on the same GPU, and {groups} groups "
            f"(spares included) x {group_size} process(es) on this host need {need} GPUs; this host has {devices}. "
            "Use backend='gloo' (%monarch train --backend gloo: GPU tensors, gloo collectives), fewer groups, "
            "or a cluster (job='slurm': one node per group)")
