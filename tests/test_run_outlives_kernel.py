"""A named run outlives its kernel (issue 52): a real Monarch kernel driven with jupyter_client
starts `%monarch train --name keep`, the kernel is restarted as JupyterLab does it (the kernel's
process group killed), the run goes on committing steps with no kernel attached, a new kernel
attaches, replays the run's history, injects a kill that is healed, is refused a second run of
the same name; a second attachment sees the same events; a stop ends the run once, and no process
carrying the run's id is left."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from monarch_nb.ft.control.run_client import RUN_ENV, live_runs
from monarch_nb.telemetry.events import RunStopped, Step
from monarch_nb.telemetry.follow import follow
from helpers.kernel_client import run_in_kernel as run
from helpers.proc_checks import wait_for

pytestmark = pytest.mark.slow


def processes_of(run_id: str) -> list[int]:
    """Every process whose environment carries the run's id."""
    found = []
    needle = f"{RUN_ENV}={run_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_named_run_outlives_a_kernel_restart_and_a_new_kernel_attaches_heals_and_stops_it(kernel):
    km, client = kernel
    status, out = run(client, textwrap.dedent("""
        %monarch train --replicas 2 --model tiny --name keep
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
        """), timeout=400)
        assert status == "ok", out
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
    finally:
        events.close()
        for pid in processes_of("keep") + [info["host"]]:  # a failed test leaves nothing either
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_run_whose_own_host_dies_releases_its_workers_and_says_how_to_resume(tmp_path):
    from monarch_nb.ft import FTRun, RunConfig

    run = FTRun.detached(RunConfig(replicas=2, model="tiny", run_name="orphan", runs_root=str(tmp_path),
                                   checkpoint_every=2))
    try:
        run.wait_for_step(4, timeout=120)
        started = processes_of("orphan")  # what the host started carries the run's id: Lighthouse, workers
        assert len(started) >= 3, started
        os.kill(run.host_pid, 9)  # the run's controller itself dies
        wait_for(lambda: not processes_of("orphan"), 30, "the reaper to release the run's processes")
        assert not live_runs(tmp_path)
        with pytest.raises(ValueError, match=r"host \(pid \d+\) is gone.*%monarch train --resume"):
            FTRun.attach("orphan", tmp_path)
    finally:
        run.detach()
        for pid in processes_of("orphan") + [run.host_pid]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
