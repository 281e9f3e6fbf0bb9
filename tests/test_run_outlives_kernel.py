"""A named run outlives its kernel (issue 52): a real Monarch kernel driven with jupyter_client
starts `%monarch train --name keep`, the kernel is restarted as JupyterLab does it (the kernel's
process group killed), the run goes on committing steps with no kernel attached, a new kernel
attaches, replays the run's history, injects a kill that is healed, is refused a second run of
the same name; a second attachment sees the same events; a stop ends the run once, and no process
carrying the run's id is left; ``--resume`` brings it back in a host of its own."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from monarch_nb.ft.control.run_client import live_runs
from monarch_nb.telemetry.events import CheckpointSaved, RunStopped, Step
from monarch_nb.telemetry.follow import follow
from helpers.kernel_client import run_in_kernel as run
from helpers.proc_checks import processes_of, wait_for

pytestmark = pytest.mark.slow


def test_a_named_run_outlives_a_kernel_restart_and_a_new_kernel_attaches_heals_and_stops_it(kernel):
    km, client = kernel
    status, out = run(client, textwrap.dedent("""
        %monarch train --replicas 2 --model tiny --name keep --checkpoint-every 5
        import json
        print("RUN" + json.dumps({"dir": str(run.run_dir), "host": run.host_pid, "id": run.run_id}))
    """), timeout=300)
    assert status == "ok" and "it outlives this kernel" in out, out
    info = json.loads(out.split("RUN", 1)[1].splitlines()[0])
    assert info["id"] == "keep" and processes_of("keep"), "the run's processes carry its id"
    events = follow(Path(info["dir"]) / "events.jsonl")
    try:
        km.restart_kernel(now=True)  # JupyterLab's "Restart kernel": the old kernel's process group is killed
        client.wait_for_ready(timeout=120)
        t_restart = time.time()
        # no kernel holds the run: it keeps committing steps
        events.wait_for(lambda e: isinstance(e, Step) and e.committed, timeout=60, since=t_restart + 1)
        assert [r["name"] for r in live_runs(Path(info["dir"]).parent)] == ["keep"]

        status, out = run(client, textwrap.dedent("""
            %monarch runs
            %monarch attach keep
            print("REPLAY", len(run.history().recoveries()), run.config.replicas, run.config.model)
            %monarch inject kill --replica 1
            %monarch wait rejoin --replica 1 --timeout 180
            %monarch check --timeout 60
            %monarch stacks --replica 0
        """), timeout=400)
        assert status == "ok", out
        # the stacks are read by the run's host (py-spy there) and come back over its socket
        assert "=== replica0" in out and "(pid " in out, out
        assert "keep" in out.split("attached to run")[0], "runs lists the live run"
        assert "attached to run keep" in out and "REPLAY 0 2 tiny" in out, out
        assert "replica 1 rejoined at step" in out and "replicas bit-identical" in out, out

        status, out = run(client, "%monarch train --replicas 2 --model tiny --name keep")
        assert status == "error" and "is live" in out and "%monarch attach keep" in out, out
        status, out = run(client, "%monarch attach nope")
        assert status == "error" and "no run named 'nope'" in out and "live runs: keep" in out, out

        # a second attachment (this test's own process, as another kernel would) sees the same events
        from monarch_nb.ft import FTRun

        other = FTRun.attach("keep", Path(info["dir"]).parent)
        try:
            kernel_step = max(e.step for e in events.events(Step) if e.committed)
            other.wait_for(lambda e: isinstance(e, Step) and e.committed and e.step >= kernel_step, timeout=30)
            status, out = run(client, "%monarch stop", timeout=120)
            assert status == "ok" and "run keep stopped" in out, out
            assert other.stop() is None  # already stopped by the kernel: nothing more happens
        finally:
            other.detach()
        stops = [e for e in events.events(RunStopped)]
        assert len(stops) == 1, stops  # the run ended once
        wait_for(lambda: not processes_of("keep"), 30, "every process of the run to end")
        assert not live_runs(Path(info["dir"]).parent)
        status, out = run(client, "%monarch attach keep")
        assert status == "error" and "is not live" in out and "open_run" in out, out
        # it resumes where it lived: in a home of its own again, from its newest checkpoint
        status, out = run(client, f"%monarch train --resume {info['dir']} --steps 400\n"
                                  "print('HOST', run.host_pid, run.stopped)", timeout=300)
        assert status == "ok" and "resumed from step" in out and "it outlives this kernel" in out, out
        assert "HOST" in out and out.split("HOST ")[1].split()[1] == "False", out
        info["host"] = int(out.split("HOST ")[1].split()[0])
        assert [r["name"] for r in live_runs(Path(info["dir"]).parent)] == ["keep"]
        status, out = run(client, "%monarch stop", timeout=120)
        assert status == "ok" and "run keep stopped" in out, out
        wait_for(lambda: not processes_of("keep"), 30, "every process of the resumed run to end")
    finally:
        events.close()
        for pid in processes_of("keep") + [info["host"]]:  # a failed test leaves nothing either
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_run_whose_own_host_dies_releases_its_workers_and_resumes_in_a_new_home(tmp_path):
    from monarch_nb.ft import FTRun, RunConfig

    run = FTRun.detached(RunConfig(replicas=2, model="tiny", run_name="orphan", runs_root=str(tmp_path),
                                   checkpoint_every=2))
    hosts = [run.host_pid]
    try:
        run.wait_for_step(4, timeout=120)
        started = processes_of("orphan")  # what the host started carries the run's id: Lighthouse, workers
        assert len(started) >= 3, started
        os.kill(run.host_pid, 9)  # the run's controller itself dies
        wait_for(lambda: not processes_of("orphan"), 30, "the reaper to release the run's processes")
        assert not live_runs(tmp_path)
        with pytest.raises(ValueError, match=r"host \(pid \d+\) is gone.*%monarch train --resume"):
            FTRun.attach("orphan", tmp_path)
        # what the message offers: the run continues from its checkpoints in a new home of its own
        # from its newest complete checkpoint: the one logged last, or a later one its workers finished
        # writing while the host was killed before it logged it (seen in CI: logged 4, on disk 6)
        logged = max(e.step for e in run.events.events(CheckpointSaved))
        t_resume = time.time()
        again = FTRun.resume_detached(run.run_dir, steps=logged + 10)
        hosts.append(again.host_pid)
        saved = again.resumed_step
        assert again.host_pid != run.host_pid and saved >= logged and saved % 2 == 0, (saved, logged)
        assert [r["name"] for r in live_runs(tmp_path)] == ["orphan"]
        with pytest.raises(ValueError, match="is live.*%monarch attach orphan"):
            FTRun.resume_detached(run.run_dir)
        done = again.wait_for(lambda e: isinstance(e, RunStopped), timeout=180, since=t_resume)
        assert done.reason == "finished", done
        steps = [e.step for e in again.events.events(Step) if e.t >= t_resume and e.committed]
        assert min(steps) == saved + 1 and max(steps) == logged + 10, steps  # on from the checkpoint, to the end
        wait_for(lambda: not processes_of("orphan"), 30, "the resumed run's processes to end with it")
    finally:
        run.detach()
        for pid in processes_of("orphan") + hosts:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


OTHER_USER = """
import json, os, sys
from multiprocessing.connection import Client
where = sys.argv[1]
print("OWNER", json.load(open(os.path.join(where, "host.json")))["user"])
for what, act in (("token", lambda: open(os.path.join(where, "control.token"), "rb").read()),
                  ("socket", lambda: Client(os.path.join(where, "control.sock"), family="AF_UNIX", authkey=b"guess"))):
    try:
        act()
        print(what, "OPENED")
    except PermissionError:
        print(what, "refused")
"""


def test_another_user_can_see_whose_run_it_is_but_cannot_open_its_controls(monkeypatch):
    """The run's controls are its owner's alone: run as the real user ``nobody`` (Debian's own
    python: ours lives under /root), the run's token and socket are refused by the OS."""
    import shutil
    import subprocess
    import tempfile

    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.ft.control.run_client import CONTROL_DIR

    if os.getuid() != 0 or not shutil.which("runuser") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root (to act as another user), runuser and /usr/bin/python3")
    root = Path(tempfile.mkdtemp(prefix="monarch_nb-shared-runs-"))
    root.chmod(0o755)  # a shared runs root
    run = FTRun.detached(RunConfig(replicas=2, model="tiny", run_name="mine", runs_root=str(root)))
    try:
        where = run.run_dir / CONTROL_DIR
        out = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", OTHER_USER, str(where)],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == ["OWNER", "root", "token", "refused", "socket", "refused"], out
        monkeypatch.setattr(os, "getuid", lambda: 65534)  # attach's own refusal, as that user would see it
        with pytest.raises(PermissionError, match="belongs to user 'root'; only its owner can attach"):
            FTRun.attach("mine", root)
        monkeypatch.undo()
        assert run.status()[0]["state"] == "training"  # the refused user changed nothing
    finally:
        run.stop()
        run.detach()
        shutil.rmtree(root, ignore_errors=True)
