"""Fixtures for real-browser tests: a JupyterLab server on 127.0.0.1 and Debian's Chromium.

``lab`` starts JupyterLab (token auth, random free port, ``--allow-root``) on a temporary copy
of the notebooks, with ``JUPYTER_PATH`` at the repo root so the project kernelspec
``kernels/monarch`` is found and ``PYTHONPATH`` so kernels import this checkout. ``browser``
launches the system Chromium through Playwright (``executable_path``; never
``playwright install``). ``notebook`` opens a notebook in Lab, waits for exactly one idle kernel,
records every change of the dashboard's DOM and every kernel websocket frame from inside the
page, and runs all cells. Teardown always stops Chromium, Lab, its kernels and their children.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("MONARCH_NB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]

# Installed before Lab's code runs: count kernel websocket frames (time, bytes) in the page.
WS_COUNTER = """
(() => {
  const Orig = window.WebSocket;
  window.__mnbWs = [];
  window.WebSocket = class extends Orig {
    constructor(...args) {
      super(...args);
      if (String(args[0]).includes('/channels')) {
        this.addEventListener('message', (ev) => {
          const n = typeof ev.data === 'string' ? ev.data.length : (ev.data.byteLength ?? ev.data.size ?? 0);
          window.__mnbWs.push([performance.now(), n]);
        });
      }
    }
  };
})();
"""

# Installed after the notebook opens: a snapshot of the dashboard each time it changes, tagged
# with whether any cell is executing ("[*]" prompt) at that moment.
DOM_RECORDER = """
() => {
  const rec = window.__mnb = {records: [], last: ''};
  const running = () => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))
      .some(p => p.textContent.includes('*'));
  const snap = () => {
    const cells = Array.from(document.querySelectorAll('.mnb-cell'))
        .map(c => [Number(c.dataset.replica), Number(c.dataset.rank), c.dataset.state]);
    const cap = document.querySelector('.mnb-plot-caption');
    const img = document.querySelector('img.mnb-plot-widget');
    const q = document.querySelector('.mnb-quorum');
    const r = {running: running(), cells,
               points: cap ? Number(cap.dataset.points) : null,
               markers: cap ? Number(cap.dataset.markers) : null,
               img: img ? img.src : null,
               participants: q ? q.dataset.participants : null,
               recovered: document.querySelectorAll(".mnb-recovery[data-status='recovered']").length};
    const key = JSON.stringify(r);
    if (key !== rec.last) { rec.last = key; r.t = performance.now(); rec.records.push(r); }
  };
  new MutationObserver(snap).observe(document.body,
      {subtree: true, childList: true, attributes: true, characterData: true});
  snap();
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    proc: subprocess.Popen
    port: int
    token: str
    root: Path
    log: Path
    kernel_name: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def kernels(self) -> list[dict]:
        return self.api("/api/kernels")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kernel_processes(self) -> list:
        import psutil

        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in kids:
            try:
                if "ipykernel_launcher" in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out


def _prepare_root(root: Path, kernel_name: str) -> None:
    import nbformat

    sources = sorted(HERE.glob("*.ipynb"))
    dashboard_nb = REPO / "notebooks" / "03_dashboard.ipynb"
    if dashboard_nb.exists():
        sources.append(dashboard_nb)
    for src in sources:
        nb = nbformat.read(src, as_version=4)
        nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name, "language": "python"}
        nbformat.write(nb, root / src.name)


def _with_parameters(root: Path, name: str, params: dict) -> str:
    """A copy of ``name`` with a cell setting ``params`` after its ``parameters`` cell."""
    import nbformat

    nb = nbformat.read(root / name, as_version=4)
    source = "# Parameters injected by the browser test\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    at = next((i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), 0)
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    out = f"{Path(name).stem}-test.ipynb"
    nbformat.write(nb, root / out)
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[LabServer]:
    import psutil

    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    root.mkdir()
    kernel_name = "monarch" if (REPO / "kernels" / "monarch" / "kernel.json").exists() else "python3"
    _prepare_root(root, kernel_name)
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ)
    env.update({
        "JUPYTER_PATH": os.pathsep.join(filter(None, [str(REPO), env.get("JUPYTER_PATH")])),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
    })
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp / "lab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--ServerApp.open_browser=False", "--LabApp.expose_app_in_browser=True"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                start_new_session=True)
    server = LabServer(proc, port, token, root, log, kernel_name)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                server.api("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 90 s:\n{server.log_tail()}")
                time.sleep(0.25)  # polling the server, not standing in for a condition
        yield server
    finally:
        try:
            procs = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # Jupyter shuts its kernels down on SIGTERM
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for p in procs:  # kernels (own sessions) and their workers, if any survived
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: the project setup installs Debian's `chromium` "
                    f"(apt-get install -y chromium); set MONARCH_NB_CHROMIUM to use another binary")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@dataclass
class OpenNotebook:
    page: Any
    lab: LabServer
    name: str
    kernel_id: str
    run_all_t: float | None = None  # performance.now() when Run All was issued
    notes: dict = field(default_factory=dict)

    def records(self) -> list[dict]:
        return self.page.evaluate("() => window.__mnb.records")

    def ws_frames(self) -> list[list[float]]:
        return self.page.evaluate("() => window.__mnbWs")

    def page_now(self) -> float:
        return self.page.evaluate("() => performance.now()")

    def run_all(self, timeout_ms: int = 120_000) -> None:
        """Run all cells and wait until none is executing (prompts all numbered, kernel idle)."""
        self.run_all_t = self.page_now()
        self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        self.page.wait_for_function(
            """() => {
                const ps = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'));
                return ps.length > 0 && ps.every(p => /\\[\\d+\\]/.test(p.textContent));
            }""", timeout=timeout_ms)
        tracebacks = self.page.locator("[data-mime-type='application/vnd.jupyter.error']")
        if tracebacks.count():
            raise AssertionError("a cell raised:\n" + "\n".join(tracebacks.all_inner_texts())[-3000:])


@pytest.fixture
def notebook(lab: LabServer, browser: Any, request) -> Iterator[Any]:
    """``notebook(name)`` opens a notebook in Lab with one idle kernel and DOM/websocket recorders."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1500})
    context.add_init_script(WS_COUNTER)
    pages: list[OpenNotebook] = []

    def open_notebook(name: str, timeout_s: float = 90.0, params: dict | None = None) -> OpenNotebook:
        if params:
            name = _with_parameters(lab.root, name, params)
        page = context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        # A fresh workspace: Lab would otherwise reopen the previous test's notebook (a 2nd kernel).
        page.goto(f"{lab.base}/lab/workspaces/t{secrets.token_hex(4)}/tree/{name}?reset&token={lab.token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        # Exactly one kernel, idle, attached to this notebook (Lab may restart the first one).
        deadline = time.monotonic() + timeout_s
        sessions: list = []
        kernels: list = []
        while True:
            try:
                sessions = [s for s in lab.api("/api/sessions") if s["path"].endswith(name)]
                kernels = lab.kernels()
            except OSError:  # Jupyter Server answers 500 while a kernel is half-started
                sessions, kernels = [], []
            if (len(sessions) == 1 and len(kernels) == 1 and kernels[0]["execution_state"] == "idle"
                    and sessions[0]["kernel"]["id"] == kernels[0]["id"]):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no single idle kernel for {name}: sessions={sessions} "
                                     f"kernels={kernels}\n{lab.log_tail()}")
            time.sleep(0.25)  # polling the server's kernel list
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        page.evaluate(DOM_RECORDER)
        nb = OpenNotebook(page, lab, name, kernels[0]["id"])
        pages.append(nb)
        return nb

    try:
        yield open_notebook
    finally:
        failed = getattr(request.node, "rep_call", None)
        for nb in pages:
            if failed is not None and failed.failed:
                try:
                    nb.page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-failure.png"))
                except Exception:
                    pass
        context.close()
        # Leave the session-wide server with no kernels, and no process they started.
        import psutil

        procs = []
        for k in lab.kernel_processes():
            try:
                procs += [k, *k.children(recursive=True)]
            except psutil.Error:
                pass
        for k in lab.kernels():
            try:
                lab.api(f"/api/kernels/{k['id']}", method="DELETE")
            except OSError:
                pass
        _, alive = psutil.wait_procs(procs, timeout=20)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
