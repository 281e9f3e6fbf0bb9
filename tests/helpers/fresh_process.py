"""A test's body in a fresh interpreter.

Monarch picks its transport once per process, when its client starts: after the suite's local
tests started it on a Unix socket, pods cannot reach it (``seam_cluster`` refuses such a mesh by
name). A test of a kernel whose first mesh is on the cluster runs its body here, as that kernel
would: a Python process of its own (a plain subprocess: multiprocessing's spawn would leave its
resource tracker behind, and fork would inherit Monarch's client).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

TESTS = Path(__file__).resolve().parent.parent


def in_a_fresh_process(fn: Callable[..., Any], *args: Any, timeout: float) -> None:
    """``fn(*args)`` (a module-level function of a test module; ``args`` plain literals) in a new
    Python process; its failure, with the child's traceback, is raised here as an AssertionError.
    A body still running after ``timeout`` seconds is killed, and that is a failure too."""
    module = fn.__module__
    code = f"import {module}\n{module}.{fn.__name__}(*{args!r})\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, env=env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired as late:
        raise AssertionError(f"{fn.__name__} did not finish within {timeout:g} s in its own process:\n"
                             f"{(late.stderr or b'')[-4000:]!r}") from None
    if done.returncode != 0:
        raise AssertionError(f"in its own process, {fn.__name__} failed (exit {done.returncode}):\n"
                             f"{done.stderr[-6000:]}")
