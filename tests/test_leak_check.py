"""The leak check (conftest.py) fails the test that leaves something behind and names it.

Runs a small suite with our conftest in a separate pytest process, so what it leaves behind
on purpose never touches this one."""

import shutil
from pathlib import Path

TESTS = Path(__file__).resolve().parent

LEAKY = '''
import signal, socket, subprocess, sys, threading
import pytest
import kept

def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

def test_leaves_everything():
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="left-thread").start()
    kept.things += [stop, sleeper()]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    kept.things.append(listener)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

def test_clean():
    pass

@pytest.fixture(scope="module")
def shared():
    return {}

def test_grows_a_shared_object(shared):
    shared["worker"] = sleeper()
    kept.things.append(shared["worker"])

@pytest.fixture(scope="session")
def pool():
    return {}

def test_grows_a_session_object(pool):  # its thread is the session's until the session ends
    pool["stop"] = threading.Event()
    threading.Thread(target=pool["stop"].wait, name="grown-thread").start()
    kept.things.append(pool["stop"])
'''

CLEANUP = '''
import signal, subprocess, threading
import kept

def test_cleans_up_what_the_other_module_left():
    for thing in kept.things:
        if isinstance(thing, threading.Event):
            thing.set()
        elif isinstance(thing, subprocess.Popen):
            thing.kill()
            thing.wait()
        else:
            thing.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
'''


def test_a_test_that_leaves_things_behind_fails_naming_them(pytester, monkeypatch):
    monkeypatch.delenv("MONARCH_NB_LEAKS", raising=False)  # the default: a leak fails
    shutil.copy(TESTS / "conftest.py", pytester.path / "conftest.py")
    shutil.copytree(TESTS / "helpers", pytester.path / "helpers")
    with open(pytester.path / "conftest.py", "a") as f:
        f.write("\nleak_check.GRACE_S = 0.5  # what is left here stays: no need to wait long\n")
    pytester.makepyfile(kept="things = []", test_a_leaky=LEAKY, test_b_cleanup=CLEANUP)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=5, errors=2)
    out = result.stdout.str()
    result.stdout.re_match_lines([
        r"test_leaves_everything left behind: 1 thread \(left-thread\), 1 child process \(pid \d+: .*"
        r"time.sleep\(30\)\), 1 listening socket \(127.0.0.1:\d+\), SIGINT handler <Handlers.SIG_IGN: 1>, "
        r"native SIGINT handler SIG_IGN \(not Python's: Ctrl-C may raise nothing\)",
        r"test_a_leaky.py \(its module-scoped fixtures and the tests that used them\) left behind: "
        r"1 child process \(pid \d+: .*time.sleep\(30\) \[appeared in test_grows_a_shared_object "
        r"\(shares shared\)\]\)",
    ])
    assert "test_clean left behind" not in out and "test session left behind" not in out
    assert "grown-thread" not in out  # not charged to the module; gone by the session's end
