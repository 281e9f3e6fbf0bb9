"""Soak: many consecutive faults of every kind into one run, and whether it survived them alone.

Every ``--every`` seconds one fault goes to a random target: a random kind (``--kinds all``:
kill, segfault, exit, exception, comms, hang), one group; one time in five two groups at once;
one time in five the next fault is aimed at a group that is healing (mid-heal). Nobody
intervenes. At the end the run is stopped and the report says:

  survived       faults after which every group was training again before the next one
  goodput        committed steps per second over the soak, as a ratio to the run's first
                 fault-free minute (the same run, before the first fault)
  identical      identity checks that passed / ran
  event log      its size, and the largest count of one event kind
  processes      worker/Lighthouse processes of the run still alive after stop() (must be 0)

The recovery figures (recoveries, recovered, gave_up, median/max recovery time, identity checks,
event counts) come from the run's event log alone. ``--reread RUN_DIR --out FILE.json`` recomputes
them from RUN_DIR/events.jsonl with this checkout's recovery model (after the model changed) and
rewrites them in FILE.json, keeping what only the live run knew (faults sent, goodput, the final
identity check, processes left, shots), and says so in ``note``.

Days, not minutes: ``--minutes M`` soaks for M minutes instead of ``--faults N`` faults, and
``--rss-every S`` samples the controller's resident memory every S seconds (``rss_mb``: [[seconds,
MB], ...]) and fits its slope after ``--fit-after`` minutes (``rss_slope_mb_per_hour``). With
``--kernel`` the controller is a real Monarch kernel, driven as a user would drive it: cells
``%monarch train --replicas R --spares S --checkpoint-every K``, ``%monarch dashboard`` and
``%monarch schedule --every E --kinds ...`` (``--no-dashboard``: without the dashboard cell), then a quiet cell every S seconds (a person looking at
the notebook: it shows the failure notices held since the last cell, which are counted in
``notices``), and ``%monarch stop`` at the end (``stop_s``: what the user waits for).
``worker_failed_events`` counts the run's ``worker_failed`` events (one per failed rank).

Not part of CI (minutes long). Usage:
  python bench/soak.py --faults 50 --every 8 --kinds all [--replicas 3] [--spares 1] [--out FILE.json]
  python bench/soak.py --minutes 30 --kernel --rss-every 20 --every 20 --spares 1 [--no-dashboard] --out FILE.json
  python bench/soak.py --reread runs/soak-RUN_ID --out FILE.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FaultKind, FTRun, RunConfig, open_run  # noqa: E402
from monarch_nb.ft.settings.faults import CLUSTER_KINDS  # noqa: E402
from monarch_nb.ft.record.history import RunHistory  # noqa: E402
from monarch_nb.calls import messages_sent  # noqa: E402
from monarch_nb.meshes import pid_alive  # noqa: E402
from monarch_nb.notebook.notices import FailureNotices, failure_text  # noqa: E402
from monarch_nb.telemetry.events import FaultInjected, RunStarted, WorkerFailed  # noqa: E402


def log_fields(history: RunHistory, log: Path) -> dict:
    """The report's fields that the event log alone gives: the live run and --reread share them."""
    recoveries = history.recoveries()
    totals = sorted(r.total_s for r in recoveries if r.status == "recovered" and r.total_s is not None)
    return {
        "recoveries": len(recoveries),
        "recovered": sum(1 for r in recoveries if r.status == "recovered"),
        "gave_up": sum(1 for r in recoveries if r.gave_up),
        "identity": [(e.step, e.identical) for e in history.identity_checks()],
        "event_log_bytes": os.path.getsize(log),
        "events_by_kind": dict(collections.Counter(e.kind for e in history.events).most_common()),
        "median_total_s": totals[len(totals) // 2] if totals else None,
        "max_total_s": totals[-1] if totals else None,
        "poll_interval_s": next((e.config.get("poll_interval_s") for e in history.events.events(RunStarted)), None),
    }


def reread(run_dir: str, out: Path) -> dict:
    """``out``'s report with the log's fields recomputed from ``run_dir``'s event log."""
    report = json.loads(out.read_text()) if out.exists() else {}
    history = open_run(run_dir)
    report.update(log_fields(history, history.events.path))
    report["survived_without_intervention"] = (report["recovered"] == report["recoveries"]
                                               and history.summary()["state"] == "stopped")
    report["run_dir"] = str(run_dir)
    report["note"] = (f"recoveries, recovered, gave_up, identity, event_log_bytes, events_by_kind, median_total_s, "
                      f"max_total_s, poll_interval_s and survived_without_intervention re-read from {history.events.path} by "
                      f"bench/soak.py --reread on {time.strftime('%Y-%m-%d')}; the other fields are the live run's")
    return report


class RssSampler:
    """The resident memory of process ``pid`` every ``every`` seconds, on a thread: [[s, MB], ...],
    and its parts (``parts``: [[s, anonymous MB, file-backed MB, shared MB], ...] from the kernel's
    RssAnon/RssFile/RssShmem): a mapped file's pages are cache the system can take back, not a leak."""

    def __init__(self, pid: int, every: float) -> None:
        self.samples: list[list[float]] = []
        self.parts: list[list[float]] = []
        self._pid = pid
        self._proc = psutil.Process(pid)
        self._every = every
        self._t0 = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-rss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                mb = self._proc.memory_info().rss / 2**20
            except psutil.Error:
                return
            t = round(time.time() - self._t0, 1)
            self.samples.append([t, round(mb, 1)])
            kb = rss_parts_kb(self._pid)
            if kb:
                self.parts.append([t, *(round(kb[k] / 1024, 1) for k in ("RssAnon", "RssFile", "RssShmem"))])
            if self._stop.wait(self._every):
                return

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def rss_parts_kb(pid: int) -> dict[str, int] | None:
    """RssAnon, RssFile and RssShmem of ``pid`` in kB (Linux), None when it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    out = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in lines if ln.startswith("Rss"))}
    return out if {"RssAnon", "RssFile", "RssShmem"} <= out.keys() else None


def slope_mb_per_hour(samples: list[list[float]], after_s: float) -> float | None:
    """Least-squares slope of RSS over time, from ``after_s`` on (the warm-up is left out)."""
    pts = [(t, mb) for t, mb in samples if t >= after_s]
    return _mb_per_hour(pts) if len(pts) >= 3 else None


def _mb_per_hour(pts: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB an hour."""
    return statistics.linear_regression([t for t, _ in pts], [mb for _, mb in pts]).slope * 3600


def window_slopes(samples: list[list[float]], window_s: float = 300.0) -> list[list[float]]:
    """[[from minute, to minute, MB/h], ...] over consecutive windows: a bounded window filling
    shows as slopes that fall to ~0 once it is full; a leak as slopes that stay."""
    out: list[list[float]] = []
    t0, end = 0.0, samples[-1][0] if samples else 0.0
    while t0 + window_s <= end + 1e-9:
        pts = [(t, mb) for t, mb in samples if t0 <= t <= t0 + window_s]
        if len(pts) >= 3:
            out.append([round(t0 / 60, 1), round((t0 + window_s) / 60, 1), round(_mb_per_hour(pts), 1)])
        t0 += window_s
    return out


def memory_fields(samples: list[list[float]], fit_after_min: float, parts: list[list[float]] | None = None) -> dict:
    after = fit_after_min * 60
    out = {"rss_mb": samples, "rss_slope_mb_per_hour": slope_mb_per_hour(samples, after), "rss_fit_after_s": after,
           "rss_window_slopes_mb_per_hour": window_slopes(samples)}
    if parts:
        out["rss_parts_mb"] = parts
        out["rss_part_slopes_mb_per_hour"] = {
            name: slope_mb_per_hour([[p[0], p[i]] for p in parts], after)
            for i, name in enumerate(("anon", "file", "shmem"), start=1)}
    return out


def notices_fields(history: RunHistory, notices: list[str]) -> dict:
    """Failure notices shown vs ``worker_failed`` events vs faults, per fault kind."""
    failed = history.events.events(WorkerFailed)
    return {"notices": len(notices), "worker_failed_events": len(failed),
            "worker_failed_late": sum(1 for e in failed if e.late),
            "faults_by_kind": dict(collections.Counter(e.fault for e in history.events.events(FaultInjected))),
            "notice_texts": notices[:20]}


def script_soak(a: argparse.Namespace, kinds: list[str]) -> dict:
    """The controller is this process: faults chosen here (mid-heal, two at once, one)."""
    rng = random.Random(a.seed)
    run = FTRun(RunConfig(replicas=a.replicas, spares=a.spares, hang_timeout_s=3.0,
                          checkpoint_every=a.checkpoint_every,
                          run_name=f"soak-{time.strftime('%Y%m%d-%H%M%S')}"))
    shots: list[dict] = []
    shown: list = []
    notices = FailureNotices(show=shown.append)
    rss = RssSampler(os.getpid(), a.rss_every)
    try:
        run.start()
        notices.watch(run.session)
        notices.pre_run_cell()  # as if one cell ran the whole time
        t_warm = time.time()
        time.sleep(a.warmup)  # a measured fault-free interval, not a synchronisation
        steps_warm = max((e.step for e in run.history().steps()), default=0)
        base_rate = steps_warm / (time.time() - t_warm)
        t_soak = time.time()
        calls0 = messages_sent()
        n = 0
        while (n < a.faults) if a.minutes is None else (time.time() - t_soak < a.minutes * 60):
            time.sleep(a.every)  # the fault schedule itself: one fault every `every` seconds
            status = {k: v for k, v in run.status().items() if isinstance(k, int)}
            training = [g for g, s in status.items() if s["state"] == "training"]
            healing = [g for g, s in status.items() if s["state"] == "healing"]
            shape = rng.random()
            if shape < 0.2 and healing:
                targets = [healing[0]]
                how = "mid-heal"
            elif shape < 0.4 and len(training) >= 3:
                targets = rng.sample(training, 2)
                how = "two at once"
            else:
                targets = [rng.choice(training)] if len(training) >= 2 else []
                how = "one"
            kind = rng.choice(kinds)
            sent = []
            for target in targets:
                try:
                    run.inject(kind, replica=target, hang_s=10.0)
                    sent.append(target)
                except Exception as exc:  # the target left training meanwhile: recorded, not fatal
                    shots.append({"n": n, "kind": kind, "targets": [target], "how": how, "refused": str(exc)})
            if sent:
                shots.append({"n": n, "kind": kind, "targets": sent, "how": how, "t": time.time()})
            n += 1
            print(f"[{n}] {kind} -> {sent or 'nobody (no eligible group)'} ({how})", flush=True)
        time.sleep(a.every)
        deadline = time.time() + 180
        while time.time() < deadline and any(s["state"] != "training" for k, s in run.status().items()
                                             if isinstance(k, int) and s["state"] != "gave_up"):
            time.sleep(0.5)
        t_end = time.time()
        calls = messages_sent() - calls0
        steps_end = max((e.step for e in run.history().steps()), default=0)
        check = run.check_identical(timeout=120)
    finally:
        t_stop = time.time()
        run.stop()
        stop_s = time.time() - t_stop
        notices.close()
        samples = rss.stop()
    soak_rate = (steps_end - steps_warm) / max(t_end - t_soak, 1e-9)
    return {
        "faults_sent": sum(len(s.get("targets", [])) for s in shots if "refused" not in s),
        "goodput_ratio": soak_rate / base_rate if base_rate else None,
        "final_identical": bool(check and check.identical),
        "stop_s": round(stop_s, 2), "run": run, "calls_per_s": round(calls / max(t_end - t_soak, 1e-9), 2),
        **memory_fields(samples, a.fit_after, rss.parts), **notices_fields(run.history(), [failure_text(e) for e in shown]),
        "shots": shots,
    }


class KernelCells:
    """A real Monarch kernel and the cells a user would type; display output that is a failure
    notice is collected (``notices``), everything else printed.

    ``iopub="always"`` (the default) reads the kernel's output channel all the time on a thread,
    as a Jupyter server does for an open notebook: the dashboard's updates, sent while no cell
    runs, are taken as they come. ``iopub="cells"`` reads it only while a cell runs (the client's
    ``execute_interactive``), so between cells the kernel holds every update unread in its
    output socket's queue - the soaks before 2026-12-05 21:00 were measured so."""

    def __init__(self, iopub: str = "always") -> None:
        from jupyter_client.manager import KernelManager

        from monarch_nb.execute import ensure_kernelspec

        ensure_kernelspec()
        self.km = KernelManager(kernel_name="monarch")
        self.km.start_kernel()
        self.client = self.km.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.pid = self.km.provisioner.process.pid
        self.notices: list[str] = []
        self._lock = threading.Lock()
        self._cells: dict[str, tuple[list[str], threading.Event]] = {}  # msg_id -> (output, idle)
        self._closed = threading.Event()
        self._reader = None
        if iopub == "always":
            self._reader = threading.Thread(target=self._read_iopub, name="soak-iopub", daemon=True)
            self._reader.start()

    def _take(self, msg: dict, out: list[str]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("display_data", "execute_result"):
            text = content.get("data", {}).get("text/plain", "")
            if text.startswith("monarch: mesh ") and " failed: " in text:
                self.notices.append(text)
        elif kind == "error":
            out.append("\n".join(content["traceback"]))

    def _read_iopub(self) -> None:
        import queue

        while not self._closed.is_set():
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            with self._lock:
                cell = self._cells.get(msg.get("parent_header", {}).get("msg_id"))
                if cell is None:
                    continue  # the dashboard's updates and other cells' late output: read, dropped
                self._take(msg, cell[0])
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    cell[1].set()

    def run(self, code: str, timeout: float = 600) -> str:
        if self._reader is None:
            out: list[str] = []
            reply = self.client.execute_interactive(code, timeout=timeout, output_hook=lambda m: self._take(m, out))
        else:
            out, idle = [], threading.Event()
            with self._lock:  # registered before the reader can see the cell's first output
                msg_id = self.client.execute(code)
                self._cells[msg_id] = (out, idle)
            deadline = time.time() + timeout
            while True:
                reply = self.client.get_shell_msg(timeout=max(0.1, deadline - time.time()))
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            if not idle.wait(max(0.1, deadline - time.time())):
                raise TimeoutError(f"cell {code!r}: no idle status within {timeout} s")
            with self._lock:
                del self._cells[msg_id]
        text = "".join(out)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell {code!r} failed:\n{text}")
        return text

    def close(self) -> None:
        self._closed.set()
        if self._reader is not None:
            self._reader.join()
        self.client.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


SETTLE = """import time as _time
_t = _time.time()
while _time.time() - _t < 180 and any(s["state"] not in ("training", "gave_up", "retired")
                                     for k, s in run.status().items() if isinstance(k, int)):
    _time.sleep(0.5)  # polling a status, bounded: the wait a user would do by eye
"""


def kernel_soak(a: argparse.Namespace, kinds: list[str]) -> dict:
    """The controller is a real Monarch kernel; the faults are the magics' own schedule."""
    name = f"soak-kernel-{time.strftime('%Y%m%d-%H%M%S')}"
    cells = KernelCells(iopub=a.iopub)
    rss = RssSampler(cells.pid, a.rss_every)
    try:
        every = f"--checkpoint-every {a.checkpoint_every} " if a.checkpoint_every else ""
        print(cells.run(f"%monarch train --replicas {a.replicas} --spares {a.spares} {every}--name {name}"),
              flush=True)
        if a.dashboard:
            cells.run("%monarch dashboard")
        run_dir = cells.run("print(run.run_dir)").strip()
        print(cells.run(f"%monarch schedule --every {a.every:g} --kinds {','.join(kinds)} --seed {a.seed}"), flush=True)
        count_calls = "import monarch_nb.calls as _calls; print(_calls.messages_sent())"
        calls0 = int(cells.run(count_calls).strip())
        t_soak = time.time()
        while time.time() - t_soak < a.minutes * 60:
            time.sleep(a.rss_every)  # a person glancing at the notebook every so often
            cells.run("pass")
            print(f"{time.time() - t_soak:6.0f} s  rss {rss.samples[-1][1]:.0f} MB  notices {len(cells.notices)}",
                  flush=True)
        calls = int(cells.run(count_calls).strip()) - calls0
        calls_s = time.time() - t_soak
        cells.run("run.stop_schedule()")
        cells.run(SETTLE)  # every group training again (or given up) before the last identity check
        check = cells.run("_c = run.check_identical(timeout=120); print(bool(_c and _c.identical))").strip()
        poll = cells.run("import os; print(os.environ.get('HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY', 'unset'))")
        t_stop = time.time()
        stop_text = cells.run("%monarch stop")
        stop_s = time.time() - t_stop
        print(stop_text, flush=True)
        cells.run("pass")  # notices held after the last cell
    finally:
        samples = rss.stop()
        cells.close()
    history = open_run(run_dir)
    return {
        "faults_sent": len(history.events.events(FaultInjected)),
        "final_identical": check.endswith("True"),
        "stop_s": round(stop_s, 2), "run_dir": run_dir, "calls_per_s": round(calls / calls_s, 2),
        "stop_text": stop_text.strip(), "supervision_poll": poll.strip(),
        **memory_fields(samples, a.fit_after, rss.parts), **notices_fields(history, cells.notices),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--minutes", type=float, default=None, help="soak this long instead of --faults faults")
    p.add_argument("--every", type=float, default=8.0, help="seconds between faults")
    p.add_argument("--kinds", default="all")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=None, help="durable checkpoint every K steps")
    p.add_argument("--warmup", type=float, default=30.0, help="fault-free seconds measured first")
    p.add_argument("--rss-every", type=float, default=20.0, help="seconds between RSS samples of the controller")
    p.add_argument("--fit-after", type=float, default=5.0, help="minutes of warm-up left out of the RSS slope")
    p.add_argument("--kernel", action="store_true", help="the controller is a real Monarch kernel (needs --minutes)")
    p.add_argument("--iopub", choices=("always", "cells"), default="always",
                   help="--kernel: read the kernel's output all the time, as a Jupyter server does (always), "
                        "or only while a cell runs (cells: the soaks before 2026-12-05 21:00)")
    p.add_argument("--no-dashboard", dest="dashboard", action="store_false",
                   help="--kernel without the '%%monarch dashboard' cell (what the live dashboard costs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--reread", metavar="RUN_DIR", help="recompute the log's fields of --out from RUN_DIR; no run")
    a = p.parse_args(argv)
    if a.reread:
        if not a.out:
            p.error("--reread needs --out (the report to update)")
        report = reread(a.reread, Path(a.out))
        Path(a.out).write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if k not in ("shots", "identity")}, indent=1))
        return 0
    if a.kernel and a.minutes is None:
        p.error("--kernel needs --minutes (the kernel's own schedule has no fault count)")
    kinds = [k.value for k in FaultKind if k not in CLUSTER_KINDS] if a.kinds == "all" else a.kinds.split(",")
    report = kernel_soak(a, kinds) if a.kernel else script_soak(a, kinds)
    run = report.pop("run", None)
    history = open_run(report.pop("run_dir", None) or run.run_dir)
    from_log = log_fields(history, history.events.path)
    pids = (run.spawned_pids + [run.lighthouse_pid]) if run is not None else spawned_pids(history)
    alive = [pid for pid in pids if pid and pid_alive(pid)]
    report = {
        **report, **from_log,
        "survived_without_intervention": (from_log["recovered"] == from_log["recoveries"]
                                          and history.summary()["state"] == "stopped"),
        "processes_left": alive,
        "run_dir": str(history.events.path.parent), "args": vars(a),
    }
    print(json.dumps({k: v for k, v in report.items() if k not in ("shots", "identity", "rss_mb", "notice_texts")},
                     indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0 if report["final_identical"] and not alive and report["gave_up"] == 0 else 1


def spawned_pids(history: RunHistory) -> list[int]:
    """Every worker and Lighthouse pid the run's event log names (a kernel's run is not here)."""
    pids = set()
    for e in history.events:
        for name in ("pid", "pids"):
            v = getattr(e, name, None)
            if isinstance(v, int):
                pids.add(v)
            elif isinstance(v, (list, tuple)):
                pids.update(x for x in v if isinstance(x, int))
    return sorted(pids)


if __name__ == "__main__":
    sys.exit(main())
