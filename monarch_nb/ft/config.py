"""What a fault-tolerant run is made of, checked before any process starts.

:class:`RunConfig` is a frozen dataclass: replica groups and their size, the torchtitan
model flavour, the train step's shape (sequence length, batch, learning rate), torchft's
timing knobs (heartbeat, quorum, process-group timeout), how the controller decides that
a group is hung, the restart policy and the platform. ``validate()`` raises ``ValueError``
naming the offending field and the values it accepts; ``FTRun`` calls it first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .platform import PLATFORMS
from .restart import RestartPolicy

# Llama 3 flavours in torchtitan 0.3.0 (torchtitan.models.llama3.llama3_configs). Listed here
# so that validation does not import torchtitan (6 s) in the controller.
MODELS = ("debugmodel", "1B", "3B", "8B", "70B", "405B")
JOBS = ("local", "process", "slurm", "kubernetes")
MAX_GROUPS = 64  # replica groups + spares of one run; beyond it, a typo is likelier than a plan


@dataclass(frozen=True)
class RunConfig:
    # topology
    replicas: int = 3  # R replica groups (torchft replicas)
    spares: int = 0  # warm standby groups, built and waiting outside the quorum, to replace failed ones
    group_size: int = 1  # G processes per group (FSDP inside the group when > 1)
    job: str = "local"  # where groups run: local procs, ProcessJob "hosts", SLURM, Kubernetes
    partition: str | None = None  # job="slurm": SLURM partition (None: the cluster's default)
    time_limit: str | None = None  # job="slurm": wall-clock limit of each allocation, e.g. "02:00:00"
    allocation_timeout_s: float = 120.0  # job="slurm": how long an allocation may stay pending
    # model and train step (torchtitan Llama 3)
    model: str = "debugmodel"
    steps: int | None = None  # None: train until stop()
    seq_len: int = 64
    batch_size: int = 2  # per process
    lr: float = 8e-4
    warmup_steps: int = 2
    seed: int = 0
    # platform
    platform: str = "auto"  # auto, cpu, cuda, rocm
    backend: str | None = None  # override the collective backend (gloo / nccl)
    threads_per_proc: int = 1  # torch intra-op threads in each worker
    # torchft
    min_replicas: int = 1
    heartbeat_timeout_ms: int = 300  # a group silent this long leaves the quorum: bounds survivor stalls
    join_timeout_ms: int = 1000
    quorum_tick_ms: int = 20
    pg_timeout_s: float = 10.0  # cross-replica collectives give up after this
    quorum_timeout_s: float = 60.0
    heal_transport: str = "http"  # how a recovering group gets a peer's state: "http" or "pg" (see README)
    # Address each worker's torchft servers advertise to its peers: None picks by placement
    # (127.0.0.1 on this machine; the node's own address, from its hostname, on a cluster).
    advertise_host: str | None = None
    # controller
    poll_interval_s: float = 0.25  # how often each group's telemetry is drained
    hang_timeout_s: float = 5.0  # a group that answers nothing for this long is hung
    init_timeout_s: float = 180.0  # actor construction (imports, model build)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    check_identical: bool = True  # hash parameters + optimizer state after every heal
    runs_root: str | None = None  # default: $MONARCH_NB_RUNS or ./runs
    run_name: str | None = None
    data_dir: str | None = None  # default: the locally built tiny tokenizer + corpus
    env: dict[str, str] = field(default_factory=dict)  # extra environment for workers

    def validate(self) -> "RunConfig":
        def need_int(name: str, lo: int) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")

        def need_pos(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}: must be a number > 0, got {v!r}")

        need_int("replicas", 1)
        need_int("spares", 0)
        if self.replicas + self.spares > MAX_GROUPS:
            raise ValueError(f"replicas: {self.replicas} groups + {self.spares} spares is more than {MAX_GROUPS}; "
                             f"allowed: at most {MAX_GROUPS} in all")
        need_int("group_size", 1)
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; allowed values: {', '.join(MODELS)}")
        if self.job not in JOBS:
            raise ValueError(f"job: unknown value {self.job!r}; allowed values: {', '.join(JOBS)}")
        if self.job == "slurm":
            self.slurm_spec()
        elif self.partition is not None or self.time_limit is not None:
            raise ValueError(f"partition: only for job='slurm' (this run has job={self.job!r})")
        if self.steps is not None:
            need_int("steps", 1)
        need_int("seq_len", 8)
        need_int("batch_size", 1)
        need_int("warmup_steps", 0)
        need_int("threads_per_proc", 1)
        need_pos("lr")
        if self.platform not in PLATFORMS:
            raise ValueError(f"platform: unknown value {self.platform!r}; allowed values: {', '.join(PLATFORMS)}")
        if self.heal_transport not in ("http", "pg"):
            raise ValueError(f"heal_transport: unknown value {self.heal_transport!r}; allowed values: http, pg")
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend: unknown value {self.backend!r}; allowed values: gloo, nccl (or None: auto)")
        need_int("min_replicas", 1)
        if self.min_replicas > self.replicas:
            raise ValueError(f"min_replicas: {self.min_replicas} exceeds replicas ({self.replicas}); "
                             f"allowed values: 1..{self.replicas}")
        for name in ("heartbeat_timeout_ms", "join_timeout_ms", "quorum_tick_ms"):
            need_int(name, 1)
        for name in ("pg_timeout_s", "quorum_timeout_s", "poll_interval_s", "hang_timeout_s", "init_timeout_s"):
            need_pos(name)
        if self.hang_timeout_s <= self.poll_interval_s:
            raise ValueError(f"hang_timeout_s: must exceed poll_interval_s ({self.poll_interval_s}), "
                             f"got {self.hang_timeout_s!r}")
        if not isinstance(self.restart, RestartPolicy):
            raise ValueError(f"restart: must be a RestartPolicy, got {type(self.restart).__name__}")
        self.restart.validate()
        if not isinstance(self.env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in self.env.items()):
            raise ValueError("env: must map str to str")
        return self

    def slurm_spec(self) -> Any:
        """What each group's SLURM allocation asks for (job="slurm")."""
        from ..jobs.slurm import SlurmSpec

        return SlurmSpec(partition=self.partition, time_limit=self.time_limit,
                         start_timeout_s=self.allocation_timeout_s).validate()

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown config field; allowed fields: {', '.join(sorted(known))}")
        if isinstance(data.get("restart"), dict):
            data["restart"] = RestartPolicy(**data["restart"])
        return cls(**data)
