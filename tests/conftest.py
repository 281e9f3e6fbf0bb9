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


