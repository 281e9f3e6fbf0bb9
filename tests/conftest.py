"""Shared fixtures: real Monarch sessions, real kernels, and orphan checks by pid.

No tests/__init__.py on purpose: torchmonarch installs a top-level package named
``tests``; pytest runs with ``--import-mode=importlib`` so ours never collides.

Leak check (``helpers/leak_check.py``): a test fails, naming them, if it leaves behind a SIGINT handler
other than Python's, non-daemon threads, child processes, listening sockets or SLURM jobs of
ours that were not there before it. Each is compared with a snapshot at the right scope:

* per test: ``_no_leaks`` is the first function-scoped fixture (autouse, root conftest), so pytest
  sets it up after every module- and session-scoped fixture the test uses and tears it down after
  every function-scoped one. Its snapshot therefore already holds what broader fixtures own, and
  what is new at its teardown was left by the test or its function fixtures. Exception: a test
  using a module/class/session fixture of ours that has a value (a shared Session or shell) may
  grow what that object owns (``%monarch up`` in a module-wide shell): its leftovers are charged
  to the end of that fixture's scope, naming the test, instead of failing it: the module's end,
  or the session's when a session fixture is shared (Playwright's loop starts executor threads
  for a screenshot). A SIGINT handler still fails the test.
* per module: ``_no_module_leaks`` is the first module-scoped fixture, so it compares the state
  after the module's fixtures are torn down with the state before they were set up.
* per session: ``_no_session_leaks`` is set up first and torn down last.

A session-scoped fixture may be set up in the middle of a module (the first test that needs it):
what it creates while being set up (and those processes' descendants) is its own until it is
torn down, and no module or test is charged with it. Threads, processes, sockets and jobs get
``leak_check.GRACE_S`` to go before they count. SLURM jobs are checked per test only for tests
marked ``slurm`` (only they reach the cluster), per module and session whenever ``squeue`` exists.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import monarch_nb  # noqa: F401  (must come before any test module imports monarch)
from helpers import leak_check
from helpers.proc_checks import assert_gone

pytest_plugins = ["pytester"]  # test_leak_check.py runs a small suite through our conftest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"

_owned: dict[object, leak_check.Owned] = {}  # session fixture -> what its setup created
_charged: dict[object, str] = {}  # thing left -> the test (using a shared object) that left it
_grown = leak_check.Owned()  # what tests grew in session-scoped shared objects: checked at session end
_reported: set[object] = set()  # reported once, at the narrowest scope that left it


# Monarch's client listens on the address of the first TCP transport its process used, for the
# process's life. Tests that put meshes on Kubernetes pods in this process need that address to
# be one the pods route to (the pod bridge's gateway); a ProcessJob or SLURM mesh first would make
# it loopback, and every attach to a pod then fails ("config push failed during attach"). So they
# run first; local, ProcessJob and SLURM meshes on this host reach the gateway address as well.
# (A kernel that used those first is refused by name and has to be restarted: docs/kubernetes.md;
# tests/test_k8s_drain.py runs its run in a process of its own: helpers/fresh_process.py.)
POD_TRANSPORT_FIRST = ("test_k8s_mesh.py",)


def pytest_collection_modifyitems(session, config, items):
    first = [item for item in items if item.path.name in POD_TRANSPORT_FIRST]
    items[:] = first + [item for item in items if item.path.name not in POD_TRANSPORT_FIRST]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Record what a session-scoped fixture creates while being set up (its own, see above)."""
    if fixturedef.scope not in ("session", "package") or fixturedef.argname.startswith("_no_"):
        return (yield)
    before = leak_check.take(jobs=False)
    try:
        return (yield)
    finally:
        _owned.setdefault(fixturedef, leak_check.Owned()).add(before, leak_check.take(jobs=False))


def pytest_fixture_post_finalizer(fixturedef, request):
    _owned.pop(fixturedef, None)


# A leak fails the test (or module, or session) that left it. MONARCH_NB_LEAKS=warn turns each
# into a warning in pytest's summary and a line in test-artifacts/leaks.txt instead (to survey
# them all in one run).
LEAKS_FAIL = os.environ.get("MONARCH_NB_LEAKS", "fail") != "warn"


def _report(left: dict, who: str) -> None:
    """Report what is left, each thing once (at the narrowest scope that left it)."""
    left = {kind: new for kind, items in left.items()
            if (new := {k: v for k, v in items.items() if k not in _reported})}
    if left:
        _reported.update(k for items in left.values() for k in items)
        message = f"{who} left behind: {leak_check.describe(left, _charged)}"
        if LEAKS_FAIL:
            pytest.fail(message, pytrace=False)
        ARTIFACTS.mkdir(exist_ok=True)
        with open(ARTIFACTS / "leaks.txt", "a", encoding="utf-8") as f:
            f.write(message + "\n")
        import warnings

        warnings.warn(message, LeakWarning, stacklevel=1)


class LeakWarning(UserWarning):
    """Something a test left behind (see helpers/leak_check.py)."""


@pytest.fixture(autouse=True, scope="session")
def _no_session_leaks():
    before = leak_check.take(jobs=True)
    yield
    _report(leak_check.settle(before, [], jobs=True), "the test session")


@pytest.fixture(autouse=True, scope="module")
def _no_module_leaks(request):
    before = leak_check.take(jobs=True)
    yield
    try:
        _report(leak_check.settle(before, [*_owned.values(), _grown], jobs=True),
                f"{request.node.nodeid} (its module-scoped fixtures and the tests that used them)")
    finally:
        for key in list(_charged):  # what tests grew in session objects is reported at the session's end
            if key not in _grown:
                del _charged[key]


def _shared_objects(item) -> dict[str, str]:
    """Broader-scoped fixtures of ours with a value that the test uses (what it may grow): name -> scope."""
    shared = {}
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        fd = defs[-1]
        if fd.scope != "function" and fd.baseid and fd.cached_result is not None and fd.cached_result[0] is not None:
            shared[name] = fd.scope
    return shared


@pytest.fixture(autouse=True)
def _no_leaks(request):
    jobs = request.node.get_closest_marker("slurm") is not None
    before = leak_check.take(jobs=jobs)
    yield
    owned = list(_owned.values())
    shared = _shared_objects(request.node)
    if not shared:
        _report(leak_check.settle(before, owned, jobs), request.node.name)
        return
    # What a shared object grew is checked when its scope ends; a SIGINT handler is never its.
    after = leak_check.take(jobs=jobs)
    left = leak_check.leftovers(before, after, owned)
    for kind, items in left.items():
        for key in items:
            _charged.setdefault(key, f"{request.node.name} (shares {', '.join(shared)})")
    if {"session", "package"} & set(shared.values()):
        _grown.add(before, after)
    _report({kind: items for kind, items in left.items() if "SIGINT" in kind}, request.node.name)


@pytest.fixture(autouse=True, scope="session")
def _isolated_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep run and session logs out of the repo, and make the repo's kernelspec visible."""
    os.environ["MONARCH_NB_RUNS"] = str(tmp_path_factory.mktemp("runs"))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("JUPYTER_PATH", "")) if p)
    # Worker processes unpickle actor classes defined in test modules by importing them.
    tests_dir = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p)
    ARTIFACTS.mkdir(exist_ok=True)


@pytest.fixture
def session():
    from monarch_nb import Session

    s = Session(default_timeout=30)
    yield s
    pids = [p.pid for h in s.meshes.values() if h.local for p in h.procs if p.pid]  # a pod's pids are its own
    s.shutdown()
    assert_gone(pids)




def _slurm_up() -> str | None:
    """None when the local SLURM cluster answers, else why not."""
    import shutil
    import subprocess

    if shutil.which("sinfo") is None:
        return "SLURM is not installed"
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    states = out.stdout.split()
    if out.returncode != 0 or not states:
        return f"the SLURM controller does not answer: {out.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real one-machine SLURM cluster (`./run.sh slurm up`; `./run.sh test` starts it).

    Under `./run.sh test` (MONARCH_NB_REQUIRE_SLURM=1) a missing cluster fails the tests; a bare
    `pytest` skips them with how to start it. Afterwards no job of ours may be left in squeue."""
    import subprocess

    why = _slurm_up()
    if why is not None:
        if os.environ.get("MONARCH_NB_REQUIRE_SLURM"):
            pytest.fail(f"{why}; ./run.sh test starts the cluster with scripts/slurm_cluster.sh up")
        pytest.skip(f"{why}: start the local cluster with `./run.sh slurm up`")
    yield
    subprocess.run(["scontrol", "update", "nodename=ALL", "state=resume"], capture_output=True)
    left = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout.split("\n")
    ours = [line for line in left if "monarch_nb-" in line]
    assert not ours, f"SLURM jobs left behind: {ours}"


@pytest.fixture(scope="session")
def k8s_cluster():
    """The real one-machine Kubernetes cluster (`./run.sh k8s up`; `./run.sh test` starts it).

    Under `./run.sh test` (MONARCH_NB_REQUIRE_K8S=1) a missing cluster fails the tests; a bare
    `pytest` skips them with how to start it. Afterwards no pod or pod set of ours may be left."""
    from monarch_nb.jobs import local_k8s

    if not local_k8s.is_up():
        why = "the local Kubernetes cluster is not up"
        if os.environ.get("MONARCH_NB_REQUIRE_K8S"):
            pytest.fail(f"{why}; ./run.sh test starts it with scripts/k8s_cluster.sh up")
        pytest.skip(f"{why}: start it with `./run.sh k8s up`")
    yield local_k8s
    left = local_k8s.project_pods()
    assert not left, f"Kubernetes pods or pod sets left behind: {left}"


@pytest.fixture
def kernel():
    """A real Monarch kernel (the kernelspec in kernels/monarch) and a blocking client."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="monarch")
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    yield km, client
    client.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)
    else:  # a test killed it: its sockets are still ours to close (an open one hangs zmq's exit)
        km.cleanup_resources()


