"""A fault-tolerant training run driven from the controller: ``FTRun``.

The run owns (or borrows) a :class:`monarch_nb.session.Session`, starts a torchft
Lighthouse in its own process and R replica groups, each a Monarch proc mesh named
``replica{r}`` of G processes running :class:`~monarch_nb.ft.trainer.TrainerActor`. torchft
decides quorum and moves state between peers; this module decides *when* a group is
failed and respawns it, and records every phase as typed events in
``<run_dir>/events.jsonl``.

One supervisor thread per replica group polls its actors (events + state) under a deadline
and notices failure four ways: Monarch supervision (a dead process), an endpoint error, a
``failed`` state the trainer reports itself (exception in the step, aborted comms), and
silence longer than ``hang_timeout_s`` (a hang). Recovery happens in that group's thread
only - surviving groups never restart: down the mesh, wait the restart policy's backoff,
bring up a fresh mesh, start training; torchft heals it from a live peer at the next
quorum. After each rejoin the run asks every live group for parameter and optimizer hashes
at one future committed step and records whether they are identical.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..meshes import pid_alive
from ..session import runs_root
from ..telemetry import EventStore
from ..telemetry.events import (
    Event,
    FailureDetected,
    FaultInjected,
    GaveUp,
    Healed,
    Quorum,
    Rejoined,
    ReplicasIdentical,
    ReplicaState,
    Respawned,
    RunStarted,
    RunStopped,
    Step,
)
from .config import RunConfig
from .faults import Fault, FaultKind, FaultSchedule
from .history import RunHistory
from .lighthouse import Lighthouse, LighthouseSettings

log = logging.getLogger(__name__)

# Environment for worker processes: loopback gloo, quiet Rust logs from torchft.
_WORKER_ENV = {"GLOO_SOCKET_IFNAME": "lo", "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ReplicaGroup:
    """Controller-side view of one replica group."""

    index: int
    state: str = "starting"
    attempts: int = 0
    actors: Any = None
    step: int = 0
    last_answer: float = 0.0
    failed_at: float | None = None
    awaiting_heal: bool = False
    healed: bool = False
    procs: list[tuple[int, str]] = field(default_factory=list)  # (pid, host) of each rank
    failure: tuple[str, int | None, float] | None = None  # (reason, rank, t) signalled by supervision
    wake: threading.Event = field(default_factory=threading.Event)
    heal_parts: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"replica{self.index}"


class FTRun:
    """A fault-tolerant run; see the module docstring.

    Example::

        run = FTRun(RunConfig(replicas=3, group_size=1)).start()   # Lighthouse + 3 groups
        run.wait_for_step(10)
        run.inject("kill", replica=1)                  # also: rank=, at_step=N, after_s=S
        run.schedule(every=30, kinds=["kill", "exception", "comms"], seed=0)
        run.check_identical()                          # -> ReplicasIdentical event
        run.history().recoveries()                     # per-failure figures
        run.stop()                                     # no process left behind
        open_run(run.run_dir)                          # later, from events.jsonl alone

    Placement: ``job="local"`` (default) runs every group on this host; ``job="process"``
    gives each group its own Monarch ``ProcessJob`` host. For SLURM or Kubernetes pass
    ``host_mesh_for=lambda r: <HostMesh for group r>`` (e.g. slices of
    ``monarch.job.SlurmJob(...).state().hosts``) and set ``advertise_host`` to an address
    the other hosts can reach; the Lighthouse then binds all interfaces.
    """

    def __init__(self, config: RunConfig | None = None, *, session: Any = None,
                 host_mesh_for: Callable[[int], Any] | None = None, **overrides: Any) -> None:
        cfg = config or RunConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg.validate()
        self.run_id = cfg.run_name or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.run_dir = runs_root(cfg.runs_root) / self.run_id
        if (self.run_dir / "events.jsonl").exists():
            raise ValueError(f"run_name: {self.run_id!r} already exists under {self.run_dir.parent}; pick another")
        self.events = EventStore(self.run_dir / "events.jsonl")
        self.fault_log = str(self.run_dir / "faults.jsonl")
        self._session = session
        self._own_session = session is None
        self._host_mesh_for = host_mesh_for
        self._job: Any = None
        self.lighthouse: Lighthouse | None = None
        self.lighthouse_pid: int | None = None
        self.groups = [ReplicaGroup(r) for r in range(cfg.replicas)]
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seen_quorums: set[int] = set()
        self._pending_checks: dict[int, dict[str, Any]] = {}
        self._fault_log_pos = 0
        self._fault_fired: list[dict[str, Any]] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._schedule_stop: threading.Event | None = None
        self.spawned_pids: list[int] = []  # every worker process this run started (orphan checks)
        self.started = False
        self.stopped = False
        self.data_dir: str | None = None

    # ---- properties --------------------------------------------------------------------

    @property
    def session(self) -> Any:
        return self._session

    def history(self) -> RunHistory:
        return RunHistory(self.events, self.run_dir)

    def status(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {g.index: {"state": g.state, "step": g.step, "attempts": g.attempts,
                              "pids": [pid for pid, _ in g.procs]}
                    for g in self.groups}

    def _emit(self, event: Event) -> None:
        self.events.append(event)

    def _set_state(self, group: ReplicaGroup, state: str, detail: str = "") -> None:
        with self._lock:
            if group.state == state and not detail:
                return
            group.state = state
        self._emit(ReplicaState(replica=group.index, state=state, detail=detail))

    # ---- start -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> "FTRun":
        """Start the Lighthouse and every replica group; returns once all groups train."""
        if self.started:
            raise RuntimeError("this run was already started; create a new FTRun to run again")
        self.started = True
        cfg = self.config
        from .tinydata import ensure_tinydata

        self.data_dir = str(Path(cfg.data_dir) if cfg.data_dir else ensure_tinydata())
        self._emit(RunStarted(run_id=self.run_id, config={**cfg.to_dict(), "run_dir": str(self.run_dir)}))
        try:
            if self._session is None:
                from ..session import Session

                self._session = Session(events=self.events)
            self._unsubscribe = self._session.on_failure(self._on_worker_failed)
            atexit.register(self.stop, "interpreter exit")  # runs before the session's own atexit
            self.lighthouse = Lighthouse(LighthouseSettings(
                bind=f"{'127.0.0.1' if cfg.job == 'local' else '0.0.0.0'}:0", min_replicas=cfg.min_replicas,
                join_timeout_ms=cfg.join_timeout_ms, quorum_tick_ms=cfg.quorum_tick_ms,
                heartbeat_timeout_ms=cfg.heartbeat_timeout_ms)).start()
            self.lighthouse_pid = self.lighthouse.pid
            for g in self.groups:
                self._set_state(g, "starting")
                self._spawn(g)
            deadline = time.monotonic() + (timeout or cfg.init_timeout_s)
            for g in self.groups:
                self._wait_ready(g, deadline)
            for g in self.groups:
                self._call(g, "start", timeout=30.0)
                self._set_state(g, "training")
        except BaseException:
            self.stop(reason="failed to start")
            raise
        for g in self.groups:
            t = threading.Thread(target=self._supervise, args=(g,), name=f"ft-supervise-{g.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _host_mesh(self, index: int) -> Any:
        if self._host_mesh_for is not None:
            return self._host_mesh_for(index)
        if self.config.job == "process":
            if self._job is None:
                from monarch.job import ProcessJob

                self._job = ProcessJob({"hosts": self.config.replicas})
                self._hosts = self._job.state(cached_path=None).hosts
                # The job's host processes are ours too (checked for orphans after stop).
                self.spawned_pids.extend(int(getattr(st, "pid", 0)) for st in
                                         getattr(self._job, "_host_to_pid", {}).values() if getattr(st, "pid", 0))
            return self._hosts.slice(hosts=index)
        if self.config.job in ("slurm", "kubernetes"):
            raise ValueError(f"job: {self.config.job!r} needs host_mesh_for=lambda r: <that job's host mesh>; "
                             "see monarch.job.SlurmJob / KubernetesJob")
        return None

    def _spawn(self, g: ReplicaGroup) -> None:
        cfg = self.config
        env = {**_WORKER_ENV, **cfg.env}
        handle = self._session.up(g.name, procs=cfg.group_size, env=env, host_mesh=self._host_mesh(g.index),
                                  timeout=60.0)
        store_port = _free_port() if cfg.group_size > 1 else None
        assert self.lighthouse is not None and self.lighthouse.address
        worker_cfg = {**cfg.to_dict(), "restart": None}
        actors = self._session.spawn(f"trainer{g.index}", _trainer_class(), worker_cfg, g.index,
                                     self.lighthouse.address, store_port, self.data_dir, self.fault_log,
                                     g.attempts, mesh=g.name)
        with self._lock:
            g.actors = actors
            g.procs = [(p.pid, p.host) for p in handle.procs if p.pid]
            self.spawned_pids.extend(pid for pid, _ in g.procs)
            g.failure = None
            g.heal_parts = {}
            g.last_answer = time.monotonic()

    def _wait_ready(self, g: ReplicaGroup, deadline: float) -> None:
        """Poll until every rank's actor is constructed (its __init__ builds the model)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{g.name}: trainer actors not ready within {self.config.init_timeout_s:g} s")
            if g.failure is not None:
                raise RuntimeError(f"{g.name} failed while starting: {g.failure[0]}")
            result = self._session.deadline(g.actors, min(left, 10.0)).poll.gather()
            if result.errors:
                rank, err = next(iter(result.errors.items()))
                raise RuntimeError(f"{g.name} rank {rank} failed to start: {err}")
            self._ingest(g, result)
            if not result.missing and len(result.values) == self.config.group_size:
                return

    def _call(self, g: ReplicaGroup, endpoint: str, *args: Any, timeout: float = 10.0, **kwargs: Any) -> Any:
        return getattr(self._session.deadline(g.actors, timeout), endpoint).call(*args, **kwargs)

    # ---- supervision -------------------------------------------------------------------

    def _on_worker_failed(self, event: Any) -> None:
        """Session listener (Monarch's thread): hand off to the group's supervisor."""
        name = getattr(event, "mesh", "")
        for g in self.groups:
            if g.name == name and g.failure is None and g.state not in ("failed", "respawning", "stopped"):
                g.failure = (getattr(event, "reason", "process failed"), getattr(event, "rank", None), time.time())
                g.wake.set()

    def _supervise(self, g: ReplicaGroup) -> None:
        cfg = self.config
        while not self._stopping.is_set():
            g.wake.wait(cfg.poll_interval_s)
            g.wake.clear()
            if self._stopping.is_set() or getattr(self._session, "_closed", False):
                return
            if g.state in ("stopped", "gave_up", "finished"):
                return
            try:
                reason = self._check(g)
                if reason is not None and not self._stopping.is_set():
                    self._recover(g, *reason)
            except Exception as e:  # never let the supervisor die silently
                log.exception("supervising %s: %s", g.name, e)
                self._stopping.wait(1.0)

    def _dead_local_rank(self, g: ReplicaGroup) -> tuple[str, int | None, float] | None:
        """A pid check for ranks on this host: Monarch supervision usually reports a dead
        process first (with its exit status), but not always; this never misses one."""
        here = socket.gethostname()
        for rank, (pid, host) in enumerate(g.procs):
            if host == here and not pid_alive(pid):
                return (f"process {pid} of rank {rank} is gone (found by pid check)", rank, time.time())
        return None

    def _check(self, g: ReplicaGroup) -> tuple[str, int | None, float] | None:
        """Poll the group once; return (reason, rank, detected_t) if it has failed."""
        if g.failure is not None:
            return g.failure
        dead = self._dead_local_rank(g)
        if dead is not None:
            # Give Monarch supervision a moment to say how it died (signal, exit code).
            deadline = time.monotonic() + 2.0
            while g.failure is None and time.monotonic() < deadline and not self._stopping.is_set():
                time.sleep(0.05)
            if g.failure is not None:
                return (g.failure[0], g.failure[1], min(dead[2], g.failure[2]))
            return dead
        timeout = max(0.5, min(2.0, self.config.hang_timeout_s / 2))
        result = self._session.deadline(g.actors, timeout).poll.gather()
        now = time.monotonic()
        if g.failure is not None:  # supervision spoke while we were waiting
            return g.failure
        if result.errors:
            rank, err = sorted(result.errors.items())[0]
            return (f"unreachable: {type(err).__name__}: {str(err)[:300]}", rank, time.time())
        self._ingest(g, result)
        for rank, value in sorted(result.values.items()):
            if value.get("state") == "failed":
                return (value.get("failure") or "trainer reported failure", rank, time.time())
        if not result.missing:
            g.last_answer = now
            if all(v.get("state") == "finished" for v in result.values.values()):
                self._set_state(g, "finished")
        elif now - g.last_answer > self.config.hang_timeout_s:
            return (f"hang: no answer from ranks {result.missing} for {now - g.last_answer:.1f} s",
                    result.missing[0], time.time())
        return None

    def _ingest(self, g: ReplicaGroup, result: Any) -> None:
        # All ranks' events in time order: a rank's "healed" precedes rank 0's next "step".
        merged = sorted(((float(ev.get("t", 0.0)), rank, i, ev) for rank, value in result.values.items()
                         for i, ev in enumerate(value.get("events", ()))), key=lambda x: x[:3])
        for _, rank, _, ev in merged:
            self._ingest_event(g, rank, ev)
        if 0 in result.values:
            g.step = max(g.step, int(result.values[0].get("step", 0)))

    def _ingest_event(self, g: ReplicaGroup, rank: int, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        t = float(ev.get("t", time.time()))
        if kind == "step" and rank == 0:
            self._emit(Step(t=t, replica=g.index, step=int(ev["step"]), loss=float(ev["loss"]),
                            tokens_per_s=float(ev["tokens_per_s"]), committed=bool(ev["committed"]),
                            quorum_id=ev.get("quorum_id"), participants=ev.get("participants")))
            if ev["committed"] and g.awaiting_heal:
                # Normally after a "healed"; with no live peer to heal from (every group was
                # down) the first committed step is the rejoin all the same.
                g.awaiting_heal = False
                g.healed = False
                since = (t - g.failed_at) if g.failed_at else None
                self._emit(Rejoined(t=t, replica=g.index, step=int(ev["step"]), seconds_since_failure=since))
                self._set_state(g, "training")
                if self.config.check_identical:
                    threading.Thread(target=self._request_identical, name="ft-hash-check", daemon=True).start()
        elif kind == "quorum" and rank == 0:
            qid = int(ev["quorum_id"])
            with self._lock:
                new = qid not in self._seen_quorums
                self._seen_quorums.add(qid)
            if new:
                self._emit(Quorum(t=t, quorum_id=qid, participants=list(ev.get("participants") or []),
                                  replica=g.index))
        elif kind == "healed":
            # Every rank of the group heals its own shard; record the group once, with the total.
            with self._lock:
                g.heal_parts[rank] = ev
                done = len(g.heal_parts) >= self.config.group_size
                parts, g.heal_parts = (dict(g.heal_parts), {}) if done else ({}, g.heal_parts)
            if done:
                first = parts[min(parts)]
                g.healed = True
                self._emit(Healed(t=max(float(p["t"]) for p in parts.values()), replica=g.index,
                                  step=int(first["step"]), bytes=sum(int(p["bytes"]) for p in parts.values()),
                                  seconds=max(float(p["seconds"]) for p in parts.values()),
                                  source_replica=first.get("source_replica")))
        elif kind == "hashes":
            self._record_hashes(g.index, rank, ev)

    def _fired_time(self, replica: int) -> float | None:
        """When the most recent fault aimed at ``replica`` actually fired (worker's fault log)."""
        try:
            with open(self.fault_log, encoding="utf-8") as f:
                f.seek(self._fault_log_pos)
                for line in f:
                    try:
                        self._fault_fired.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
                self._fault_log_pos = f.tell()
        except FileNotFoundError:
            return None
        for rec in reversed(self._fault_fired):
            if rec.get("replica") == replica and not rec.get("_used"):
                rec["_used"] = True
                return float(rec["t"])
        return None

    def _recover(self, g: ReplicaGroup, reason: str, rank: int | None, detected_t: float) -> None:
        cfg = self.config
        fired = self._fired_time(g.index)
        with self._lock:
            g.failed_at = fired or detected_t
            g.awaiting_heal = False
            g.healed = False
        self._emit(FailureDetected(t=detected_t, replica=g.index, rank=rank, reason=reason,
                                   detection_s=(detected_t - fired) if fired else None))
        self._set_state(g, "failed", reason[:200])
        while not self._stopping.is_set() and not getattr(self._session, "_closed", False):
            try:
                # kill=True: a hung process (GIL held) would release its peers only after
                # Monarch's polite stop timed out on it.
                self._session.down(g.name, kill=True)
            except Exception:
                pass
            attempt = g.attempts + 1
            delay = cfg.restart.delay(attempt)
            if delay is None:
                self._emit(GaveUp(replica=g.index, attempts=g.attempts))
                self._set_state(g, "gave_up", f"after {g.attempts} restarts")
                return
            if delay and self._stopping.wait(delay):
                return
            g.attempts = attempt
            self._set_state(g, "respawning", f"attempt {attempt}")
            t0 = time.time()
            try:
                self._spawn(g)
                self._wait_ready(g, time.monotonic() + cfg.init_timeout_s)
                if self._stopping.is_set():
                    return
                with self._lock:
                    g.awaiting_heal = True
                self._call(g, "start", timeout=30.0)
            except Exception as e:  # the respawn itself failed: counts as an attempt, try again
                if self._stopping.is_set():
                    return
                self._emit(FailureDetected(replica=g.index, rank=None, reason=f"respawn failed: {e}"[:300]))
                self._set_state(g, "failed", f"respawn attempt {attempt} failed")
                continue
            self._emit(Respawned(replica=g.index, attempt=attempt, seconds=time.time() - t0))
            self._set_state(g, "healing")
            g.last_answer = time.monotonic()
            return

    # ---- identical replicas ------------------------------------------------------------

    def _live_groups(self) -> list[ReplicaGroup]:
        with self._lock:
            return [g for g in self.groups if g.state == "training"]

    def _request_identical(self, ahead: int = 3) -> int | None:
        """Ask every training group for hashes after one future committed step."""
        live = self._live_groups()
        if len(live) < 2:
            return None
        target = max(g.step for g in live) + ahead
        with self._lock:
            self._pending_checks[target] = {"expected": {(g.index, k) for g in live
                                                         for k in range(self.config.group_size)},
                                            "got": {}, "asked": time.time()}
        for g in live:
            try:
                self._call(g, "hash_at", target, timeout=5.0)
            except Exception:
                with self._lock:
                    self._pending_checks[target]["expected"] -= {(g.index, k) for k in range(self.config.group_size)}
        self._maybe_complete(target)
        return target

    def _record_hashes(self, replica: int, rank: int, ev: dict[str, Any]) -> None:
        step = int(ev["step"])
        with self._lock:
            check = self._pending_checks.get(step)
            if check is None:
                return
            check["got"][(replica, rank)] = (ev["params"], ev["optim"])
        self._maybe_complete(step)

    def _maybe_complete(self, step: int) -> None:
        with self._lock:
            check = self._pending_checks.get(step)
            if check is None or not check["expected"] or not check["expected"] <= set(check["got"]):
                return
            del self._pending_checks[step]
        got = check["got"]
        identical = True
        for k in range(self.config.group_size):
            digests = {v for (r, rank), v in got.items() if rank == k}
            identical = identical and len(digests) == 1
        hashes = {f"replica{r}/rank{rank}": f"params:{p} optim:{o}" for (r, rank), (p, o) in sorted(got.items())}
        self._emit(ReplicasIdentical(step=step, identical=identical, hashes=hashes))

    def check_identical(self, timeout: float = 60.0) -> ReplicasIdentical | None:
        """Compare hashes of every training group at a common future step; blocks until recorded."""
        target = self._request_identical()
        if target is None:
            return None
        ev = self.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.step == target, timeout=timeout)
        return ev  # type: ignore[return-value]

    # ---- faults ------------------------------------------------------------------------

    def inject(self, kind: str | FaultKind, replica: int = 0, rank: int = 0, *, at_step: int | None = None,
               after_s: float | None = None, hang_s: float = 30.0) -> Fault:
        """Arm a fault in one process of one replica group.

        ``at_step=N`` fires inside step N; ``after_s=S`` fires in the first step after S
        seconds; neither: the next step. Validated before anything is sent.
        """
        fault = Fault(kind=FaultKind.parse(kind), replica=replica, rank=rank, at_step=at_step, after_s=after_s,
                      hang_s=hang_s)
        fault.validate(self.config.replicas, self.config.group_size)
        if not self.started or self.stopped:
            raise RuntimeError("inject: the run is not running (call start() first)")
        if fault.after_s:
            timer = threading.Timer(fault.after_s, self._send_fault, args=(fault,))
            timer.daemon = True
            timer.start()
            self._emit(FaultInjected(fault=fault.kind.value, replica=replica, rank=rank, step=None))
            return fault
        self._send_fault(fault, emit=True)
        return fault

    def _send_fault(self, fault: Fault, emit: bool = False) -> None:
        g = self.groups[fault.replica]
        if g.state not in ("training", "healing"):
            if emit:
                raise RuntimeError(f"inject: replica {fault.replica} is {g.state}; allowed targets now: "
                                   f"{[x.index for x in self._live_groups()]}")
            return
        actors = g.actors.slice(gpus=fault.rank) if self.config.group_size > 1 else g.actors
        res = self._session.deadline(actors, 10.0).inject.call(fault.kind.value, fault.at_step, fault.hang_s)
        step = next(iter(res.values.values()), fault.at_step)
        if emit:
            self._emit(FaultInjected(fault=fault.kind.value, replica=fault.replica, rank=fault.rank, step=step))

    def schedule(self, every: float, kinds: Any = ("kill",), seed: int | None = None,
                 max_faults: int | None = None, rank: int | None = None) -> FaultSchedule:
        """Inject a random fault every ``every`` seconds into a random training group."""
        sched = FaultSchedule(every_s=every, kinds=tuple(kinds), seed=seed, rank=rank, max_faults=max_faults)
        self.stop_schedule()
        stop = self._schedule_stop = threading.Event()

        def loop() -> None:
            n = 0
            while not stop.wait(sched.every_s) and not self._stopping.is_set():
                live = [g.index for g in self._live_groups()]
                if len(live) < 2:  # never take the last training group down
                    continue
                fault = sched.next_target(self.config.replicas, self.config.group_size, live)
                if fault is None:
                    continue
                try:
                    self._send_fault(fault, emit=True)
                except Exception:
                    continue
                n += 1
                if sched.max_faults is not None and n >= sched.max_faults:
                    return

        threading.Thread(target=loop, name="ft-fault-schedule", daemon=True).start()
        return sched

    def stop_schedule(self) -> None:
        if self._schedule_stop is not None:
            self._schedule_stop.set()
            self._schedule_stop = None

    # ---- waiting -----------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 60.0, *, since: float = 0.0) -> Event:
        """Block until an event satisfying ``predicate`` (recorded at or after ``since``) exists."""
        found = threading.Event()
        box: list[Event] = []

        def observer(e: Event) -> None:
            if not found.is_set() and e.t >= since and predicate(e):
                box.append(e)
                found.set()

        unsub = self.events.subscribe(observer, replay=True)
        try:
            if not found.wait(timeout):
                raise TimeoutError(f"no matching event within {timeout:g} s")
        finally:
            unsub()
        return box[0]

    def wait_for_step(self, step: int, replicas: list[int] | None = None, timeout: float = 120.0) -> None:
        """Block until the given groups (default: all) committed ``step``."""
        want = set(replicas if replicas is not None else range(self.config.replicas))
        done: set[int] = set()

        def pred(e: Event) -> bool:
            if isinstance(e, Step) and e.committed and e.step >= step and e.replica in want:
                done.add(e.replica)
            return done >= want

        self.wait_for(pred, timeout)

    # ---- stop --------------------------------------------------------------------------

    def stop(self, reason: str = "stopped") -> None:
        """Stop every group, the Lighthouse and (if we made it) the session. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        atexit.unregister(self.stop)
        self._stopping.set()
        self.stop_schedule()
        for g in self.groups:
            g.wake.set()
        for t in self._threads:
            t.join(timeout=30.0)
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._session is not None:
            for g in self.groups:
                try:
                    self._session.down(g.name)
                except Exception:
                    pass
                if g.state not in ("gave_up",):
                    self._set_state(g, "stopped")
        if self._job is not None:
            try:
                self._job.kill()
            except Exception:
                pass
        if self.lighthouse is not None:
            self.lighthouse.stop()
        self._emit(RunStopped(run_id=self.run_id, reason=reason))
        if self._own_session and self._session is not None:
            try:
                self._session.shutdown()  # closes self.events too (it was handed over)
            except Exception:
                pass
        self.events.close()

    def __enter__(self) -> "FTRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def dashboard(self) -> Any:
        """The run's live dashboard; one per run, so calling this again never doubles the UI cost."""
        from ..notebook.dashboard import Dashboard

        existing = getattr(self, "_dashboard", None)
        if existing is None or existing.closed:
            self._dashboard = Dashboard(self.events, controls=self)
        return self._dashboard

    def __repr__(self) -> str:
        states = ", ".join(f"{g.name}={g.state}@{g.step}" for g in self.groups)
        return f"FTRun({self.run_id}: {states})"


def _trainer_class() -> type:
    from .trainer import TrainerActor  # imports monarch; kept out of module import time

    return TrainerActor


def open_run(path: str | Path) -> RunHistory:
    """Reopen a finished or interrupted run from its directory (or its events.jsonl)."""
    store = EventStore.open(path)
    run_dir = Path(path) if Path(path).is_dir() else Path(path).parent
    return RunHistory(store, run_dir)
