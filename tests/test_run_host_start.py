"""A run's host that is ended before it answered says where it was: every thread's stack in its
log (a host on Kubernetes that never started its groups left an empty log in CI, and nothing to
go on). Real host process, real local run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from helpers.proc_checks import assert_gone, processes_of, wait_for

pytestmark = pytest.mark.slow


def test_a_host_ended_while_it_starts_the_run_writes_its_stacks_to_its_log_and_leaves_nothing(tmp_path):
    ask, answer, log = tmp_path / "ask.json", tmp_path / "answer.json", tmp_path / "host.log"
    ask.write_text(json.dumps({"replicas": 2, "model": "tiny", "runs_root": str(tmp_path / "runs"),
                               "run_name": "ended"}))
    with open(log, "wb") as err:
        host = subprocess.Popen([sys.executable, "-m", "monarch_nb.ft.control.run_host", "--ask", str(ask),
                                 "--answer", str(answer)], stderr=err, stdout=subprocess.DEVNULL)
    try:
        events = tmp_path / "runs" / "ended" / "events.jsonl"
        # inside run.start(): its Lighthouse is up, its groups not yet
        wait_for(lambda: events.exists() and "lighthouse_started" in events.read_text(), 120,
                 "the host's Lighthouse")
        assert not answer.exists(), "the run started before the test could end it: nothing was tested"
        host.send_signal(signal.SIGTERM)
        dumped = wait_for(lambda: "most recent call first" in log.read_text() and log.read_text(), 30,
                          "the host's stacks in its log")
        assert "run_host.py" in dumped and "line" in dumped, dumped[-2000:]
        assert host.wait(timeout=120) is not None
        assert_gone(processes_of("ended"), timeout=30)
    finally:
        if host.poll() is None:
            host.kill()
