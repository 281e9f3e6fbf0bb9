"""What a fault-tolerant run is made of, checked before any process starts.

:class:`RunConfig` is a frozen dataclass: replica groups and their size, the torchtitan
model flavour, the train step's shape (sequence length, batch, learning rate), torchft's
timing knobs (heartbeat, quorum, process-group timeout), how the controller decides that
a group is hung, the respawn backoff and the platform. ``validate()`` raises ``ValueError``
naming the offending field and the values it accepts; ``FTRun`` calls it first.
``RunConfig.from_toml(path)`` reads a torchtitan-style job file (:mod:`.jobfile` holds the
mapping of its sections and keys); ``help(RunConfig)`` documents every field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .field_checks import check_heal_interface, check_stragglers, refuse_unknown_fields
from .flavors import FLAVOR_NAMES
from .jobfile import read_job_file
from .platform import PLATFORMS
from .respawn import RespawnBackoff
from .titan_parts import TitanParts
from .trainer_checks import check_model, check_schedule, finite

# Llama 3 flavours: torchtitan 0.3.0's (torchtitan.models.llama3.llama3_configs) and monarch_nb's
# "small" and "medium" (monarch_nb/ft/settings/flavors.py), smallest first. Listed without importing
# torchtitan (6 s) in the controller.
MODELS = FLAVOR_NAMES
JOBS = ("local", "process", "slurm", "kubernetes")
MAX_GROUPS = 64  # replica groups + spares of one run; beyond it, a typo is likelier than a plan
HEAL_TRANSPORTS = ("striped", "http", "pg")


def is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def refuse_exposure(field: str, shown: str, host: str, job: str, expose: bool) -> None:
    """A local run serves its state only on loopback unless ``expose``: checked for
    ``advertise_host`` here and, once a worker knows its address, for ``heal_interface``."""
    if job in ("local", "process") and not expose and not is_loopback(host):
        raise ValueError(f"{field}: {shown} is not a loopback address; a local run keeps its servers on this "
                         "machine. Set expose=True to let other hosts connect")


# A run name is one path component of these, so a run directory is always a child of the runs root.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RESERVED_RUN_NAMES = ("sessions",)  # runs_root/sessions holds the sessions' own logs


def check_run_name(name: object) -> None:
    """Refuse a run name that is not one safe path component (``ValueError`` naming the rule)."""
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name) or name in RESERVED_RUN_NAMES:
        raise ValueError(f"run_name: {name!r} is not allowed: a run name is one directory name of 1-100 letters, "
                         "digits, '.', '_' or '-', starting with a letter or digit (no '/', '..', spaces or "
                         f"control characters; not {', '.join(map(repr, RESERVED_RUN_NAMES))}); "
                         "or leave it out for a timestamp")


ON_FAILURE = ("peer", "restart", "plain_restart")
# Where the recovery ladder may start (its rungs, lowest first: ft/control/ladder.py RUNGS).
LOWEST_RUNGS = ("communicator", "process")
QUORUMS = ("sync", "async")
SYNCS = ("step", "local_sgd", "diloco")
# every failure restarts the whole run from its newest checkpoint
RESTARTS = ("restart", "plain_restart")

# Fields renamed since runs were first recorded, old name -> name now: a run's recorded config,
# an old job file or an old dict still loads (:func:`current_names`).
RENAMED_FIELDS = {"recovery": "on_failure"}


def current_names(values: dict[str, Any], origins: dict[str, str] | None = None) -> dict[str, Any]:
    """``values`` (RunConfig fields by name) with every field of :data:`RENAMED_FIELDS` under its
    name now. ``origins`` (a job file's key for each field) follows the rename. An old and a new
    name given with different values are refused (``ValueError`` naming both and the fix)."""
    values = dict(values)
    origins = origins if origins is not None else {}
    for old, new in RENAMED_FIELDS.items():
        if old not in values:
            continue
        value = values.pop(old)
        if new in values and values[new] != value:
            raise ValueError(f"{new}: {origins.get(new, new)} = {values[new]!r} and {origins.get(old, old)} = "
                             f"{value!r} (its older name) differ; keep only {origins.get(new, new)}")
        values[new] = value
        where = origins.pop(old, None)
        if where is not None and new not in origins:
            origins[new] = where
    return values


@dataclass(frozen=True)
class RunConfig:
    """Everything a fault-tolerant run needs, checked by :meth:`validate` before anything starts.

    Build one with keywords (``RunConfig(replicas=3, steps=200)``), from a torchtitan-style job
    file (:meth:`from_toml`), or from a dict (:meth:`from_dict`); change one with
    :meth:`replace`. Every field has a default that runs on a laptop CPU.

    Topology:
        replicas: R replica groups, each a torchft replica (default 3), averaging gradients
            across the groups in each step's quorum.
        group_size: G processes per group (default 1); G > 1 shards the model with FSDP
            (``parallelize_llama``), and any of its processes failing fails the group.
        min_replicas: fewest groups a step may commit with (default 1, at most ``replicas``);
            torchft's ``min_replica_size``. Fewer live groups: the survivors wait.

    Where groups run (``job``) and SLURM:
        job: "local" (default: processes on this machine), "process" (each group on its own
            Monarch ProcessJob host), "slurm" (each group on its own SLURM allocation; a
            failed group gets a fresh one) or "kubernetes".
        partition: job="slurm" only: the SLURM partition (None: the cluster's default).
        controller_on: where a named run's controller lives: "local" (default: a process of its
            own on this machine) or "cluster" (a SLURM job / a Kubernetes Job's pod of its own).
        time_limit: job="slurm" only: each allocation's wall-clock limit, "MM", "HH:MM:SS" or
            "D-HH:MM:SS" (None: 24 hours; one that runs out is recovered on a fresh one).
        allocation_timeout_s: job="slurm": seconds an allocation may stay pending before
            the start (or a recovery) gives up (default 120).
        kubernetes: job="kubernetes" only: ``KubernetesSpec`` fields as a dict (None: the cluster of
            ``./run.sh k8s up``). Each group gets a pod set of its own; a failed group a fresh one.

    Warm spares:
        spares: K standby groups (default 0): processes, model and optimizer built, no torchft
            Manager (no quorum waits for them); a failed group takes a ready one. Not with
            job="process".

    Model and train step (torchtitan Llama 3):
        model: the flavour (default "debugmodel", 6.2M parameters): "tiny" (~0.4M), "debugmodel", "small"
            (~104M), "medium" (~409M) or torchtitan's "1B", "3B", "8B", "70B", "405B"; or a torchtitan
            registry model through its model spec, "MODULE/FLAVOR" ("qwen3/debugmodel"; ``flavors``).
        steps: train steps each group commits, then stops (None, default: until ``stop()``);
            also the learning-rate schedule's length (10,000 when None).
        seq_len: tokens per sequence (default 64, at least 8).
        batch_size: sequences per process per step (default 2).
        lr: peak AdamW learning rate (default 8e-4); torchtitan's AdamW (weight decay 0.1).
        warmup_steps: steps of linear warm-up to ``lr`` (default 2); then the decay below
            (torchtitan's LRSchedulersContainer).
        lr_decay_ratio: the last fraction of ``steps`` the lr decays over (default 0.8).
        lr_decay_type: "linear" (default), "sqrt" or "cosine".
        lr_min_factor: the lr decays to this fraction of ``lr`` (default 0.1).
        max_norm: gradient clipping norm (default 1.0; torchtitan's ``training.max_norm``).
        seed: seed of the model's initial weights, the same in every group (default 0). The
            data is a fixed function of (step, group, rank), not of the seed.

    Platform:
        platform: "auto" (default: a GPU if torch sees one, else CPU), "cpu", "cuda" or "rocm".
        backend: "gloo" or "nccl" (None, default: nccl on GPUs, gloo on CPU).
        pg_subprocess: the cross-group communicator runs in a subprocess that an abort kills
            (torchft's ProcessGroupBabyGloo / BabyNCCL; default False: in the worker, which measured
            faster at every size tried - RESULTS.md, "The communicator in a subprocess").
        threads_per_proc: torch intra-op threads in each worker process (default 1).

    torchft timing and transport:
        heartbeat_timeout_ms: a group whose heartbeats (every 100 ms) stop for this long
            leaves the quorum (default 300). It bounds how long survivors stall when a peer
            dies; too short drops slow-but-alive groups.
        join_timeout_ms: how long the Lighthouse waits for more groups to join before it
            forms a quorum with the ones it has (default 1000). When every group shares this
            host, stretched by processes per core (at most 8x): survivors starved of CPU come to
            the next quorum late, and one left out must heal from a peer. LocalSGD / DiLoCo: times
            the steps between meetings, at most 60 s (the groups come to a meeting spread).
        quorum_tick_ms: how often the Lighthouse re-evaluates the quorum (default 20).
        pg_timeout_s: cross-replica collectives give up after this (default 10 s); a quorum's new
            gloo group must connect within a quarter of it (a member that died as the quorum
            formed is found that fast); the group's own FSDP process group gets 6 x this.
        quorum_timeout_s: how long a group waits for a quorum (default 10), then asks again
            with a fresh torchft Manager that keeps its step (a lost Lighthouse, restarted).
        heal_transport: how a recovering group gets a live peer's state: "striped" (default:
            raw bytes from every up-to-date peer at once, each piece checked against the donor's
            xxh3 digest, refetched elsewhere if it differs; ft/worker/heal_transport.py), "http"
            (torchft's HTTPTransport: one peer, unchecked) or "pg" (torchft's PGTransport).
        heal_streams: parallel connections per donor in a "striped" heal (default 4: one
            stream is bound by one core on each side).
        heal_interface: the network interface "striped" and "http" heals go over, by name (e.g.
            "ib0"); None (default): advertise_host's (a slow management network: torchft #329).
        advertise_host: the address each worker's torchft servers advertise to peers. None
            (default) picks by placement: 127.0.0.1 on this machine, the node's own address
            on a cluster; "auto" resolves the worker's hostname. A local run refuses a
            non-loopback address unless ``expose=True``.
        expose: let a local run advertise a non-loopback address (default False).

    Durable checkpoints and what a failure does (ft/worker/checkpointer.py, ft/control/checkpoint_folder.py,
    ft/control/responses.py):
        checkpoint_every: committed steps between durable checkpoints (torch DCP, written
            asynchronously by one group); None (default): none. torchtitan's
            ``[checkpoint] enable`` + ``interval``.
        checkpoint_dir: where checkpoints go; None (default): ``<run_dir>/checkpoints``; a
            relative path is inside the run directory (torchtitan's ``[checkpoint] folder``).
            The folder belongs to one run (its ``manifest.json``): a run refuses another's,
            and never prunes, overwrites or resumes from another run's checkpoints.
        checkpoint_keep: newest complete checkpoints kept, older ones deleted (default 3).
            torchtitan's ``[checkpoint] keep_latest_k``.
        on_failure: "peer" (default): only the failed group is brought back (the recovery
            ladder), the others train on; "restart": on any failure every group restarts from
            the newest durable checkpoint (the baseline bench_goodput.py compares);
            "plain_restart": the same without torchft, one process group over the job as under
            torchrun (ft/worker/plain_replication.py; no spares, every group in every step). Its
            older name, ``recovery``, still reads (recorded runs, old job files and dicts).
        lowest_rung: where the recovery ladder (ft/control/ladder.py) may start: "communicator"
            (default: a live process whose communicator broke or whose step raised is repaired
            in place), or "process" (every fault replaces the process, as before the ladder).
        straggler: a group named slow (ft/control/stragglers.py): "observe", "drain" or "drop".
        straggler_factor: named at this many times below its peers' median throughput (1.3).
        straggler_window: ... over this many of its committed steps (20).
        repair_timeout_s: an in-place repair must bring its group back (a committed step)
            within this, else the ladder replaces the process (default 20).
        quorum: torchft's quorum per step: "sync" (default: before the forward pass) or "async"
            (torchtitan's default: beside it; measured no faster on a 2-core box, see RESULTS.md).
        sync: "step" (default: gradients averaged every step), "local_sgd" or "diloco" (torchft's,
            via torchtitan): each group trains alone and the groups meet every ``sync_every`` steps.
        sync_every: steps between meetings (torchtitan's ``sync_steps``; default 20).
        fragments: DiLoCo in this many staggered pieces: streaming DiLoCo (``num_fragments``; default 1).
        resume_from: start this new run from a durable checkpoint written by another run: a
            ``step-N`` directory, or a checkpoint folder (its newest complete checkpoint). Its
            weights, optimizer state, LR schedule and step are loaded into every group before
            the first step, and the ``resumed`` event names the source run. Refused when the
            checkpoint's model or group size differs. (To continue the *same* run, use
            ``FTRun.resume(run_dir)``.) None (default): start from the initial weights.

    Controller (the notebook kernel):
        poll_interval_s: how often each group's telemetry is drained (default 0.25 s). With
            more than 8 groups each is polled less often, so that the controller makes at
            most 32 polls a second in all (32 groups: one poll per group per second); never
            less often than a quarter of ``hang_timeout_s``.
        hang_timeout_s: a group that answers nothing for this long is declared hung and
            replaced (default 5 s; must exceed ``poll_interval_s``). Longer on a host with
            more runnable work than cores (up to 8x) or while most groups are silent at once
            (4x): a starved or overloaded process is not hung (``Supervisor.hang_deadline``).
        init_timeout_s: how long building a group's trainers may take (imports, model and
            optimizer), at start and at every respawn (default 180 s).
        respawn: :class:`RespawnBackoff`: how many times a failed group is brought back and
            how long to wait between attempts in a row (default: up to 10 per group over the
            run, with a growing wait; see ``help(RespawnBackoff)``).
        check_identical: after every rejoin, prove the replicas bit-identical by hashing
            parameters and optimizer state at a common step (default True).
        runs_root: where run directories go (None, default: $MONARCH_NB_RUNS, else ./runs).
        run_name: the run directory's name (None, default: a timestamp); must be new, and one
            directory name of letters, digits, '.', '_' and '-' (at most 100).
        titan: :class:`TitanParts`: a torchtitan 0.3 job's dataset, tokenizer and activation
            checkpointing, built by torchtitan's code (None: data_dir's, no checkpointing).
        data_dir: a directory with ``tokenizer.json``, ``tokenizer_config.json`` and ``corpus.jsonl``
            (None, default: a tiny tokenizer and corpus built here; token ids below the vocabulary).
        env: extra environment variables for every worker process (default none).
    """

    # topology
    replicas: int = 3  # R replica groups (torchft replicas)
    spares: int = 0  # warm standby groups, built and waiting outside the quorum, to replace failed ones
    group_size: int = 1  # G processes per group (FSDP inside the group when > 1)
    job: str = "local"  # where groups run: local procs, ProcessJob "hosts", SLURM, Kubernetes
    partition: str | None = None  # job="slurm": SLURM partition (None: the cluster's default)
    time_limit: str | None = None  # job="slurm": wall-clock limit of each allocation, e.g. "02:00:00"
    allocation_timeout_s: float = 120.0  # job="slurm": how long an allocation may stay pending
    kubernetes: dict[str, Any] | None = None  # job="kubernetes": KubernetesSpec fields (None: local_k8s.spec())
    # model and train step (torchtitan Llama 3)
    model: str = "debugmodel"  # flavour: debugmodel, small, medium, 1B, ... (MODELS), or "qwen3/debugmodel"
    steps: int | None = None  # None: train until stop()
    seq_len: int = 64  # tokens per sequence
    batch_size: int = 2  # sequences per process per step
    lr: float = 8e-4  # peak AdamW learning rate
    warmup_steps: int = 2  # linear warm-up steps, then decay (torchtitan's LRSchedulersContainer)
    lr_decay_ratio: float = 0.8  # the last fraction of steps that decay (torchtitan's decay_ratio)
    lr_decay_type: str = "linear"  # linear, sqrt or cosine (torchtitan's decay_type)
    lr_min_factor: float = 0.1  # the lr decays to this fraction of lr (torchtitan's min_lr_factor)
    max_norm: float = 1.0  # gradient clipping norm (torchtitan's training.max_norm)
    seed: int = 0  # initial weights (the same in every group)
    # platform
    platform: str = "auto"  # auto, cpu, cuda, rocm
    backend: str | None = None  # override the collective backend (gloo / nccl)
    pg_subprocess: bool = False  # the cross-group communicator in a subprocess (torchft's Baby groups)
    threads_per_proc: int = 1  # torch intra-op threads in each worker
    # torchft
    min_replicas: int = 1  # fewest groups a step may commit with (torchft's min_replica_size)
    heartbeat_timeout_ms: int = 300  # a group silent this long leaves the quorum: bounds survivor stalls
    join_timeout_ms: int = 1000  # the Lighthouse waits this long for more groups before forming a quorum
    quorum_tick_ms: int = 20  # how often the Lighthouse re-evaluates the quorum
    pg_timeout_s: float = 10.0  # cross-replica collectives give up after this
    quorum_timeout_s: float = 10.0  # a group waits this long for a quorum, then asks again
    heal_transport: str = "striped"  # how a recovering group gets peers' state: "striped", "http" or "pg"
    heal_streams: int = 4  # connections per donor in a striped heal
    heal_interface: str | None = None  # interface heals go over (its address); None: advertise_host's
    # Address each worker's torchft servers advertise to its peers: None picks by placement
    # (127.0.0.1 on this machine; the node's own address, from its hostname, on a cluster).
    advertise_host: str | None = None
    expose: bool = False  # opt-in: let a local run advertise a non-loopback address
    # durable checkpoints (ft/worker/checkpointer.py); a finished run always writes its final one
    checkpoint_every: int | None = None  # steps between checkpoints; None: only the final one
    checkpoint_dir: str | None = None  # where checkpoints go; None or relative: inside the run directory
    checkpoint_keep: int = 3  # newest checkpoints kept
    on_failure: str = "peer"  # "peer": heal from a live peer; "restart": every group restarts from disk
    resume_from: str | None = None  # a new run starts from another run's checkpoint (named, recorded)
    lowest_rung: str = "communicator"  # the ladder's lowest rung; "process": replace every failed process
    straggler: str = "observe"  # a group named slow: "observe", "drain" (move it) or "drop" (let it go, replace)
    straggler_factor: float = 1.3  # named slow at this many times below its peers' median throughput
    straggler_window: int = 20  # ... over this many committed steps of each group
    repair_timeout_s: float = 20.0  # an in-place repair brings its group back within this, else escalates
    quorum: str = "sync"  # torchft's per-step quorum: before the forward pass, or "async" beside it
    sync: str = "step"  # "local_sgd" / "diloco": semi-synchronous, the groups meet every sync_every steps
    sync_every: int = 20  # torchtitan's sync_steps
    fragments: int = 1  # torchtitan's num_fragments (diloco)
    # controller
    controller_on: str = "local"  # a named run's host: "local" (this machine) or "cluster" (its cluster's job)
    poll_interval_s: float = 0.25  # how often each group's telemetry is drained
    hang_timeout_s: float = 5.0  # a group that answers nothing for this long is hung
    init_timeout_s: float = 180.0  # actor construction (imports, model build)
    respawn: RespawnBackoff = field(default_factory=RespawnBackoff)  # respawns per group, backoff
    check_identical: bool = True  # hash parameters + optimizer state after every heal
    runs_root: str | None = None  # default: $MONARCH_NB_RUNS or ./runs
    run_name: str | None = None  # default: a timestamp
    data_dir: str | None = None  # default: the locally built tiny tokenizer + corpus
    titan: TitanParts | None = None  # a torchtitan 0.3 job's dataset, tokenizer, activation checkpointing
    env: dict[str, str] = field(default_factory=dict)  # extra environment for workers

    def validate(self) -> "RunConfig":
        def need_int(name: str, lo: int) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")

        def need_one_of(name: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: unknown value {getattr(self, name)!r}; allowed values: {', '.join(allowed)}")

        def need_pos(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not finite(v) or v <= 0:
                raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")

        need_int("replicas", 1)
        need_int("spares", 0)
        if self.advertise_host not in (None, "auto"):
            refuse_exposure("advertise_host", repr(self.advertise_host), self.advertise_host, self.job, self.expose)
        if self.replicas + self.spares > MAX_GROUPS:
            raise ValueError(f"replicas: {self.replicas} groups + {self.spares} spares is more than {MAX_GROUPS}; "
                             f"allowed: at most {MAX_GROUPS} in all")
        need_int("group_size", 1)
        check_model(self.model)
        need_one_of("job", JOBS)
        check_job_fields(self)
        if self.steps is not None:
            need_int("steps", 1)
        need_int("seq_len", 8)
        need_int("batch_size", 1)
        need_int("warmup_steps", 0)
        check_schedule(self)
        need_int("threads_per_proc", 1)
        need_pos("lr")
        need_one_of("platform", PLATFORMS)
        need_one_of("heal_transport", HEAL_TRANSPORTS)
        need_int("heal_streams", 1)
        check_heal_interface(self)
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend: unknown value {self.backend!r}; allowed values: gloo, nccl (or None: auto)")
        need_int("min_replicas", 1)
        if self.min_replicas > self.replicas:
            raise ValueError(f"min_replicas: {self.min_replicas} exceeds replicas ({self.replicas}); "
                             f"allowed values: 1..{self.replicas}")
        for name in ("heartbeat_timeout_ms", "join_timeout_ms", "quorum_tick_ms"):
            need_int(name, 1)
        need_one_of("lowest_rung", LOWEST_RUNGS)
        check_stragglers(self)
        need_one_of("quorum", QUORUMS)
        need_one_of("sync", SYNCS)
        need_int("sync_every", 1)
        need_int("fragments", 1)
        check_sync(self)
        for name in ("pg_timeout_s", "quorum_timeout_s", "poll_interval_s", "hang_timeout_s", "init_timeout_s",
                     "repair_timeout_s"):
            need_pos(name)
        if self.hang_timeout_s <= self.poll_interval_s:
            raise ValueError(f"hang_timeout_s: must exceed poll_interval_s ({self.poll_interval_s}), "
                             f"got {self.hang_timeout_s!r}")
        if self.checkpoint_every is not None:
            need_int("checkpoint_every", 1)
        if self.checkpoint_dir is not None and (not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir):
            raise ValueError(f"checkpoint_dir: must be a directory path (or None: inside the run directory), "
                             f"got {self.checkpoint_dir!r}")
        need_int("checkpoint_keep", 1)
        if self.resume_from is not None and (not isinstance(self.resume_from, str) or not self.resume_from):
            raise ValueError(f"resume_from: must be a checkpoint path (a step-N directory or a checkpoint folder), "
                             f"got {self.resume_from!r}")
        if self.run_name is not None:
            check_run_name(self.run_name)
        if self.runs_root is not None and (not isinstance(self.runs_root, str) or not self.runs_root):
            raise ValueError(f"runs_root: must be a directory path (or None: $MONARCH_NB_RUNS or ./runs), "
                             f"got {self.runs_root!r}")
        need_one_of("on_failure", ON_FAILURE)
        if self.on_failure == "plain_restart" and self.spares:
            raise ValueError(f"spares: a plain_restart job restarts every process on a failure, a warm spare has "
                             f"nothing to replace; got spares={self.spares} (use on_failure='peer' for spares)")
        for name, kind in (("respawn", RespawnBackoff), ("titan", TitanParts)):
            value = getattr(self, name)
            if not isinstance(value, kind) and not (name == "titan" and value is None):
                raise ValueError(f"{name}: must be a {kind.__name__}, got {type(value).__name__}")
            if value is not None:
                value.validate()
        if not isinstance(self.env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in self.env.items()):
            raise ValueError("env: must map str to str")
        return self

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """A config from :meth:`to_dict`'s output (a run's recorded config); fields under an older
        name (:data:`RENAMED_FIELDS`, ``restart`` for ``respawn``) load under their name now."""
        data = current_names(data)
        if isinstance(data.get("restart"), dict) and "respawn" not in data:  # a run recorded before the rename
            old = dict(data.pop("restart"))
            if "max_restarts" in old:
                old["max_respawns"] = old.pop("max_restarts")
            data["respawn"] = old
        refuse_unknown_fields(data, {f.name for f in dataclasses.fields(cls)})
        return cls(**{**data, **nested_from_dict(data)})

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> "RunConfig":
        """A validated config from a torchtitan-style TOML job file (the legacy form, torchtitan up to
        0.2; 0.3's own form is ``titan_job``); ``overrides`` (RunConfig fields) replace what the file
        says. The keys it takes are ``monarch_nb.ft.settings.jobfile.SECTIONS`` plus ``[monarch_nb]`` with
        any RunConfig field by name; anything else, a wrong type, a field set twice or a value
        ``validate()`` refuses raises ``ValueError`` naming the file's section and key.

        Example: ``RunConfig.from_toml("examples/llama3_debug_ft.toml", steps=50)``.
        """
        path = find_job_file(path)
        values, origins = read_job_file(path, typing.get_type_hints(cls), renamed=RENAMED_FIELDS)
        try:
            values = current_names(values, origins)
        except ValueError as exc:
            raise ValueError(f"{exc} ({path})") from None
        refuse_unknown_fields(overrides, {f.name for f in dataclasses.fields(cls)})
        cfg = cls(**{**values, **overrides})
        try:
            return cfg.validate()
        except ValueError as exc:
            raise ValueError(_name_the_file_key(str(exc), origins, set(overrides), str(path))) from None


def nested_from_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The nested dataclass fields (``respawn``, ``titan``) of a recorded config, rebuilt from dicts."""
    out = {}
    for name, kind in (("respawn", RespawnBackoff), ("titan", TitanParts)):
        if isinstance(data.get(name), dict):
            allowed = {f.name for f in dataclasses.fields(kind)}
            extra = sorted(set(data[name]) - allowed, key=str)
            if extra:
                raise ValueError(f"{name}.{extra[0]}: unknown key; allowed keys: {', '.join(sorted(allowed))}")
            out[name] = kind(**data[name])
    return out


def slurm_spec(config: "RunConfig") -> Any:
    """What each group's SLURM allocation asks for (job="slurm")."""
    from ...jobs.slurm import SlurmSpec

    try:
        return SlurmSpec(partition=config.partition, time_limit=config.time_limit,
                         start_timeout_s=config.allocation_timeout_s).validate()
    except ValueError as exc:  # the spec's own name for the field is not ours
        message = str(exc)
        if message.startswith("start_timeout_s:"):
            message = "allocation_timeout_s:" + message[len("start_timeout_s:"):]
        raise ValueError(message) from None


def check_job_fields(config: "RunConfig") -> None:
    """Fields of one kind of job are refused for another; each job's own spec is validated."""
    if config.controller_on not in ("local", "cluster"):
        raise ValueError(f"controller_on: unknown value {config.controller_on!r}; allowed values: local, cluster")
    if config.controller_on == "cluster" and config.job not in ("slurm", "kubernetes"):
        raise ValueError(f"controller_on: 'cluster' places a run's controller on its cluster (a SLURM job, a "
                         f"Kubernetes pod); this run has job={config.job!r}: train on one (job='slurm' / "
                         f"'kubernetes', --slurm / --k8s) or keep the controller here (controller_on='local')")
    if config.job == "kubernetes":
        kubernetes_spec(config)
    elif config.kubernetes is not None:
        raise ValueError(f"kubernetes: only for job='kubernetes' (this run has job={config.job!r})")
    if config.job == "slurm":
        slurm_spec(config)
        return
    for name in ("partition", "time_limit"):
        if getattr(config, name) is not None:
            raise ValueError(f"{name}: only for job='slurm' (this run has job={config.job!r})")


def kubernetes_spec(config: "RunConfig") -> Any:
    """What each group's pod set asks for (job="kubernetes"): one pod of ``group_size`` processes."""
    from ...jobs.kubernetes import KubernetesSpec
    from ...jobs.kubernetes_host import in_host_pod

    if config.kubernetes is None:
        from ...jobs import local_k8s

        return in_host_pod(local_k8s.spec())
    if not isinstance(config.kubernetes, dict):
        raise ValueError(f"kubernetes: {config.kubernetes!r} is not a dict of KubernetesSpec fields")
    known = {f.name for f in dataclasses.fields(KubernetesSpec)}
    unknown = sorted(set(config.kubernetes) - known)
    if unknown:
        raise ValueError(f"kubernetes: unknown KubernetesSpec field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    fields = {k: tuple(v) if k in ("host_paths", "writable_paths") else v for k, v in config.kubernetes.items()}
    try:
        return in_host_pod(KubernetesSpec(**fields).validate())
    except ValueError as exc:
        raise ValueError(f"kubernetes.{exc}") from None


def meeting_period(sync: str | None, sync_every: Any, fragments: Any) -> int | None:
    """Steps between two meetings of a LocalSGD / DiLoCo run (streaming DiLoCo: of two fragments'
    meetings); None under per-step sync (or a period that is not a positive number of steps)."""
    if (sync or "step") == "step" or not isinstance(sync_every, int) or sync_every <= 0:
        return None
    return max(1, sync_every // int(fragments or 1))


def meets_every(config: "RunConfig") -> int | None:
    """Steps between the points where every group holds the same parameters: 1 under per-step
    sync, the sync period under LocalSGD or DiLoCo; None under streaming DiLoCo (never all at once)."""
    if config.sync == "step":
        return 1
    return meeting_period(config.sync, config.sync_every, 1) if config.fragments == 1 else None


def check_sync(config: "RunConfig") -> None:
    """Semi-synchronous training (torchft's LocalSGD and DiLoCo, through torchtitan) with what it
    is built for here: peer recovery, one process per group, durable checkpoints at meetings. Its
    meetings use the synchronous quorum whatever ``quorum`` says (DiLoCo requires it)."""
    c = config
    if c.fragments > 1 and c.sync != "diloco":
        raise ValueError(f"fragments: only for sync='diloco' (streaming DiLoCo), got fragments={c.fragments} "
                         f"with sync={c.sync!r}")
    if c.sync == "step":
        return
    if c.sync_every % c.fragments:
        raise ValueError(f"sync_every: {c.sync_every} steps must divide into fragments={c.fragments} "
                         f"(each fragment syncs every sync_every/fragments steps)")
    for name, value, need in (("on_failure", c.on_failure, "peer"), ("group_size", c.group_size, 1)):
        if value != need:
            raise ValueError(f"{name}: sync={c.sync!r} needs {name}={need!r} here, got {value!r}")
    if c.checkpoint_every and c.checkpoint_every % c.sync_every:
        raise ValueError(f"checkpoint_every: durable checkpoints of a {c.sync} run are taken at meetings, where "
                         f"every group holds the same state: {c.checkpoint_every} must be a multiple of "
                         f"sync_every={c.sync_every} (e.g. checkpoint_every={c.sync_every * max(1, round(c.checkpoint_every / c.sync_every))})")


def find_job_file(path: str | Path) -> Path:
    """A job file by its path: as given (absolute, or relative to the working directory), else
    relative to the project root - the nearest folder at or above the working directory that
    holds ``pyproject.toml`` or ``.git`` (JupyterLab and ``monarch-nb execute`` run notebooks in
    ``notebooks/``, where the README's ``examples/...`` paths would not resolve). A file found
    nowhere is refused naming every place looked and the working directory."""
    given = Path(path).expanduser()
    cwd = Path.cwd()
    tried = [given if given.is_absolute() else cwd / given]
    if not given.is_absolute():
        root = next((d for d in (cwd, *cwd.parents) if (d / "pyproject.toml").is_file() or (d / ".git").exists()),
                    None)
        if root is not None and root != cwd:
            tried.append(root / given)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise ValueError(f"config: {path} not found; looked in {' and '.join(map(str, tried))} (the working directory "
                     f"is {cwd}); give the job file's path, e.g. examples/llama3_debug_ft.toml from the project root")


def _name_the_file_key(message: str, origins: dict[str, str], overridden: set[str], path: str) -> str:
    """``seq_len: must be ...`` -> ``[training] seq_len: must be ... (RunConfig.seq_len; FILE)``
    when the file set that field (and no override replaced it)."""
    head, sep, rest = message.partition(":")
    root = head.split(".", 1)[0]
    if not sep or root in overridden:
        return message
    if root not in origins:  # a rule between two fields, named by the one the file did not set
        return f"{message} ({path})"
    where = origins[root] + head[len(root):]
    return f"{where}:{rest} (RunConfig.{head}; {path})"
