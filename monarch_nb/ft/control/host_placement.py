"""Where a detached run's host lives, how it is started, reached and known to be alive.

``local`` (default): ``run_host`` is a process of its own on this machine, in a session of its own;
it is asked on stdin and answers on stdout; alive while its pid is; reached on a Unix socket (0600).

``cluster`` (``controller_on="cluster"``): the cluster keeps the run's controller alive and ends
it, wherever the kernel is. job="slurm": ``run_host`` is the batch job of a SLURM allocation of its
own (one CPU, the run's partition and time limit); job="kubernetes": the pod of a Kubernetes Job of
its own (``jobs/kubernetes_host.py``). Neither has a pipe to us: what to run and its answer are
files in the runs root (0600), which the host sees at the same path (the one-machine clusters share
this machine's disk; elsewhere the runs root must be shared storage). It listens on TCP (a Unix
socket does not cross hosts); a client must prove the run's token (``control.token``, 0600 in the
run directory) before anything it sends is read - multiprocessing's HMAC challenge. Alive while
the cluster holds its job; a ``scancel`` of it, or a delete of its Kubernetes Job, is the run's
host terminated (SIGTERM: the run stops and releases its groups' allocations or pod sets).
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
from typing import Any, Callable

HOST_MODULE = "monarch_nb.ft.control.run_host"
HOST_ENV = "MONARCH_NB_RUN_HOST"  # set in a run's host: a run placed on the cluster may start only there


def start(asked: dict[str, Any], runs: Path, timeout: float, cluster: dict[str, Any] | None) -> tuple[dict, Path]:
    """Start a host with ``asked``; returns its one answer (or ``{"error": ...}``) and its log."""
    stem = runs / f".host-{os.getpid()}-{time.time_ns()}"
    if cluster is None:
        return _start_local(asked, stem, timeout), Path(f"{stem}.log")
    if cluster["kind"] == "kubernetes":
        return _start_on_kubernetes(asked, stem, timeout, cluster["spec"]), Path(f"{stem}.log")
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
    try:
        job = slurm.submit_batch([sys.executable, "-m", HOST_MODULE, "--ask", str(ask), "--answer", str(answer_file)],
                                 name=f"monarch_nb-host-{_run_name(asked)}", log=Path(f"{stem}.log"),
                                 partition=cluster.get("partition"), time_limit=cluster.get("time_limit"))
    except slurm.SlurmError as exc:
        ask.unlink(missing_ok=True)
        return {"error": f"the run's host could not be placed on SLURM: {exc}"}
    try:
        answer = _await_answer(answer_file, timeout, f"SLURM job {job}", "cancelled", Path(f"{stem}.log"),
                               ended=lambda: None if slurm.alive(job) else slurm.job_states([job])[job].describe())
    finally:
        ask.unlink(missing_ok=True)
        answer_file.unlink(missing_ok=True)
    if "error" in answer:
        slurm.cancel(job)
        wait_gone({"slurm_job": job}, 30.0)
    return answer


def _start_on_kubernetes(asked: dict[str, Any], stem: Path, timeout: float, spec: Any) -> dict[str, Any]:
    from ...jobs import kubernetes_api as kapi
    from ...jobs import kubernetes_host as khost
    from ...jobs import local_k8s
    from ..settings.tinydata import cache_root, ensure_tinydata

    name = _run_name(asked)
    job = khost.job_name(name)
    # how a client asks after it (the kernel's kubeconfig); the pod itself reads the API in-cluster
    placed = {"kubernetes_job": job, "namespace": spec.namespace, "kubeconfig": spec.kubeconfig, "context": spec.context}
    ask, answer_file, log = Path(f"{stem}.ask.json").resolve(), Path(f"{stem}.answer.json").resolve(), Path(f"{stem}.log")
    _write_private(ask, json.dumps({**asked, "placed": placed}, default=str))
    log.touch()
    command = (f"exec {spec.python} -m {HOST_MODULE} --ask {ask} --answer {answer_file} 2>>{log.resolve()}")
    shares_disk = bool(spec.host_paths)  # the one-machine cluster: code, data and runs at the same paths
    docs = khost.manifests(spec, name, ["/bin/sh", "-c", command],
                           read_only=[*spec.host_paths, str(ensure_tinydata())] if shares_disk else [],
                           writable=[str(stem.parent.resolve())] if shares_disk else [],
                           working_dir=spec.working_dir,
                           env={**spec.env, "MONARCH_NB_CACHE": str(cache_root())} if shares_disk else dict(spec.env),
                           api_at_host_ip=spec.context == local_k8s.CONTEXT)
    target = kapi.ApiTarget(spec.namespace, spec.kubeconfig, spec.context)
    with kapi.api_client(target) as api:

        def ended() -> str | None:
            state = khost.state(api, spec.namespace, job)
            return khost.pod_problem(api, spec.namespace, job) or (None if state in ("RUNNING", "PENDING") else state)

        try:
            kapi.require_namespace(api, target)
            kapi.apply(api, docs)
            answer = _await_answer(answer_file, timeout, f"Kubernetes Job {spec.namespace}/{job}", "deleted", log,
                                   ended=ended, poll=0.2)  # two API calls a look
        except kapi.KubernetesPodError as exc:
            answer = {"error": f"the run's host could not be placed on Kubernetes: {exc}"}
        finally:
            ask.unlink(missing_ok=True)
            answer_file.unlink(missing_ok=True)
        if "error" in answer:
            khost.delete(api, spec.namespace, job)
    return answer


def _run_name(asked: dict[str, Any]) -> str:
    return asked.get("run_name") or Path(str(asked.get("resume", "run"))).name


def _await_answer(answer_file: Path, timeout: float, host: str, undone: str, log: Path,
                  ended: Callable[[], str | None], poll: float = 0.1) -> dict[str, Any]:
    """The host's answer (a file written whole), or why none will come: ``ended()`` says why the
    cluster no longer runs it, or the timeout passed (the caller then ends the host: ``undone``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer_file.exists():
            return json.loads(answer_file.read_text())
        why = ended()
        if why:
            return {"error": f"the run's host ({host}) ended without starting the run ({why}; its log: {log})"}
        time.sleep(poll)  # polling a file and the cluster: a job or pod can tell us nothing else
    return {"error": f"the run's host ({host}) did not start the run within {timeout:g} s; {undone} it "
                     f"(its log: {log})"}


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
    """What host.json says about where the host is, beyond its pid: its TCP address (a pod's IP: its
    name resolves nowhere else) and SLURM job."""
    if not isinstance(listener_address, tuple):
        return {}
    import socket

    here = os.environ.get("POD_IP") or socket.gethostname()
    return {"address": [here, listener_address[1]], "slurm_job": slurm_job, "node": node}


def connect(host: dict[str, Any], socket_path: Path, token: bytes) -> Any:
    from multiprocessing.connection import Client

    if host.get("address"):
        return Client(tuple(host["address"]), family="AF_INET", authkey=token)
    return Client(str(socket_path), family="AF_UNIX", authkey=token)


def alive(host: dict[str, Any]) -> bool:
    if host.get("kubernetes_job"):
        from ...jobs import kubernetes_api as kapi
        from ...jobs import kubernetes_host as khost

        with kapi.api_client(_target(host)) as api:
            return khost.state(api, host["namespace"], host["kubernetes_job"]) == "RUNNING"
    if host.get("slurm_job"):
        from ...jobs import slurm

        return slurm.alive(str(host["slurm_job"]))
    return _pid_alive(int(host.get("pid", 0)))


def _target(host: dict[str, Any]) -> Any:
    from ...jobs import kubernetes_api as kapi

    return kapi.ApiTarget(host["namespace"], host.get("kubeconfig"), host.get("context"))


def on_cluster(host: dict[str, Any]) -> bool:
    """The host is a cluster's job (SLURM, Kubernetes), reached over TCP: no process of this machine's."""
    return bool(host.get("slurm_job") or host.get("kubernetes_job"))


def describe(host: dict[str, Any]) -> str:
    if host.get("kubernetes_job"):
        return f"Kubernetes Job {host['namespace']}/{host['kubernetes_job']} on {host.get('node')}"
    if host.get("slurm_job"):
        return f"SLURM job {host['slurm_job']} on {host.get('node')}"
    return f"pid {host.get('pid')}"


def wait_gone(host: dict[str, Any], timeout: float) -> None:
    """Until the host has exited (a local one's pidfd becomes readable; a SLURM job leaves squeue)."""
    if on_cluster(host):
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
