"""A run on a session it shares (the magics' case: the kernel's one session also holds the user's
own meshes) logs every failure of its groups in its own event log, once, whichever detector saw
it first: Monarch's supervision or the run's own checks. (Found by the kernel soak: the failures
supervision saw first were missing from the run's log.)"""

from __future__ import annotations

import time

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.session import Session
from monarch_nb.telemetry.events import Rejoined
from helpers.notice_checks import assert_one_notice, watch_notices


def test_a_run_on_a_shared_session_logs_one_worker_failed_per_fault(tmp_path):
    session = Session()
    run = FTRun(RunConfig(replicas=2, runs_root=str(tmp_path)), session=session)
    try:
        run.start()
        shown = watch_notices(run)
        run.wait_for_step(3)
        for kind, words in (("kill", ("sig=9", "signal 9", "killed")), ("segfault", ("sig=11", "signal 11", "segv"))):
            t0 = time.time()
            run.inject(kind, replica=1)
            run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=120, since=t0)
            assert_one_notice(run, shown, 1, t0, time.time(), words)
    finally:
        run.stop()
        session.shutdown()
