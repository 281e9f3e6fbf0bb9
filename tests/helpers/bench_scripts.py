"""The benchmark scripts under bench/ as modules, for tests of their pure parts (bench/ is no
package: each script is loaded from its file)."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str):
    """``bench/<name>.py``, imported afresh."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
