"""Headless execution of notebooks on the Monarch kernel, for CI and scripted runs.

nbclient runs every cell; widget state is stored in the notebook's metadata so a saved
output notebook shows the final dashboards. Parameters are injected as a cell right
after the cell tagged ``parameters`` (as papermill does), or at the top when no cell
has that tag. A failure reports the failing cell's index and its error.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

KERNEL_NAME = "monarch"
KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels" / KERNEL_NAME


@dataclass(frozen=True)
class CellFailure:
    index: int
    ename: str
    evalue: str
    source: str

    def __str__(self) -> str:
        first = self.source.strip().splitlines()[0] if self.source.strip() else ""
        return f"cell {self.index} failed: {self.ename}: {self.evalue}\n  > {first}"


class NotebookFailed(Exception):
    def __init__(self, failure: CellFailure) -> None:
        self.failure = failure
        super().__init__(str(failure))


def parse_parameter(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"parameter {text!r} must look like name=value")
    name, raw = text.split("=", 1)
    name = name.strip()
    if not name.isidentifier():
        raise ValueError(f"parameter name {name!r} is not a Python identifier")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # anything that is not a Python literal is passed as a string
    return name, value


def inject_parameters(nb: Any, params: dict[str, Any]) -> None:
    if not params:
        return
    source = "# Parameters injected by monarch-nb execute\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    for index, existing in enumerate(nb.cells):
        if "parameters" in existing.get("metadata", {}).get("tags", []):
            nb.cells.insert(index + 1, cell)
            return
    nb.cells.insert(0, cell)


def ensure_kernelspec() -> None:
    """Make the Monarch kernelspec visible: an installed one wins, else the repo's ``kernels/``."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        return
    except NoSuchKernel:
        pass
    if KERNEL_DIR.is_dir():
        path = os.environ.get("JUPYTER_PATH", "")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(KERNEL_DIR.parent.parent), path) if p)
        return
    raise RuntimeError("the 'monarch' kernel is not installed; run `monarch-nb install-kernel`")


def execute_notebook(path: str | Path, *, params: dict[str, Any] | None = None, output: str | Path | None = None,
                     timeout: float = 600, kernel_name: str = KERNEL_NAME, cwd: str | Path | None = None) -> Any:
    """Run every cell; write ``output`` (also on failure); raise ``NotebookFailed`` naming the cell."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path}")
    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, params or {})
    if kernel_name == KERNEL_NAME:
        ensure_kernelspec()
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, store_widget_state=True,
                            resources={"metadata": {"path": str(Path(cwd or path.parent).resolve())}})
    failure = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        failure = _failure_from(nb, exc)
    finally:
        if output is not None:
            nbformat.write(nb, str(output))
    if failure is not None:
        raise NotebookFailed(failure)
    return nb


def _failure_from(nb: Any, exc: Exception) -> CellFailure:
    """The failing cell is the last one that ran; its error comes from the exception."""
    ran = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("execution_count")]
    index = ran[-1] if ran else next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), -1)
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = getattr(exc, "evalue", None)
    if evalue is None:
        evalue = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    evalue = evalue.strip().splitlines()[0] if evalue.strip() else ""
    return CellFailure(index, ename, evalue, nb.cells[index].source if index >= 0 else "")


def install_kernel(user: bool = False, prefix: str | None = None) -> str:
    """Install the Monarch kernelspec (into this environment by default)."""
    import sys
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager

    spec = json.loads((KERNEL_DIR / "kernel.json").read_text()) if KERNEL_DIR.is_dir() else None
    if spec is None:
        raise RuntimeError(f"kernelspec template missing at {KERNEL_DIR}")
    spec["argv"][0] = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=2))
        return KernelSpecManager().install_kernel_spec(tmp, KERNEL_NAME, user=user,
                                                       prefix=prefix if not user else None)
