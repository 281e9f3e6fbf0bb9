"""The kernel's handle on a run that lives in its own process (``run_host.py``): the same API as FTRun.

``start_detached(config)`` starts a run's host and returns a :class:`RunClient` once the groups
train; ``attach(name)`` gives one back for a live run, from any kernel of the run's owner. Events
come from the run's own ``events.jsonl``, followed as it grows (the whole history replays from
it: typed events, the dashboard, waits); calls that act on the run (``inject``, ``scale``,
``check_identical``, ``stop``, ``status``) go over the run's control socket. Two kernels
attached at once see the same events; a stop from either ends the run once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ... import views
from ...telemetry.events import RunStarted, RunStopped
from ...telemetry.follow import follow
from ..settings.config import RunConfig
from . import host_placement
from .groups import GAVE_UP, RETIRED, RETIRING, TERMINAL
from .opening import recorded_config, recorded_fields
from .run_log import FromTheLog

CONTROL_DIR = ".control"  # in the run directory: the socket, the token, and who hosts the run (run_host.py)
SOCKET, TOKEN, HOST = "control.sock", "control.token", "host.json"
RUN_ENV = "MONARCH_NB_RUN"  # set to the run's id in its host, so in every process the run starts
ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError, "TimeoutError": TimeoutError,
                                      "RuntimeError": RuntimeError, "TypeError": TypeError, "KeyError": KeyError}


def control_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CONTROL_DIR


class GroupView:
    """One replica group as the run's last ``status()`` saw it."""

    def __init__(self, index: int, status: dict[str, Any]) -> None:
        self.index, self.name = index, f"replica{index}"
        self.state, self.step = status.get("state"), status.get("step", 0)
        self.pids = list(status.get("pids") or [])


class GroupsView:
    """What the magics ask of ``run.groups``, answered from one ``status()`` of the run's host."""

    def __init__(self, status: dict[Any, dict[str, Any]]) -> None:
        self.groups = [GroupView(k, v) for k, v in sorted((k, v) for k, v in status.items() if isinstance(k, int))]

    def active(self) -> list[GroupView]:
        return [g for g in self.groups if g.state not in TERMINAL]

    def live(self) -> list[GroupView]:
        return [g for g in self.groups if g.state not in (GAVE_UP, RETIRING, RETIRED)]

    def __iter__(self):  # noqa: ANN204
        return iter(self.groups)

    def __getitem__(self, index: int) -> GroupView:
        return self.groups[index]


class RunClient(FromTheLog):
    """A detached run, driven from this kernel. ``detach()`` lets go of it (the run goes on)."""

    def __init__(self, run_dir: Path, host: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.run_id: str = host["run_id"]
        self.host = host  # where it lives (host_placement): its pid, and on a cluster its address and job
        self.host_pid: int = int(host["pid"])
        self._alive_at = (0.0, True)  # (when, alive): a host on a cluster is asked after at most once a second
        self.events = follow(self.run_dir / "events.jsonl")
        started = [e for e in self.events.events(RunStarted)]
        self.config = RunConfig.from_dict(recorded_fields(started[-1].config)) if started else RunConfig()
        self.started_t: float | None = host.get("started_t")
        self.resume_from = None
        self.resume_source = None
        self.resumed_step: int | None = host.get("resumed_step")  # the checkpoint a resume began from
        self.detached = True
        self._dashboard: Any = None

    # ---- calls on the run's host ------------------------------------------------------------

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        where = control_dir(self.run_dir)
        try:
            token = (where / TOKEN).read_bytes()
            with host_placement.connect(self.host, where / SOCKET, token) as conn:
                conn.send((method, args, kwargs))
                answer = conn.recv()
        except (OSError, EOFError) as exc:
            raise RuntimeError(f"run {self.run_id} is not answering ({type(exc).__name__}: {exc}); "
                               f"{'it has stopped' if self.stopped else 'its host may be gone'}") from None
        if answer[0] == "ok":
            return answer[1]
        raise ERRORS.get(answer[1], RuntimeError)(answer[2])

    def status(self) -> dict[Any, dict[str, Any]]:
        return self._call("status")

    def inject(self, kind: Any, replica: int = 0, rank: int = 0, **kwargs: Any) -> Any:
        return self._call("inject", kind, replica=replica, rank=rank, **kwargs)

    def scale(self, replicas: int, timeout: float | None = None) -> Any:
        return self._call("scale", replicas, timeout=timeout)

    def drain(self, replica: int, timeout: float = 180.0, reason: str = "") -> Any:
        return self._call("drain", replica, timeout=timeout, reason=reason)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("schedule", *args, **kwargs)

    def stop_schedule(self) -> None:
        self._call("stop_schedule")

    def disarm(self) -> int:
        return self._call("disarm")

    def check_identical(self, timeout: float = 60.0) -> Any:
        return self._call("check_identical", timeout=timeout)

    def stacks(self, replica: int, ranks: list[int] | None = None) -> list[Any]:
        return self._call("stacks", replica, ranks)

    def restart_from_scratch(self) -> Any:
        return self._call("restart_from_scratch")

    @property
    def spawned_pids(self) -> list[int]:
        # a host on a cluster is no process of this machine's (in a pod its pid is 1 of the pod's own)
        mine = [] if host_placement.on_cluster(self.host) else [self.host_pid]
        return mine + (list(self._call("spawned_pids")) if not self.stopped else [])

    def stop(self, reason: str = "stopped", save_timeout: float | None = None) -> Any:
        """Stop the run (from any attached kernel; a second stop waits for the first)."""
        if self.stopped:
            return None
        try:
            report = self._call("stop", reason, save_timeout=save_timeout)
        except RuntimeError:
            report = None  # stopped meanwhile (another kernel's stop): its RunStopped is in the log
        self.wait_for(lambda e: isinstance(e, RunStopped), timeout=60, what="the run's stop")
        host_placement.wait_gone(self.host, 30.0)
        return report

    # ---- from the run's own log ---------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        since = self.started_t or 0.0  # a resumed run's log also holds the stop before its resume
        return any(e.t >= since for e in self.events.recent(RunStopped)) or not self._host_alive()

    def _host_alive(self) -> bool:
        at, alive = self._alive_at
        if host_placement.on_cluster(self.host) and time.monotonic() - at < 1.0:
            return alive
        self._alive_at = (time.monotonic(), host_placement.alive(self.host))
        return self._alive_at[1]

    @property
    def lighthouse(self) -> Any:
        """Where the run's Lighthouse listens (its last start in the log), as ``.address``."""
        from types import SimpleNamespace

        from ...telemetry.events import LighthouseRestarted, LighthouseStarted

        starts = self.events.recent(LighthouseStarted) + self.events.recent(LighthouseRestarted)
        last = max(starts, key=lambda e: e.t, default=None)
        return SimpleNamespace(address=getattr(last, "address", None)) if last is not None else None

    @property
    def groups(self) -> GroupsView:
        return GroupsView(self.status())

    def dashboard(self) -> Any:
        if self._dashboard is None or self._dashboard.closed:
            self._dashboard = views.build("dashboard", self.events, controls=self)
        return self._dashboard

    def detach(self) -> None:
        """Stop following the run's log here; the run goes on."""
        self.events.close()

    def __repr__(self) -> str:
        where = host_placement.describe(self.host)
        return f"RunClient({self.run_id}: {'stopped' if self.stopped else f'live, host {where}'})"


def start_detached(config: RunConfig, timeout: float | None = None) -> RunClient:
    """Start ``config``'s run in a host process of its own (``controller_on``: on this machine, or
    on its cluster: a SLURM job, a Kubernetes pod); returns once its groups train."""
    return _host(config.to_dict(), config.runs_root, timeout if timeout is not None else config.init_timeout_s + 120,
                 _cluster(config))


def resume_detached(run_dir: str | Path, timeout: float | None = None, **overrides: Any) -> RunClient:
    """``FTRun.resume(run_dir, **overrides)`` in a host process of its own: a run whose host died (or
    that was stopped) continues from its newest checkpoint and outlives this kernel again, where it lived."""
    run_dir = Path(run_dir).resolve()
    if run_dir.name in {r["name"] for r in live_runs(run_dir.parent)}:
        raise ValueError(f"run {run_dir.name!r} is live; `%monarch attach {run_dir.name}` gives it to this kernel")
    init = overrides.get("init_timeout_s") or 300.0
    return _host({"resume": str(run_dir), "overrides": overrides}, str(run_dir.parent),
                 timeout if timeout is not None else init + 120, _cluster(recorded_config(run_dir, overrides)))


def _cluster(config: RunConfig) -> dict[str, Any] | None:
    """Where a host on the cluster is placed (None: on this machine)."""
    if config.controller_on != "cluster":
        return None
    if config.job == "kubernetes":
        from ..settings.config import kubernetes_spec

        return {"kind": "kubernetes", "spec": kubernetes_spec(config)}
    return {"kind": "slurm", "partition": config.partition, "time_limit": config.time_limit}


def _host(asked: dict[str, Any], runs_root: str | None, timeout: float, cluster: dict[str, Any] | None) -> RunClient:
    """Start ``run_host`` with what it is asked to run; its one answer says where the run lives."""
    runs = Path(runs_root or os.environ.get("MONARCH_NB_RUNS") or "runs")
    runs.mkdir(parents=True, exist_ok=True)
    answer, log = host_placement.start(asked, runs, timeout, cluster)
    if "error" in answer:
        raise ValueError(answer["error"])
    log.rename(Path(answer["run_dir"]) / CONTROL_DIR / f"host-{answer['pid']}.log")  # a resume's too
    return RunClient(Path(answer["run_dir"]), answer)


def had_a_host(run_dir: str | Path) -> bool:
    """The run lived in a host of its own (it resumes in one again)."""
    return control_dir(Path(run_dir)).is_dir()


def live_runs(runs_root: str | Path | None = None) -> list[dict[str, Any]]:
    """Every live detached run under ``runs_root`` (default: $MONARCH_NB_RUNS or ./runs), newest first:
    name, owner, pid, age, step and groups (from its log)."""
    root = Path(runs_root or os.environ.get("MONARCH_NB_RUNS") or "runs")
    out = []
    for host_file in root.glob(f"*/{CONTROL_DIR}/{HOST}"):
        try:
            host = json.loads(host_file.read_text())
        except (OSError, ValueError):
            continue
        if not host_placement.alive(host):
            continue
        run_dir = host_file.parent.parent
        steps = _last_steps(run_dir / "events.jsonl")
        out.append({"name": run_dir.name, "run_dir": str(run_dir), "owner": host.get("user"), "uid": host.get("uid"),
                    "pid": host["pid"], "where": host_placement.describe(host), "age_s": time.time() - float(host.get("started_t") or time.time()),
                    "step": max(steps.values(), default=0), "groups": len(steps)})
    return sorted(out, key=lambda r: r["age_s"])


def attach(name: str, runs_root: str | Path | None = None) -> RunClient:
    """The live run ``name`` (a run directory's name under ``runs_root``, or its path)."""
    root = Path(runs_root or os.environ.get("MONARCH_NB_RUNS") or "runs")
    run_dir = Path(name) if Path(name).is_dir() and "/" in str(name) else root / name
    host_file = control_dir(run_dir) / HOST
    live = ", ".join(r["name"] for r in live_runs(root)) or "none"
    if not (run_dir / "events.jsonl").exists():
        raise ValueError(f"no run named {name!r} under {root.resolve()}; live runs: {live}")
    if not host_file.exists():
        raise ValueError(f"run {name!r} is not live (it finished or was stopped, or ran in a kernel); its history "
                         f"stays: monarch_nb.open_run({str(run_dir)!r}); live runs: {live}")
    host = json.loads(host_file.read_text())
    if int(host.get("uid", -1)) != os.getuid():
        raise PermissionError(f"run {name!r} belongs to user {host.get('user')!r}; only its owner can attach")
    if not host_placement.alive(host):
        raise ValueError(f"run {name!r}'s host ({host_placement.describe(host)}) is gone; its workers were released and its "
                         f"checkpoints resume it: %monarch train --resume {run_dir}")
    return RunClient(run_dir, host)


def _last_steps(log: Path) -> dict[int, int]:
    """Each group's last committed step, from the end of a run's log (its last 256 KB)."""
    steps: dict[int, int] = {}
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - (256 << 10)))
            for line in f.read().splitlines():
                if b'"kind": "step"' in line and b'"committed": true' in line:
                    e = json.loads(line)
                    steps[int(e["replica"])] = max(steps.get(int(e["replica"]), 0), int(e["step"]))
    except (OSError, ValueError):
        pass
    return steps
