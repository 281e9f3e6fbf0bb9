"""Where a detached run's host lives, how it is started, reached and known to be alive.

``local`` (default): ``run_host`` is a process of its own on this machine, in a session of its own;
it is asked on stdin and answers on stdout; alive while its pid is; reached on a Unix socket (0600).

``cluster`` (``controller_on="cluster"``, job="slurm"): ``run_host`` is the batch job of a SLURM
allocation of its own (one CPU, the run's partition and time limit), so the cluster keeps it alive
and ends it, wherever the kernel is. A batch job has no pipe to us: what to run and its answer are
files in the runs root (0600). It listens on TCP (a Unix socket does not cross hosts); a client
must prove the run's token (``control.token``, 0600 in the run directory) before anything it sends
is read - multiprocessing's HMAC challenge. Alive while SLURM holds its job; a ``scancel`` of it
is the run's host terminated (SIGTERM: the run stops and releases its groups' allocations).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HOST_MODULE = "monarch_nb.ft.control.run_host"
HOST_ENV = "MONARCH_NB_RUN_HOST"  # set in a run's host: a run placed on the cluster may start only there


def start(asked: dict[str, Any], runs: Path, timeout: float, cluster: dict[str, Any] | None) -> tuple[dict, Path]:
    """Start a host with ``asked``; returns its one answer (or ``{"error": ...}``) and its log."""
    stem = runs / f".host-{os.getpid()}-{time.time_ns()}"
    if cluster is None:
        return _start_local(asked, stem, timeout), Path(f"{stem}.log")
    return _start_on_slurm(asked, stem, timeout, cluster), Path(f"{stem}.log")


def _start_local(asked: dict[str, Any], stem: Path, timeout: float) -> dict[str, Any]:
    log = open(f"{stem}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", HOST_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=log, start_new_session=True, cwd=os.getcwd())
    log.close()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(asked, default=str).encode())
    proc.stdin.close()
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if box and box[0]:
        answer = json.loads(box[0])
    else:
        answer = {"error": f"the run's host ended without starting the run (its log: {stem}.log)"}
    if "error" in answer:
        proc.wait(30)
    return answer


def _start_on_slurm(asked: dict[str, Any], stem: Path, timeout: float, cluster: dict[str, Any]) -> dict[str, Any]:
    from ...jobs import slurm

    ask, answer_file = Path(f"{stem}.ask.json"), Path(f"{stem}.answer.json")
    _write_private(ask, json.dumps(asked, default=str))
    name = asked.get("run_name") or Path(str(asked.get("resume", "run"))).name
    try:
        job = slurm.submit_batch([sys.executable, "-m", HOST_MODULE, "--ask", str(ask), "--answer", str(answer_file)],
                                 name=f"monarch_nb-host-{name}", log=Path(f"{stem}.log"),
                                 partition=cluster.get("partition"), time_limit=cluster.get("time_limit"))
    except slurm.SlurmError as exc:
        ask.unlink(missing_ok=True)
        return {"error": f"the run's host could not be placed on SLURM: {exc}"}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if answer_file.exists():
                answer = json.loads(answer_file.read_text())
                break
            if not slurm.alive(job):
                answer = {"error": f"the run's host (SLURM job {job}) ended without starting the run "
                                   f"({slurm.job_states([job])[job].describe()}; its log: {stem}.log)"}
                break
            time.sleep(0.1)  # polling files and squeue: a batch job can tell us nothing else
        else:
            answer = {"error": f"the run's host (SLURM job {job}) did not start the run within {timeout:g} s; "
                               f"cancelled it (its log: {stem}.log)"}
    finally:
        ask.unlink(missing_ok=True)
        answer_file.unlink(missing_ok=True)
    if "error" in answer:
        slurm.cancel(job)
        wait_gone({"slurm_job": job}, 30.0)
    return answer


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def answer(path: str | None, reply: dict[str, Any], stream: Any) -> None:
    """The host's one answer: a line on its stdout, or (a batch job) a file written whole."""
    if path is None:
        print(json.dumps(reply), file=stream, flush=True)
        return
    _write_private(Path(f"{path}.part"), json.dumps(reply))
    os.replace(f"{path}.part", path)


def where(listener_address: Any, slurm_job: str | None, node: str | None) -> dict[str, Any]:
    """What host.json says about where the host is, beyond its pid: its TCP address and SLURM job."""
    if not isinstance(listener_address, tuple):
        return {}
    import socket

    return {"address": [socket.gethostname(), listener_address[1]], "slurm_job": slurm_job, "node": node}


def connect(host: dict[str, Any], control: Path, token: bytes) -> Any:
    from multiprocessing.connection import Client

    if host.get("address"):
        return Client(tuple(host["address"]), family="AF_INET", authkey=token)
    return Client(str(control / "control.sock"), family="AF_UNIX", authkey=token)


def alive(host: dict[str, Any]) -> bool:
    if host.get("slurm_job"):
        from ...jobs import slurm

        return slurm.alive(str(host["slurm_job"]))
    return _pid_alive(int(host.get("pid", 0)))


def describe(host: dict[str, Any]) -> str:
    if host.get("slurm_job"):
        return f"SLURM job {host['slurm_job']} on {host.get('node')}"
    return f"pid {host.get('pid')}"


def wait_gone(host: dict[str, Any], timeout: float) -> None:
    """Until the host has exited (a local one's pidfd becomes readable; a SLURM job leaves squeue)."""
    if host.get("slurm_job"):
        deadline = time.monotonic() + timeout
        while alive(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        return
    try:
        fd = os.pidfd_open(int(host["pid"]))
    except OSError:
        return  # gone already
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie (exited, not yet reaped by whoever started it) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True
