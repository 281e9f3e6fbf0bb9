"""The cross-group communicator in a subprocess (``pg_subprocess``, torchft's ProcessGroupBabyGloo):
its futures must be complete when handed out, or torchft 0.2.0's managed allreduce runs the wrong
callback (ft/worker/subprocess_pg.py says why). Real subprocess, real gloo, a one-member group."""

from __future__ import annotations

from datetime import timedelta

import torch
from torch.distributed import AllreduceOptions, TCPStore

from monarch_nb import seam
from monarch_nb.ft.worker.subprocess_pg import subprocess_process_group


def test_a_subprocess_communicator_hands_out_done_futures_and_an_abort_kills_its_process():
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = subprocess_process_group(nccl=False, timeout=timedelta(seconds=60))
    pg.configure(f"127.0.0.1:{store.port}/pg", "r0", 0, 1)
    try:
        assert not seam.process_group_is_down(pg)
        x = torch.ones(4)
        opts = AllreduceOptions()
        work = pg.allreduce([x], opts)
        fut = work.get_future()
        assert fut.done()  # ProcessGroupBabyGloo's own is completed later, on its future thread
        seen = []
        fut.then(lambda f: seen.append(f.value()))
        assert len(seen) == 1  # ran inside ``then``: what torchft's callback chain needs
        work.wait()
        assert torch.equal(x, torch.ones(4))  # a one-member sum is the tensor itself
        pg.abort()
        assert seam.process_group_is_down(pg)  # the subprocess is gone: peers blocked on it would fail
    finally:
        pg.shutdown()
        # the spawn context's resource tracker lives as long as its parent (a worker, in a run);
        # this test's parent is pytest, which lives on
        from multiprocessing import resource_tracker

        resource_tracker._resource_tracker._stop()
