"""README's "Your first 10 minutes", run as written: its code blocks become the cells of a fresh
notebook executed headless on the Monarch kernel (real workers, a real run, a kill, a rejoin, an
identity check, a stop). A newcomer follows that section top to bottom; when code and README
drift apart, this fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Your first 10 minutes"


def section_cells(readme: str) -> list[str]:
    """The ```python blocks of the section, in order."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    body = readme[start:end if end != -1 else None]
    return [block.strip("\n") for block in re.findall(r"```python\n(.*?)```", body, flags=re.S)]


def test_the_section_is_there_and_every_block_is_a_cell():
    cells = section_cells((REPO / "README.md").read_text())
    assert len(cells) >= 5 and cells[0].startswith("%monarch up")
    assert any(c.startswith("%%monarch") for c in cells) and any("%monarch stop" in c for c in cells)


@pytest.mark.slow  # a real kernel, a mesh, then a 2-group run with a spare: about a minute
def test_the_first_10_minutes_run_as_written(tmp_path):
    cells = section_cells((REPO / "README.md").read_text())
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    path, out = tmp_path / "first_minutes.ipynb", tmp_path / "first_minutes.out.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "execute", str(path), "-o", str(out),
                           "--timeout", "600"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, f"a README cell failed:\n{proc.stderr[-3000:]}"
    executed = nbformat.read(out, as_version=4)
    text = ["".join(o.get("text", "") + json.dumps(o.get("data", {}).get("text/plain", "")) for o in c.outputs)
            for c in executed.cells]
    every = "\n".join(text)
    assert re.search(r"rank 0 at \{'gpus': 0\}, pid \d+", every) and re.search(r"rank 1 at \{'gpus': 1\}", every)
    assert "replica 1 rejoined at step" in every
    assert "warm spare(s) ready: spare0" in every
    assert "acquired by spare" in every  # the spare took the victim's place, not a cold respawn
    assert "bit-identical" in every
    assert "loss_start" in every  # the history's summary, rebuilt from the event log
