"""Shared fixtures: real Monarch sessions, real kernels, and orphan checks by pid.

No tests/__init__.py on purpose: torchmonarch installs a top-level package named
``tests``; pytest runs with ``--import-mode=importlib`` so ours never collides.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import monarch_nb  # noqa: F401  (must come before any test module imports monarch)
from proc_checks import assert_gone

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


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
    pids = [p.pid for h in s.meshes.values() for p in h.procs if p.pid]
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


