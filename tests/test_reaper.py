"""The orphan reaper's bookkeeping: it reads only what was appended to its guard file, and
finds every guarded process's descendants in one scan of the process table."""

import json
import subprocess
import sys

from monarch_nb.reaper import GuardFile, _descendants


def test_the_guard_file_is_read_incrementally_and_a_partial_line_waits(tmp_path):
    path = tmp_path / "guard.jsonl"
    path.write_text(json.dumps({"pid": 11}) + "\n" + json.dumps({"run": ["scancel", "7"]}) + "\n")
    guard = GuardFile(str(path))
    assert guard.read_new() == {11} and guard.commands == [["scancel", "7"]]
    with open(path, "a") as f:
        f.write(json.dumps({"pid": 11}) + "\n" + '{"pid": 1')  # a repeat, and a line half written
    assert guard.read_new() == set()
    with open(path, "a") as f:
        f.write('2}\n' + json.dumps({"run": ["scancel", "7"]}) + "\n")
    assert guard.read_new() == {12}
    assert guard.pids == {11, 12} and guard.commands == [["scancel", "7"]]


def test_descendants_of_several_roots_come_from_one_scan():
    import psutil

    # each parent starts a child, then tells us (one line on stdout) that it has
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('ready', flush=True); time.sleep(60)")
    parents = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in parents:
            assert p.stdout.readline().strip() == "ready"
        found = _descendants({p.pid for p in parents} | {999_999_999})
        for p in parents:
            kids = [c.pid for c in psutil.Process(p.pid).children()]
            assert p.pid in found and kids and all(k in found for k in kids)
        assert 999_999_999 not in found
    finally:
        for p in parents:
            for c in psutil.Process(p.pid).children(recursive=True):
                c.kill()
            p.kill()
            p.wait()
            p.stdout.close()


def test_guards_from_many_threads_start_one_watchdog(tmp_path):
    """Groups start in parallel, each thread guarding its pids: one watchdog, closed by close()."""
    import threading

    import psutil

    from monarch_nb.reaper import Reaper

    reaper = Reaper()
    barrier = threading.Barrier(8)

    def guard(n: int) -> None:
        barrier.wait()
        reaper.guard([900_000_000 + n])

    threads = [threading.Thread(target=guard, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    watchdogs = [p for p in psutil.Process().children() if "monarch_nb.reaper" in " ".join(p.cmdline())]
    reaper.close()
    assert len(watchdogs) == 1
    assert not watchdogs[0].is_running() or watchdogs[0].status() == psutil.STATUS_ZOMBIE
