"""A notebook with a dashboard executed headless (nbclient): saved widget state and static fallback.

The notebook follows a synthetic run (scripted telemetry, no training) through an injected
kill. After execution, without any kernel, the notebook file must hold the final dashboard in
its widget state, and its outputs an image of the loss curves and HTML tables.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]

CELLS = [
    "from monarch_nb.notebook.dashboard import Dashboard\n"
    "from monarch_nb.notebook.synthetic_run import SyntheticRun\n"
    "run = SyntheticRun(replicas=3, step_hz=40, phase_s=0.3)\n"
    "dash = Dashboard(run.events, controls=run)\n"
    "dash",
    "run.start()\n"
    "assert run.wait_for_step(10)\n"
    "run.inject('kill', replica=1)\n"
    "assert run.wait_for_step(60, timeout=60)\n"
    "run.stop()",
    "dash.close()  # final frame, sent while this cell runs so nbclient records it\n"
    "dash.show_static()",
]


# No show_static(): a dashboard shown as a cell's value, and one shown with display() (what
# `%monarch dashboard` does), must each leave a static copy of the run's final state.
CELLS_WITHOUT_SHOW_STATIC = [
    "from IPython.display import display\n"
    "from monarch_nb.notebook.dashboard import Dashboard\n"
    "from monarch_nb.notebook.synthetic_run import SyntheticRun\n"
    "run = SyntheticRun(replicas=3, step_hz=40, phase_s=0.3)\n"
    "dash = Dashboard(run.events, controls=run)\n"
    "dash",
    "shown = Dashboard(run.events, controls=run)\n"
    "display(shown)",
    "run.start()\n"
    "assert run.wait_for_step(10)\n"
    "run.inject('kill', replica=1)\n"
    "assert run.wait_for_step(60, timeout=60)\n"
    "run.stop()\n"
    "flusher = shown.frames.flusher  # it draws the stop, refreshes the static copy, then ends\n"
    "if flusher is not None:\n"
    "    flusher.join(30)",
    "dash.close()",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("headless")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(REPO))
        return _execute(tmp_path)


@pytest.fixture(scope="module")
def executed_without_show_static(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("headless-no-show-static")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(REPO))
        return _execute(tmp_path, CELLS_WITHOUT_SHOW_STATIC)


def _execute(tmp_path: Path, cells: list[str] = CELLS) -> dict:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    return json.loads(path.read_text())  # what a CI artifact reader sees


def _html_values(nb: dict) -> list[str]:
    state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [m["state"].get("value", "") for m in state.values() if m["model_name"] == "HTMLModel"]


def test_saved_widget_state_shows_the_final_dashboard(executed):
    values = _html_values(executed)
    health = [v for v in values if "class='mnb-health'" in v]
    assert health, "no health grid in the saved widget state"
    assert "data-state='stopped'" in health[0] and "data-state='failed'" not in health[0]
    timeline = [v for v in values if "mnb-recoveries" in v]
    assert "data-replica='1' data-status='recovered'" in timeline[0]
    caption = [v for v in values if "mnb-plot-caption" in v][0]
    assert "data-markers='2'" in caption  # the fault and the heal
    state = executed["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    (image,) = [m for m in state.values() if m["model_name"] == "ImageModel"]
    (buffer,) = image["buffers"]
    assert buffer["path"] == ["value"] and base64.b64decode(buffer["data"]).startswith(b"\x89PNG")


def test_outputs_hold_a_static_fallback_readable_without_a_kernel(executed):
    outputs = executed["cells"][-1]["outputs"]
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert pngs and base64.b64decode(pngs[0]).startswith(b"\x89PNG")
    html = "".join("".join(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {}))
    assert "<table class='mnb-health-table'" in html and "data-state='stopped'" in html
    assert "data-status='recovered'" in html and "kill" in html


def _text(data: dict, mime: str) -> str:
    value = data.get(mime, "")
    return "".join(value) if isinstance(value, list) else value


@pytest.mark.parametrize("cell", [0, 1], ids=["cell-value", "display"])
def test_a_displayed_dashboard_leaves_a_static_copy_of_the_final_state_in_its_output(
        executed_without_show_static, cell):
    nb = executed_without_show_static
    assert not any("show_static" in "".join(c["source"]) for c in nb["cells"])
    (output,) = nb["cells"][cell]["outputs"]  # one output: widget view and static copy together
    data = output["data"]
    assert "application/vnd.jupyter.widget-view+json" in data  # Jupyter with widgets shows the live view
    html = _text(data, "text/html")  # a viewer without widgets shows this
    assert "<table class='mnb-health-table'" in html and "<script" not in html
    assert "data-state='stopped'" in html and "data-state='training'" not in html  # the end, not the start
    assert "data-replica='1' data-status='recovered'" in html and "kill" in html
    (png,) = re.findall(r"src='data:image/png;base64,([^']+)'", html)
    assert base64.b64decode(png).startswith(b"\x89PNG")
    plain = _text(data, "text/plain")
    assert plain.startswith("monarch_nb dashboard of run synthetic (stopped)") and "VBox" not in plain
