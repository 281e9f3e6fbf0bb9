"""A fault-tolerant run's own home: a process that is the run's controller, apart from any kernel.

``python -m monarch_nb.ft.control.run_host`` reads a RunConfig (JSON) on stdin - or
``{"resume": RUN_DIR, "overrides": {...}}`` to continue a run from its own checkpoints - builds and starts
the ``FTRun`` (its session, supervisor, ladder, Lighthouse, checkpointer and event log are all
here), answers one JSON line on stdout once the run trains (or why it could not start), and then
serves the run's controls on a Unix socket in the run directory until the run stops. It is
started in a session of its own (``start_new_session``), so a kernel that dies or is restarted -
Jupyter signals the kernel's whole process group - takes nothing of the run with it; a kernel
attaches again with ``FTRun.attach(name)`` (``run_client.py``). With ``--ask FILE --answer FILE``
it is a SLURM batch job instead, and serves on TCP (``host_placement.py`` says why).

Why a socket of our own: Monarch's controller dies with its client (a detached controller is not
planned there), so the run's controller cannot be a Monarch actor the kernel re-attaches to.
The socket (``control.sock``) is created 0600 and every connection must also prove the run's token
(``control.token``, 0600): only the run's owner can open it. The directory is 0711 and ``host.json``
0644, so ``monarch-nb runs`` and a refused attach can name a shared runs root's owners.
"""

from __future__ import annotations

import faulthandler
import json
import os
import secrets
import signal
import sys
import threading
from multiprocessing.connection import Listener
from typing import Any

from . import host_placement
from .run_client import HOST, RUN_ENV, SOCKET, TOKEN, control_dir

# What a client may call, by name (the rest of FTRun's surface is the client's own, from the log).
CALLS = ("status", "inject", "scale", "drain", "schedule", "stop_schedule", "check_identical", "restart_from_scratch",
         "stop", "spawned_pids", "disarm", "stacks")


def serve(run: Any, stopped: threading.Event, tcp: bool = False) -> Listener:
    """Listen on the run's socket (``tcp``: on every interface, for clients on other hosts); each
    connection is one call, answered from its own thread, once it has proven the token."""
    where = control_dir(run.run_dir)
    where.mkdir(mode=0o711, exist_ok=True)  # others may read host.json (whose run it is), never list
    os.chmod(where, 0o711)
    token = secrets.token_bytes(32)
    fd = os.open(where / TOKEN, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(token)
    (where / SOCKET).unlink(missing_ok=True)  # a dead host's (a resume; a live one was refused before)
    if tcp:
        listener = Listener(("0.0.0.0", 0), family="AF_INET", authkey=token)
    else:
        old = os.umask(0o177)  # the socket file is created 0600
        try:
            listener = Listener(str(where / SOCKET), family="AF_UNIX", authkey=token)
        finally:
            os.umask(old)

    def answer(conn: Any) -> None:
        with conn:
            try:
                method, args, kwargs = conn.recv()
                if method not in CALLS:
                    raise ValueError(f"{method!r} is not a call a run answers; calls: {', '.join(CALLS)}")
                value = getattr(run, method)
                result: Any = ("ok", value(*args, **kwargs) if callable(value) else value)  # spawned_pids: a property
            except Exception as exc:  # the caller gets the error, by type and message
                result = ("error", type(exc).__name__, str(exc))
            try:
                conn.send(result)
            except Exception:
                conn.send(("error", "RuntimeError", f"the run's answer could not be sent: {result[1]!r}"))

    def accept() -> None:
        while not stopped.is_set():
            try:
                conn = listener.accept()
            except Exception:  # a client that failed the token, or the listener closed at the end
                continue
            threading.Thread(target=answer, args=(conn,), name="monarch_nb-host-call", daemon=True).start()

    threading.Thread(target=accept, name="monarch_nb-host-accept", daemon=True).start()
    return listener


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ...telemetry.events import RunStopped
    from ..settings.config import RunConfig
    from .run import FTRun

    files = argparse.ArgumentParser(prog="run_host")
    files.add_argument("--ask", default=None, help="what to run, a JSON file (a batch job has no stdin of ours)")
    files.add_argument("--answer", default=None, help="where to answer, a file written whole")
    opts = files.parse_args(argv)
    handshake = sys.stdout
    sys.stdout = sys.stderr  # our stdout is the one-line answer to the kernel; prints go to the host's log
    os.environ[host_placement.HOST_ENV] = "1"
    # A batch job's own SLURM_* settings are not the groups': their allocations must not inherit them.
    job = {name: os.environ.pop(name, None) for name in list(os.environ) if name.startswith(("SLURM_", "SBATCH_"))}
    try:
        asked = json.loads(open(opts.ask).read() if opts.ask else sys.stdin.read())
        placed = asked.pop("placed", None) or {}  # a host on Kubernetes: its Job, and how clients ask after it
        if "resume" in asked:
            run = FTRun.resume(asked["resume"], **asked.get("overrides", {}))
        else:
            run = FTRun(RunConfig.from_dict(asked).validate())
    except Exception as exc:
        host_placement.answer(opts.answer, {"error": f"{type(exc).__name__}: {exc}"}, handshake)
        return 2
    # every process of the run carries its id (a check for leftovers looks for it)
    os.environ[RUN_ENV] = run.run_id
    stopped = threading.Event()
    run.events.subscribe(lambda e: stopped.set() if isinstance(e, RunStopped) else None)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=run.stop, args=("the run's host was "
                                                                                     "terminated",)).start())
    # Ended before it answered (a start that timed out): every thread's stack goes to its log at
    # once - from the signal itself, since the main thread may be blocked where Python cannot run.
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    try:
        listener = serve(run, stopped, tcp=opts.ask is not None)
        run.start()
    except BaseException as exc:
        run.stop("it did not start")
        host_placement.answer(opts.answer, {"error": f"{type(exc).__name__}: {exc}"}, handshake)
        return 1
    host = {"pid": os.getpid(), "uid": os.getuid(), "user": _user(), "run_id": run.run_id,
            "run_dir": str(run.run_dir), "started_t": run.started_t,
            "resumed_step": run.resume_from.step if run.resume_from is not None else None,
            **placed, **host_placement.where(listener.address, job.get("SLURM_JOB_ID"),
                                     job.get("SLURMD_NODENAME") or job.get("SLURM_JOB_NODELIST")
                                     or os.environ.get("NODE_NAME"))}
    (control_dir(run.run_dir) / HOST).write_text(json.dumps(host))
    os.chmod(control_dir(run.run_dir) / HOST, 0o644)
    host_placement.answer(opts.answer, host, handshake)
    handshake.close()
    faulthandler.unregister(signal.SIGTERM)  # a SIGTERM now is the run's stop (scancel, a deleted Job)
    stopped.wait()
    listener.close()
    for name in (SOCKET, TOKEN, HOST):
        (control_dir(run.run_dir) / name).unlink(missing_ok=True)
    run.stop()  # idempotent: waits for a stop in progress to finish its release
    return 0


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


if __name__ == "__main__":
    sys.exit(main())
