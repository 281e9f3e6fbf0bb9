"""Headless execution of notebooks on the Monarch kernel, for CI and scripted runs.

nbclient runs every cell; widget state is stored in the notebook's metadata so a saved
output notebook shows the final dashboards. Parameters are injected as a cell right
after the cell tagged ``parameters`` (as papermill does), or at the top when no cell
has that tag. A failure names the failing cell as a person finds it: its position in the
notebook they passed (1-based, markdown cells counted) and its ``In [n]`` prompt.
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
    """The cell that failed and its error.

    ``index`` is 0-based among the executed notebook's cells (injected parameters included);
    ``position`` is what a person counts in the notebook they passed: 1-based, markdown cells
    included, the injected parameters cell not (``None`` when the failing cell is that one);
    ``execution_count`` is its ``In [n]`` prompt in the executed notebook, if it ran.
    """

    index: int
    ename: str
    evalue: str
    source: str
    position: int | None = None
    execution_count: int | None = None

    @property
    def label(self) -> str:
        """``cell 3 (In [2])``: the cell's position, then its prompt when it has one."""
        where = "the injected parameters cell" if self.position is None else f"cell {self.position}"
        return where + (f" (In [{self.execution_count}])" if self.execution_count else "")

    def __str__(self) -> str:
        first = self.source.strip().splitlines()[0] if self.source.strip() else ""
        return f"{self.label} failed: {self.ename}: {self.evalue}\n  > {first}"


class NotANotebook(ValueError):
    """The file given to ``execute_notebook`` is no Jupyter notebook (a script, other JSON, binary)."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        fix = "pass an .ipynb notebook" + (f", or run the script with `python {path}`" if path.suffix == ".py" else "")
        super().__init__(f"{path} is not a Jupyter notebook ({why}); {fix}")


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
    nb = read_notebook(path)
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


def read_notebook(path: Path) -> Any:
    """The notebook at ``path`` (as nbformat 4); ``NotANotebook`` for anything else, so a
    script or a data file is refused in one line instead of nbformat's traceback."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        raise NotANotebook(path, "not JSON") from None
    if not isinstance(data, dict) or "nbformat" not in data:
        raise NotANotebook(path, "JSON without 'nbformat' and 'cells'")
    try:
        return nbformat.reads(json.dumps(data), as_version=4)
    except Exception as exc:  # nbformat raises schema, key and type errors for damaged notebooks
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotANotebook(path, f"nbformat cannot read it: {first}") from None


def _failure_from(nb: Any, exc: Exception) -> CellFailure:
    """The failing cell is the last one that ran; its error comes from the exception."""
    ran = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("execution_count")]
    index = ran[-1] if ran else next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), -1)
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = getattr(exc, "evalue", None)
    if evalue is None:
        evalue = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    evalue = evalue.strip().splitlines()[0] if evalue.strip() else ""
    if index < 0:
        return CellFailure(index, ename, evalue, "")
    cell = nb.cells[index]
    injected = [i for i, c in enumerate(nb.cells) if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    position: int | None = index + 1 - sum(1 for i in injected if i < index)
    if index in injected:
        position = None
    return CellFailure(index, ename, evalue, cell.source, position, cell.get("execution_count"))


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
