"""Meshes on SLURM allocations, through Monarch's ``SlurmJob``.

A :class:`SlurmAllocation` is one SLURM job holding the hosts of one mesh: ``start()`` checks
the cluster (SLURM installed and reachable, the partition exists, enough nodes), submits the
job, waits for it to run (polling ``squeue`` every 0.1 s, not Monarch's 2 s), and attaches to
its workers; any failure or interrupt on the way releases the job. ``release()`` cancels it
and waits until ``squeue`` no longer lists it. :func:`job_states` reads the state of many jobs
in one ``squeue`` call, which is how the session notices a preempted allocation or a downed
node within about a second.

The fixes SLURM 22.05 and one-machine clusters need are kept here and in ``seam`` (the
``SlurmJob`` subclass): 22.05's ``squeue --json`` shape, a client whose hostname resolves only
to loopback, and several virtual nodes of one machine (each worker gets its own UTS namespace
named after its node, so ``tcp://nK:port`` is distinct per node).
"""

from __future__ import annotations

import logging
import math
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import seam
from ..errors import MonarchNbError
from . import Allocation, JobStatus

_SQUEUE_TIMEOUT_S = 10.0
# States of a job that still holds (or may yet hold) its nodes.
_ALIVE_STATES = ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


class SlurmError(MonarchNbError):
    """SLURM said no, or is not there; the message names the fix."""


DEFAULT_TIME_LIMIT = "24:00:00"


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class SlurmSpec:
    """What to ask SLURM for, per mesh.

    Args:
        partition: SLURM partition (``--partition``); None: the cluster's default.
        time_limit: wall-clock limit ``[D-]HH:MM:SS`` (``--time``); None: 24 hours, so that an
            allocation whose controller died can never outlive it for long (the partition's limit
            is often unlimited). A fault-tolerant run recovers a group whose allocation ran out on a
            fresh one, as from a preemption, so a run may last longer than its allocations.
        start_timeout_s: how long a job may stay pending before it is released with an error
            naming SLURM's reason (e.g. ``Resources``).
        exclusive: whole nodes (``--exclusive``); False shares nodes by CPU.
        cpus_per_task: CPUs per node requested for the mesh's processes.
        slurm_args: extra ``#SBATCH`` options, e.g. ``("--account=ml", "--qos=high")``.
    """

    partition: str | None = None
    time_limit: str | None = None
    start_timeout_s: float = 60.0
    exclusive: bool = False
    cpus_per_task: int | None = 1
    slurm_args: tuple[str, ...] = ()

    def validate(self) -> "SlurmSpec":
        if self.partition is not None and (not isinstance(self.partition, str) or not self.partition.strip()):
            raise ValueError(f"partition: must be a partition name, got {self.partition!r}")
        if self.time_limit is not None and (not isinstance(self.time_limit, str) or not _valid_time(self.time_limit)):
            raise ValueError(f"time_limit: {self.time_limit!r} is not a SLURM time; use MM, HH:MM:SS or D-HH:MM:SS")
        if not isinstance(self.start_timeout_s, (int, float)) or isinstance(self.start_timeout_s, bool) \
                or not _finite(self.start_timeout_s) or self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s: must be a finite number > 0 seconds, got {self.start_timeout_s!r}")
        if self.cpus_per_task is not None and (not isinstance(self.cpus_per_task, int) or self.cpus_per_task < 1):
            raise ValueError(f"cpus_per_task: must be an integer >= 1, got {self.cpus_per_task!r}")
        bad = [a for a in self.slurm_args if not str(a).startswith("--")]
        if bad:
            raise ValueError(f"slurm_args: each must be an sbatch option like '--qos=high', got {bad[0]!r}")
        return self


def _valid_time(text: str) -> bool:
    return bool(re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", text.strip()))


def _run(cmd: list[str], timeout: float = _SQUEUE_TIMEOUT_S) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        raise SlurmError(f"SLURM is not installed here ({cmd[0]} is not on PATH); on one machine, "
                         "`./run.sh slurm up` installs and starts a local cluster")
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(cmd)}` did not answer within {timeout:g} s: is slurmctld up? "
                         "(`./run.sh slurm up` on one machine)") from None


def job_states(job_ids: list[str]) -> dict[str, JobStatus]:
    """The state of each job, in one ``squeue`` call; a job squeue no longer lists is GONE."""
    if not job_ids:
        return {}
    out = _run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"])
    found = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in job_ids:
            found[parts[0]] = JobStatus(parts[0], parts[1], parts[2], parts[3])
    return {j: found.get(j, JobStatus(j, "GONE")) for j in job_ids}


def jobs_named(fragment: str) -> list[str]:
    """Ids of the jobs in squeue whose name contains ``fragment``."""
    out = _run(["squeue", "-h", "-o", "%i|%j"])
    return [i for i, _, name in (line.strip().partition("|") for line in out.stdout.splitlines())
            if fragment in name]


def submit_batch(argv: list[str], *, name: str, log: Path, partition: str | None, time_limit: str | None) -> str:
    """``sbatch`` one command as a job of its own (one task, one CPU), started in this directory with
    this environment; returns its id. A run's host lives so (``ft/control/host_placement.py``): it is
    no Monarch mesh, so Monarch's SlurmJob has no part in it."""
    script = "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + "\n"
    cmd = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", "--ntasks=1", "--cpus-per-task=1",
           f"--time={time_limit or DEFAULT_TIME_LIMIT}", "--export=ALL", f"--chdir={Path.cwd()}"]
    if partition:
        cmd.append(f"--partition={partition}")
    try:
        out = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=_SQUEUE_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError("SLURM is not installed here (sbatch is not on PATH); on one machine, "
                         "`./run.sh slurm up` installs and starts a local cluster") from None
    return _check(out, "sbatch").stdout.strip().split(";")[0]


def alive(job_id: str) -> bool:
    """The job still holds (or may yet hold) its node."""
    return job_states([job_id])[job_id].state in _ALIVE_STATES


def cancel(job_id: str) -> None:
    _run(["scancel", job_id])


def _check(out: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if out.returncode != 0:
        raise SlurmError(f"{what} failed: {(out.stderr or out.stdout).strip()}")
    return out


def _node_fields(stdout: str) -> list[dict[str, str]]:
    """``scontrol show node -o``'s lines, each as its ``Key=value`` fields."""
    return [dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in stdout.splitlines()]


def _nodes() -> list[dict[str, str]]:
    return _node_fields(_check(_run(["scontrol", "show", "node", "-o"]), "scontrol show node").stdout)


def draining_nodes() -> set[str]:
    """Nodes an administrator set to DRAIN (``scontrol update nodename=N state=drain``): SLURM
    starts no new job there, and the jobs on it are about to be ended for maintenance."""
    return {f["NodeName"] for f in _nodes() if "DRAIN" in f.get("State", "").upper() and f.get("NodeName")}


def no_room(cpus: int, exclusive: bool, partition: str | None) -> str | None:
    """Why no SLURM node can start one more allocation now (None: one can): every node of the
    partition draining, down or with fewer than ``cpus`` CPUs unallocated (``exclusive``: none idle)."""
    seen = []
    for f in _nodes():
        if partition is not None and partition not in f.get("Partitions", "").split(","):
            continue
        state = f.get("State", "").upper()
        free = int(f.get("CPUTot", 0) or 0) - int(f.get("CPUAlloc", 0) or 0)
        if not any(bad in state for bad in ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING")) and \
                (free >= cpus if not exclusive else free == int(f.get("CPUTot", 0) or 0)):
            return None
        seen.append(f"{f.get('NodeName')} {state.lower()}, {free} CPU free")
    return f"no SLURM node can start an allocation of {cpus} CPU now ({'; '.join(seen) or 'no node'})"


def resume_node(node: str) -> None:
    """Return a node marked DOWN (e.g. by the ``node_down`` fault) to service."""
    _check(_run(["scontrol", "update", f"nodename={node}", "state=resume"]), "scontrol update")


def _partitions() -> tuple[dict[str, int], str | None]:
    """(partition -> node count, the default partition); raises SlurmError naming the fix when
    SLURM cannot be reached."""
    out = _run(["sinfo", "-h", "-o", "%P|%D"])
    if out.returncode != 0:
        raise SlurmError(f"cannot reach the SLURM controller: {out.stderr.strip() or out.stdout.strip()}; "
                         "start it (`./run.sh slurm up` on one machine) or check slurm.conf")
    sizes: dict[str, int] = {}
    default = None
    for line in out.stdout.splitlines():
        name, _, count = line.strip().partition("|")
        if name.endswith("*"):
            name = default = name[:-1]
        if name:
            sizes[name] = sizes.get(name, 0) + int(count or 0)
    return sizes, default


@dataclass(frozen=True)
class ClusterNetwork:
    """How this cluster's nodes are reached, read from ``scontrol show node``.

    ``virtual``: several nodes share one machine (NodeHostName), so each worker needs a hostname
    of its own or they would all bind tcp://<machine>:<port>. ``shared_loopback``: every node's
    address is a loopback one (virtual nodes in this network namespace: gloo must use ``lo``).
    ``controller_addr``: the address this machine has on the route to the nodes, when its
    hostname resolves only to loopback (the workers could not reach ``tcp://<hostname>``);
    None when the hostname resolves to a real address, which workers then use."""

    virtual: bool
    shared_loopback: bool
    controller_addr: str | None


def _cluster_network() -> ClusterNetwork:
    import ipaddress

    fields = _node_fields(_run(["scontrol", "show", "node", "-o"]).stdout)
    hosts = [f["NodeHostName"] for f in fields if "NodeHostName" in f]
    addrs = [a for f in fields for a in [_resolve(f.get("NodeAddr", ""))] if a]
    loopback = bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)
    controller = None
    if _hostname_is_loopback_only():
        controller = "127.0.0.1" if loopback or not addrs else _route_source(addrs[0])
    return ClusterNetwork(virtual=len(hosts) > len(set(hosts)), shared_loopback=loopback,
                          controller_addr=controller)


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name) if name else None
    except OSError:
        return None


def _route_source(addr: str) -> str:
    """This machine's address on its route to ``addr`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


def controller_address() -> str | None:
    """The address cluster nodes reach this machine at, when its hostname would not do (it
    resolves only to loopback); None otherwise. The Lighthouse binds it (see SlurmPlacement)."""
    if not shutil.which("scontrol"):
        return None
    return _cluster_network().controller_addr


def _hostname_is_loopback_only() -> bool:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return True
    import ipaddress

    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _free_port() -> int:
    """A port for a job's workers to listen on, free now, below the kernel's ephemeral range.

    The workers bind it seconds after we chose it. A port the kernel handed out (bind to 0) is
    one it hands out again to the next outgoing connection or ephemeral bind on this machine,
    and 32 allocations starting at once on one machine hit that: a worker failed with "Address
    already in use" and the job with it (bench_scale --job slurm at 32 groups)."""
    low, _ = _ephemeral_range()
    start = max(1024, low - EPHEMERAL_GAP)
    candidates = list(range(max(1024, start - 12000), start))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # nothing free below the range: let the kernel choose
        s.bind(("", 0))
        return s.getsockname()[1]


EPHEMERAL_GAP = 1000  # stay this far below the ephemeral range


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_NODE_PYTHON = """#!/bin/sh
# python_exe for SLURM workers on virtual nodes of one machine (written by monarch_nb): each
# worker gets its own UTS namespace named after its node, so it binds tcp://<node>:<port>.
if [ -n "$SLURMD_NODENAME" ] && [ "$SLURMD_NODENAME" != "$(hostname)" ]; then
  exec unshare --uts /bin/sh -c 'hostname "$SLURMD_NODENAME" && exec "$0" "$@"' {python} "$@"
fi
exec {python} "$@"
"""


class SlurmAllocation(Allocation):
    """One SLURM job holding the ``hosts`` nodes of one mesh (see the module docstring)."""

    kind = "slurm"

    def __init__(self, spec: SlurmSpec, *, hosts: int, name: str, log_dir: Path) -> None:
        self.spec, self.hosts, self.name, self.log_dir = spec, hosts, name, log_dir
        self.job: Any = None
        self.job_id: str | None = None
        self.nodes: list[str] = []
        self.local = False  # set in start(): virtual nodes sharing this machine's loopback count as local
        self.env: dict[str, str] = {}  # for the workers (e.g. loopback gloo on virtual nodes)

    def start(self) -> Any:
        """Submit, wait until running, attach; returns the job's host mesh. Releases the job on
        any failure or interrupt before it is handed over."""
        spec = self.spec.validate()
        partitions, default = _partitions()
        if spec.partition is not None and spec.partition not in partitions:
            raise SlurmError(f"partition: {spec.partition!r} is not a partition of this cluster; "
                             f"partitions: {', '.join(sorted(partitions)) or 'none'}")
        partition = spec.partition or default
        size = partitions.get(partition) if partition else None
        if size is not None and self.hosts > size:
            raise SlurmError(f"hosts: {self.hosts} nodes asked for, but partition {partition!r} has {size}; "
                             f"ask for at most {size}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        python = shlex.quote(sys.executable)
        python_exe = python
        net = _cluster_network()
        self.local = net.virtual and net.shared_loopback
        if net.virtual:
            wrapper = self.log_dir / f"node_python-{self.name}.sh"
            wrapper.write_text(_NODE_PYTHON.replace("{python}", python))
            wrapper.chmod(0o755)
            python_exe = shlex.quote(str(wrapper))
        self.job = seam.slurm_job(
            meshes={"hosts": self.hosts}, python_exe=python_exe, monarch_port=_free_port(),
            job_name=f"monarch_nb-{self.name}", partition=spec.partition,
            time_limit=spec.time_limit or DEFAULT_TIME_LIMIT,
            log_dir=str(self.log_dir), exclusive=spec.exclusive, cpus_per_task=spec.cpus_per_task,
            slurm_args=tuple(spec.slurm_args), job_start_timeout=int(spec.start_timeout_s) + 1)
        for name in seam.JOB_LOGGERS:  # Monarch logs each submit and poll at INFO; the job's log has it all
            logging.getLogger(name).setLevel(logging.WARNING)
        if net.controller_addr is not None:
            # SlurmJob just set Monarch's transport to TcpWithHostname; with a hostname that
            # resolves only to loopback the client would panic ("no non-loopback address"), and
            # nodes with a network of their own could not reach it: bind the address they route to.
            import monarch.config
            from monarch.actor import ChannelTransport

            from .. import seam_cluster

            if net.controller_addr == "127.0.0.1":
                monarch.config.configure(default_transport=ChannelTransport.TcpWithLocalhost)
            else:
                seam_cluster.listen_where_workers_reach(net.controller_addr, "SLURM nodes with networks of their own")
        try:
            self.job.apply()
            self.job_id = seam.slurm_job_id(self.job)
            if self.on_submit is not None:  # guarded from now on: the controller may die before it runs
                self.on_submit(self.reaper_commands())
            self._wait_running()
            self.job_state = self.job.state(cached_path=None)
            return self.job_state.hosts
        except BaseException:
            self.release()
            raise

    def _wait_running(self) -> None:
        assert self.job_id is not None
        deadline = time.monotonic() + self.spec.start_timeout_s
        status = JobStatus(self.job_id, "PENDING")
        while time.monotonic() < deadline:
            status = job_states([self.job_id])[self.job_id]
            if status.running:
                self.nodes = _expand_hostlist(status.nodes)
                return
            if status.state not in ("PENDING", "CONFIGURING"):
                raise SlurmError(f"{status.describe()} before it started; see {self.log_dir}")
            time.sleep(0.1)
        raise SlurmError(f"{status.describe()} after {self.spec.start_timeout_s:g} s (start_timeout_s); "
                         "released it. Ask for fewer hosts, another partition, or a longer start timeout")

    def status(self) -> JobStatus | None:
        return job_states([self.job_id])[self.job_id] if self.job_id else None

    cluster_faults = ("preempt", "node_down")  # the fault kinds this scheduler delivers

    def cluster_fault(self, kind: str) -> None:
        """Deliver cluster fault ``kind`` (one of ``cluster_faults``) to this allocation."""
        {"preempt": self.preempt, "node_down": self.down_node}[kind]()

    def preempt(self) -> None:
        """What a scheduler's preemption does to the job: cancel it (the ``preempt`` fault)."""
        if self.job_id is None:
            raise SlurmError("preempt: this allocation holds no job")
        _check(_run(["scancel", self.job_id]), "scancel")

    def down_node(self, reason: str = "monarch_nb node_down fault") -> str:
        """Mark the allocation's first node DOWN (the ``node_down`` fault); returns its name.
        Every job on that node fails; ``resume_node`` brings it back."""
        if not self.nodes:
            raise SlurmError("node_down: this allocation holds no node")
        node = self.nodes[0]
        _check(_run(["scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}"]), "scontrol update")
        return node

    def reaper_commands(self) -> list[list[str]]:
        return [["scancel", self.job_id]] if self.job_id else []

    def release(self, timeout: float = 10.0) -> None:
        """Cancel the job and wait until squeue no longer shows it alive. Idempotent."""
        job_id, self.job_id = self.job_id, None
        if job_id is None:
            return
        cancel(job_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(job_id):
                return
            time.sleep(0.05)


def _expand_hostlist(text: str) -> list[str]:
    """'n[1-2],gpu7' -> ['n1', 'n2', 'gpu7'] (through scontrol, which knows every form)."""
    if not text:
        return []
    out = _run(["scontrol", "show", "hostnames", text])
    return out.stdout.split() if out.returncode == 0 else [text]
