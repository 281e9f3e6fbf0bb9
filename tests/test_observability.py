"""Seeing inside real worker processes: their log files, their stacks (py-spy from outside,
faulthandler as the fallback), a cell interrupted on the workers, and a post-mortem pdb."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time

import pytest

from monarch_nb import Session
from monarch_nb import stacks as stacks_mod
from monarch_nb.errors import CallInterrupted, MonarchNbError
from monarch_nb.stacks import StackError, grouped
from helpers.proc_checks import assert_gone, wait_for

HOLD_GIL = """
import ctypes
def hold_the_gil_for(seconds):
    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(seconds)
hold_the_gil_for(15)
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = Session(default_timeout=30, log_dir=tmp_path_factory.mktemp("observability"))
    s.up("main", procs=2)
    yield s
    pids = [p.pid for h in s.meshes.values() for p in h.procs if p.pid]
    s.shutdown()
    assert_gone(pids)


def cell(session, code, mesh="main", timeout=30):
    handle = session.mesh(mesh)
    return session.deadline(handle.agent, timeout).run_cell.call(code)


def test_every_rank_writes_its_output_to_its_own_file_and_identical_lines_fold(session):
    # Output of threads the cell starts (not of the cell itself, which the cell shows), logging,
    # and a native write straight to fd 2: all in the rank's file.
    cell(session, "import logging, os, threading\n"
                  "t = threading.Thread(target=lambda: print('background says', rank)); t.start(); t.join()\n"
                  "t = threading.Thread(target=lambda: print('the same on every rank')); t.start(); t.join()\n"
                  "logging.getLogger('mine').warning('careful on %d', rank)\n"
                  "os.write(2, b'native write\\n')")
    handle = session.mesh("main")
    for rank in range(2):
        text = (handle.log_dir / f"main-rank{rank}.log").read_text()
        assert f"[main rank {rank}] background says {rank}" in text
        assert f"[main rank {rank}] WARNING mine: careful on {rank}" in text
        assert "\nnative write\n" in text
    view = session.logs("main")
    same = [ln for ln in view.lines if ln.text == "the same on every rank"]
    assert len(same) == 1 and len(same[0].where) == 2, view.text()
    assert len(session.logs("main", rank=1, grep="background").lines) == 1
    with pytest.raises(MonarchNbError, match="no mesh named 'nope'; known meshes: main"):
        session.logs("nope")


@pytest.mark.slow  # a rank holds the GIL for 15 s
def test_stacks_of_a_rank_that_holds_the_gil_come_back_within_seconds(session):
    handle = session.mesh("main")
    held = handle.agent.slice(gpus=1).run_cell.call(HOLD_GIL)
    log = handle.log_dir / "main-rank1.log"
    wait_for(lambda: "hold_the_gil_for" in session.stacks("main", [1])[0].text, 15, "rank 1 to hold the GIL")
    t0 = time.monotonic()
    (stack,) = session.stacks("main", [1])
    took = time.monotonic() - t0
    assert stack.how == "py-spy" and "hold_the_gil_for" in stack.text, stack.text
    # py-spy reads a GIL holder's stack in ~0.02 s (bench/bench_observability.py); 5 s is a sanity bound
    assert took < 5, f"reading the stack of a rank holding the GIL took {took:.2f} s"
    # Where py-spy cannot attach, the process writes its own stacks (faulthandler, SIGUSR1).
    real = stacks_mod._py_spy
    stacks_mod._py_spy = lambda: None
    try:
        (fallback,) = session.stacks("main", [1])
    finally:
        stacks_mod._py_spy = real
    assert fallback.how == "faulthandler" and "hold_the_gil_for" in fallback.text, fallback.text
    assert "File \"<monarch cell" in log.read_text()
    # Both ranks: rank 0 idles, rank 1 holds the GIL; identical stacks would print once.
    both = session.stacks("main")
    assert [s.label for s in both] == ["main rank 0", "main rank 1"] and len(grouped(both)) == 2
    held.get(timeout=60)  # the next tests need rank 1 free again (a loaded CI box is slow to get here)


def test_stack_errors_name_the_rank_and_what_to_do(session, tmp_path):
    with pytest.raises(ValueError, match=r"rank 7 is not in mesh 'main' \(ranks 0..1\)"):
        session.stacks("main", [7])
    fake = tmp_path / "py-spy"  # a py-spy that the kernel refuses ptrace, as under yama ptrace_scope=3
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(StackError, match="ptrace_scope"):
        stacks_mod.py_spy_dump(os.getpid(), exe=str(fake))


def test_a_dead_rank_has_no_stack_and_no_post_mortem():
    with Session(default_timeout=30) as s:
        handle = s.up("doomed", procs=2)
        pid = handle.procs[1].pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: handle.failed_ranks == [1], 15, "rank 1 to be seen dead")
        with pytest.raises(StackError, match="doomed rank 1 is failed .*a dead process has no stack"):
            s.stacks("doomed", [1])
        listed = s.stacks("doomed")  # all ranks: the dead one is listed as such
        assert [x.how for x in listed] == ["py-spy", "unavailable"]
        with pytest.raises(MonarchNbError, match="doomed rank 1 is failed"):
            s.debug("doomed", 1)


def test_post_mortem_shows_the_frame_of_a_value_error_raised_on_rank_1(session):
    result = session.deadline(session.mesh("main").agent, 30).run_cell.gather(
        "def check(x):\n    y = x + 1\n    if rank == 1:\n        raise ValueError(f'bad {x}')\n    return y\ncheck(41)")
    assert result.values[1].error == "ValueError: bad 41" and result.values[0].error is None
    where = session.debug("main", 1).output
    assert "ValueError: bad 41" in where and "check()" in where and "raise ValueError" in where
    assert session.debug("main", 1, "p x").output.strip() == "41"
    assert "check(41)" in session.debug("main", 1, "up").output
    assert "def check(x):" in session.debug("main", 1, "l").output
    assert "raise ValueError" in session.debug("main", 1, "down").output
    assert session.debug("main", 1, "q").done
    with pytest.raises(MonarchNbError, match="rank 1 has no stored exception"):
        session.debug("main", 1)
    with pytest.raises(MonarchNbError, match="rank 0 has no stored exception"):
        session.debug("main", 0)


def _interrupt_when_started(markers):
    """Ctrl-C (SIGINT to the main thread) once every rank wrote its marker: the call is then in
    flight on every rank (a fixed delay raced the send on a loaded CI box). Returns a list that
    receives the time the interrupt was sent."""
    main, fired = threading.get_ident(), []

    def fire():
        wait_for(lambda: all(m.exists() for m in markers), 60, "every rank to start the cell")
        fired.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()
    return fired


def test_an_interrupted_call_stops_the_cell_on_the_workers_and_the_mesh_stays_usable(tmp_path):
    # Ctrl-C as a kernel sees it: Python's own SIGINT handler. An earlier test in this process may
    # have left another one installed (an asyncio loop's no-op handler: the CI run showed SIGINT
    # arriving and no KeyboardInterrupt).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Session(default_timeout=30, log_dir=tmp_path / "logs") as own:  # no state left by other tests
            handle = own.up("main", procs=2)
            _interrupted_call_checks(own, handle, tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_call_checks(session, handle, tmp_path):
    started = [tmp_path / f"sleeping-{r}" for r in range(2)]
    fired = _interrupt_when_started(started)
    try:
        got = session.deadline(handle.agent, 300, on_interrupt=lambda: handle.agent.interrupt.broadcast()
                               ).run_cell.gather(f"import time\nopen(f'{tmp_path}/sleeping-{{rank}}', 'w').close()\n"
                                                 "t0 = time.time()\ntry:\n    time.sleep(120)\nfinally:\n"
                                                 "    slept = time.time() - t0")
    except CallInterrupted as exc:
        info = exc
    else:
        pytest.fail(f"not interrupted: markers {[m.exists() for m in started]}, fired {fired}, replies {got.values}, "
                    f"errors {got.errors}")
    ended_s = time.monotonic() - fired[0]
    # interrupt -> the call ends: median 0.07 s, max 0.16 s (bench/bench_observability.py); 3 s is >= 10x
    assert ended_s < 3.0, f"interrupt -> the call ended took {ended_s:.2f} s"
    outputs = info.result.values
    assert sorted(outputs) == [0, 1] and all(o.interrupted for o in outputs.values()), outputs
    assert all("time.sleep(120)" in o.error for o in outputs.values())
    slept = session.deadline(handle.agent, 30).run_cell.call("slept").values
    assert all(float(v.result) < 60 for v in slept.values()), slept  # the 120 s sleep was cut short
    # a busy Python loop stops too
    _interrupt_when_started([tmp_path / f"busy-{r}" for r in range(2)])
    with pytest.raises(CallInterrupted):
        session.deadline(handle.agent, 300, on_interrupt=lambda: handle.agent.interrupt.broadcast()).run_cell.gather(
            f"open(f'{tmp_path}/busy-{{rank}}', 'w').close()\nn = 0\nwhile True:\n    n += 1")
    assert all(int(v.result) > 0 for v in session.deadline(handle.agent, 30).run_cell.call("n").values.values())


def test_a_renamed_mesh_writes_on_under_its_new_name(tmp_path):
    with Session(default_timeout=30, log_dir=tmp_path) as s:
        s.up("spare0", procs=1)
        s.rename("spare0", "replica3")
        handle = s.mesh("replica3")
        threading_print = "import threading\nt = threading.Thread(target=lambda: print('after')); t.start(); t.join()"
        s.deadline(handle.agent, 30).run_cell.call(threading_print)
        text = (tmp_path / "logs" / "replica3-rank0.log").read_text()
        assert "writes here as replica3 rank 0" in text and "[replica3 rank 0] after" in text
        assert s.logs("replica3").files and s.log_dir_of("spare0") == s.log_dir_of("replica3")
