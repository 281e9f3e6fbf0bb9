"""Every shipped notebook runs headless on the Monarch kernel through ``monarch-nb execute``."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CLUSTER_NOTEBOOK = REPO / "notebooks" / "05_cluster.ipynb"  # needs the SLURM cluster: its own test below
K8S_NOTEBOOK = REPO / "notebooks" / "08_kubernetes.ipynb"  # needs the Kubernetes cluster: its own test below
LOCAL_NOTEBOOKS = [nb for nb in NOTEBOOKS if nb not in (CLUSTER_NOTEBOOK, K8S_NOTEBOOK)]
ARTIFACTS = REPO / "test-artifacts"
# Smaller settings for CI's 2-core machine; each notebook declares them in its parameters cell.
CI_PARAMS: dict[str, list[str]] = {
    "01_single_controller.ipynb": ["-p", "procs=3"],
    "02_fault_tolerant_training.ipynb": ["-p", "replicas=3", "-p", "warmup_steps=2"],
    "03_dashboard.ipynb": ["-p", "replicas=2", "-p", "headless=True"],
    # two groups: each arm still sees a fault and recovers its own way (the race waits for one),
    # the resume still continues the restart arm's run; 3 groups to step 20 took 97 s of the suite
    "04_checkpointless.ipynb": ["-p", "replicas=2", "-p", "target=10", "-p", "period_s=4.0"],
    # the seed's experiment at a quarter size: 4 groups, waves of 2 comms faults (the ladder repairs
    # them in place), never fewer than 2 training, the victims back, the reference; 8 groups took 90 s
    "06_seed_experiment.ipynb": ["-p", "replicas=4", "-p", "at_once=2", "-p", "every_s=3.0", "-p", "steps=12",
                                 "-p", "headless=True", "-p", "compare=False"],
    # two groups, a meeting every 10 steps, a kill every 3 s: each arm still sees a kill healed
    # from the live peer (at a meeting for the semi-synchronous arms) and agrees at the end
    "07_semi_sync.ipynb": ["-p", "replicas=2", "-p", "target=40", "-p", "sync_every=10", "-p", "period_s=3.0"],
}


def execute(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", "execute", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def run_headless(notebook: Path) -> nbformat.NotebookNode:
    out = ARTIFACTS / notebook.name.replace(".ipynb", ".out.ipynb")
    proc = execute(str(notebook), "-o", str(out), "--timeout", "600", *CI_PARAMS.get(notebook.name, []))
    assert proc.returncode == 0, f"{notebook.name} failed:\n{proc.stderr[-3000:]}"
    executed = nbformat.read(out, as_version=4)
    code_cells = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "some cells did not run"
    expected = [c for c in code_cells if "raises-exception" in c.metadata.get("tags", [])]
    assert not [o for c in code_cells if c not in expected for o in c.outputs if o.output_type == "error"]
    # a cell tagged raises-exception shows what it is there to show (01: an interrupted cell)
    assert all(any(o.output_type == "error" for o in c.outputs) for c in expected)
    return executed


@pytest.mark.slow  # each runs a whole notebook on real workers: 20 s to minutes
@pytest.mark.parametrize("notebook", LOCAL_NOTEBOOKS, ids=[nb.name for nb in LOCAL_NOTEBOOKS])
def test_shipped_notebook_runs_headless(notebook):
    executed = run_headless(notebook)
    if notebook.name == "01_single_controller.ipynb":  # the tour shows logs, stacks, an interrupt, a post-mortem
        out = {c.source: "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                                                 + o.get("evalue", "") for o in c.outputs)
               for c in executed.cells if c.cell_type == "code" and c.source}
        assert "(Pdb) p rank\n1\n" in out['%monarch debug --rank 1 "p rank" "l" "q"']
        logs = out["%monarch logs --mesh main --tail 8"]
        assert "[main rank 0, main rank 1, main rank 2] WARNING crunch: started" in logs, logs  # once, 3 ranks
        assert "crunch (<monarch cell In [" in out["%monarch stacks --mesh main"]  # named as in the notebook
        interrupted = next(text for src, text in out.items() if "time.sleep(120)" in text and "interrupted" in text)
        assert "the cell stopped on ranks [0-2]; the mesh is up for the next cell" in interrupted
        assert all(f"rank {r} slept" in "".join(out.values()) for r in range(3))
        # the parameters given with -p are injected in a cell right after the parameters cell
        tags = [c.metadata.get("tags", []) for c in executed.cells]
        index = next(i for i, t in enumerate(tags) if "parameters" in t)
        assert "injected-parameters" in tags[index + 1] and "procs = 3" in executed.cells[index + 1].source
        status = next(c for c in executed.cells if c.source.startswith("%monarch status"))
        assert "mesh main (gpus=3)" in status.outputs[0]["data"]["text/plain"]
    if notebook.name == "09_torchtitan_jobs.ipynb":  # the registry job ran, healed a kill, validated
        text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                       for c in executed.cells if c.cell_type == "code" for o in c.outputs)
        assert "from llama3 llama3_debugmodel: 2 replica groups" in text
        assert "replica 1 rejoined at step" in text and "replicas bit-identical at step" in text
        assert "held-out loss" in text and "activation_checkpoint='selective'" in text
    if notebook.name == "03_dashboard.ipynb":  # headless=True: a real run, a kill, its recovery, a stop
        widgets = executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        values = [m["state"].get("value", "") for m in widgets.values() if m["model_name"] == "HTMLModel"]
        health = [v for v in values if "class='mnb-health'" in v][-1]
        assert "data-state='stopped'" in health and health.count("mnb-cell ") == 2
        timeline = [v for v in values if "mnb-recoveries" in v][-1]
        assert "data-replica='1' data-status='recovered'" in timeline
        outputs = executed.cells[-1].outputs  # the static copy a viewer without a kernel sees
        assert any("image/png" in o.get("data", {}) for o in outputs)
        html = "".join("".join(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {}))
        assert "data-status='recovered'" in html and "mnb-health-table" in html
    if notebook.name == "02_fault_tolerant_training.ipynb":  # `%monarch dashboard`, then `%monarch stop` cells later
        (shown,) = [o for c in executed.cells if c.cell_type == "code" and c.source == "%monarch dashboard"
                    for o in c.outputs]
        static = "".join(shown["data"]["text/html"])  # what a viewer without a kernel sees
        assert "data-state='stopped'" in static and "data-state='training'" not in static, \
            "the saved static copy must be the run's final state, not the state when the cell ran"


def run_cluster_notebook(notebook: Path) -> Path:
    """Execute a cluster notebook; check its mesh printed both nodes; return the run it made."""
    import os

    before = set(Path(os.environ["MONARCH_NB_RUNS"]).iterdir())
    executed = run_headless(notebook)
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "node=n1" in text and "node=n2" in text, "the mesh must span both nodes"
    (run_dir,) = [d for d in set(Path(os.environ["MONARCH_NB_RUNS"]).iterdir()) - before
                  if (d / "events.jsonl").exists()]
    return run_dir


@pytest.mark.slurm
def test_cluster_notebook_runs_on_slurm_and_records_the_preemption_and_its_recovery(slurm_cluster):
    run_dir = run_cluster_notebook(CLUSTER_NOTEBOOK)
    kinds = [json.loads(line)["kind"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    faults = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "fault_injected"]
    assert [f["fault"] for f in faults] == ["preempt"]
    for kind in ("failure_detected", "acquired", "healed", "rejoined", "replicas_identical", "run_stopped"):
        assert kind in kinds[kinds.index("fault_injected"):], f"{kind} missing after the preemption"
    # what test_slurm.py asks of its node_down, asked here of the notebook's preemption
    from monarch_nb import open_run

    history = open_run(run_dir)
    (rec,) = history.recoveries()
    assert rec.fault == "preempt" and rec.status == "recovered" and rec.rung == "hosts", rec
    # noticed by the session's job watcher (polls every 1 s): typically ~1-2 s; 10 s is >= 5x
    assert rec.detection_s is not None and rec.detection_s < 10, rec
    assert rec.acquired_how == "allocation" and rec.heal_bytes > 1_000_000 and rec.identical, rec
    assert rec.heal_sources and rec.replica not in rec.heal_sources, rec
    commits = [e for e in history.events.events("step") if rec.detected_t <= e.t <= rec.respawned_t
               and e.committed and e.replica != rec.replica]
    assert commits and all(e.participants == 2 for e in commits), "the survivors kept committing, the two of them"


@pytest.mark.k8s
def test_kubernetes_notebook_runs_on_the_cluster_and_recovers_each_kubernetes_fault(k8s_cluster):
    from monarch_nb import open_run

    recs = open_run(run_cluster_notebook(K8S_NOTEBOOK)).recoveries()
    # a node gone NotReady also fails any other group on that node (a recovery with no fault of its own)
    aimed = [r for r in recs if r.fault is not None]
    assert [r.fault for r in aimed] == ["pod_delete", "evict", "node_notready"], recs
    # a node that held every group leaves no live peer: those come back from the durable checkpoint
    assert all(r.status == "recovered" and r.rung in ("hosts", "checkpoint") for r in recs), recs
    assert "NODE_NOT_READY" in (aimed[-1].reason or ""), aimed[-1].reason
    # the deleted pod: seen by the pod watch, replaced by the warm spare pod set, healed from the
    # live peer only (never from the deleted pod's process, which lives on a moment)
    deleted = aimed[0]
    assert deleted.acquired_how == "spare" and deleted.heal_bytes and deleted.heal_sources == [0], deleted
    assert "POD_DELETED" in (deleted.reason or "") and deleted.detection_s is not None and deleted.detection_s < 10
    assert not k8s_cluster.project_pods(), "stop deletes every pod set"


@pytest.mark.slow  # executes a notebook on a real kernel (5-20 s)
def test_a_failing_notebook_exits_nonzero_naming_the_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# broken"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("%monarch up --procs nope"),
        nbformat.v4.new_code_cell("print('never runs')"),
    ])
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    proc = execute(str(path), "-o", str(tmp_path / "out.ipynb"), timeout=300)
    assert proc.returncode == 1
    # the third cell as a person counts them (markdown included), and its prompt In [2]
    assert "cell 3 (In [2]) failed: UsageError" in proc.stderr and "expected a positive integer" in proc.stderr
    saved = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert "expected a positive integer" in json.dumps(saved.cells[2].outputs)  # the error is kept for CI
    assert saved.cells[3].get("execution_count") is None


def test_a_failing_cell_is_counted_in_the_notebook_as_passed_not_after_injected_parameters():
    from nbclient.exceptions import CellExecutionError

    from monarch_nb.execute import _failure_from, inject_parameters

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("steps = 3", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("1 / 0"),
    ])
    inject_parameters(nb, {"steps": 5})  # now the 3rd cell of the executed notebook
    for count, cell in enumerate([c for c in nb.cells if c.cell_type == "code"], 1):
        cell.execution_count = count
    failure = _failure_from(nb, CellExecutionError("tb", "ZeroDivisionError", "division by zero"))
    assert (failure.index, failure.position, failure.execution_count) == (3, 3, 3)
    assert str(failure).startswith("cell 3 (In [3]) failed: ZeroDivisionError: division by zero\n  > 1 / 0")


@pytest.mark.slow  # executes a notebook on a real kernel (5-20 s)
def test_bad_parameters_and_missing_notebooks_are_clear_errors(tmp_path):
    proc = execute(str(REPO / "notebooks" / "01_single_controller.ipynb"), "-p", "noequals")
    assert proc.returncode == 2 and "must look like name=value" in proc.stderr
    proc = execute(str(tmp_path / "missing.ipynb"))
    assert proc.returncode == 2 and "no notebook at" in proc.stderr


@pytest.mark.slow  # executes a notebook on a real kernel (5-20 s)
def test_widget_state_is_stored_in_the_executed_notebook(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import ipywidgets as w\nw.IntProgress(value=3, max=5)")])
    path = tmp_path / "w.ipynb"
    nbformat.write(nb, path)
    proc = execute(str(path), "-o", str(tmp_path / "w.out.ipynb"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "w.out.ipynb").read_text())["metadata"]
    state = meta["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "IntProgressModel" and m["state"]["value"] == 3 for m in state.values())


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.name for nb in NOTEBOOKS])
def test_a_shipped_notebook_is_valid_nbformat_with_cell_ids(notebook):
    """nbformat 4.5 requires every cell to have an id: without one each run warned
    (MissingIDFieldWarning, a hard error in a future nbformat) and JupyterLab rewrote the file."""
    raw = json.loads(notebook.read_text())
    assert [i for i, c in enumerate(raw["cells"]) if "id" not in c] == [], "cells without an id"
    nbformat.validate(nbformat.reads(notebook.read_text(), as_version=4))
