"""%monarch and %%monarch in-process through IPython's InteractiveShell, on real workers."""

import threading
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from monarch_nb import RemoteError, Session
from monarch_nb.notebook.magics import MonarchMagics

from helpers.proc_checks import assert_gone, wait_for

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llama3_debug_ft.toml"


@pytest.fixture(scope="module")
def shell_and_session():
    shell = InteractiveShell.instance()
    session = Session(default_timeout=30)
    shell.register_magics(MonarchMagics(shell, session))
    yield shell, session
    pids = [p.pid for h in session.meshes.values() for p in h.procs if p.pid]
    session.shutdown()
    assert_gone(pids)


@pytest.fixture
def shell(shell_and_session):
    return shell_and_session[0]


@pytest.fixture
def msession(shell_and_session):
    return shell_and_session[1]


def run_cell_magic(shell, line, cell):
    with capture_output() as cap:
        shell.run_cell_magic("monarch", line, cell)
    return cap


def test_up_status_and_cell_output_grouped_per_rank_in_rank_order(shell, msession):
    with capture_output() as cap:
        shell.run_line_magic("monarch", "up --procs 3")
    assert msession.mesh("main").shape == {"gpus": 3}
    with capture_output() as cap:
        shell.run_line_magic("monarch", "status")
    text = cap.outputs[0].data["text/plain"]
    assert "mesh main (gpus=3) healthy" in text and text.count("alive") == 3
    assert 'class="mnb-procs"' in cap.outputs[0].data["text/html"]
    # local meshes have no Monarch dashboard or admin TUI to enable: no paragraph about them
    assert not any("admin TUI" in o.data.get("text/plain", "") for o in cap.outputs), \
        [o.data.get("text/plain") for o in cap.outputs]

    cap = run_cell_magic(shell, "", "import os\nprint('pid', os.getpid())\nrank * 10")
    text = cap.outputs[0].data["text/plain"]
    positions = [text.index(f"[rank {r}]") for r in range(3)]
    assert positions == sorted(positions)
    for r in range(3):
        assert f"Out: {r * 10}" in text
    assert "pid " in text


def test_cell_state_persists_per_process_and_slices_by_named_dim(shell, msession):
    # a cell knows its rank and its point in the whole mesh (README), also when run on a slice
    cap = run_cell_magic(shell, "--on gpus=2", "(rank, point)")
    assert "Out: (2, {'gpus': 2})" in cap.outputs[0].data["text/plain"], cap.outputs[0].data["text/plain"]
    run_cell_magic(shell, "", "x = rank + 100")
    cap = run_cell_magic(shell, "--on gpus=1:3 --timeout 10", "x")
    text = cap.outputs[0].data["text/plain"]
    assert "[rank 0]" not in text and "Out: 101" in text and "Out: 102" in text


def test_an_exception_on_some_ranks_is_shown_per_rank_with_the_others_results(shell, msession):
    code = "if rank == 1:\n    raise KeyError('only rank 1')\n'fine'"
    with pytest.raises(RemoteError, match=r"ranks \[1\]"):
        run_cell_magic(shell, "", code)
    cap = run_cell_magic(shell, "--ignore-errors", code)
    text = cap.outputs[0].data["text/plain"]
    assert "KeyError: 'only rank 1'" in text
    assert text.count("Out: 'fine'") == 2
    assert 'class="mnb-error"' in cap.outputs[0].data["text/html"]


@pytest.mark.parametrize("line, expected", [
    ("", "needs a command"),
    ("launch", "invalid choice: 'launch'"),
    ("up --procs 0", "expected a positive integer"),
    ("up --procs four", "expected a positive integer, got 'four'"),
    ("up --hosts", "expected one argument"),
    ("up --env NOEQUALS", "expected NAME=VALUE"),
    ("down nosuchmesh", "no mesh named 'nosuchmesh'"),
    ("replace", "the following arguments are required: name"),
    ("kill --rank x", "invalid int value"),
    ("up --procs '2", "cannot parse arguments"),
    ("train --replicas 0", "expected a positive integer"),
    ("inject meteor --replica 0", "invalid choice: 'meteor'"),
    ("inject kill", "the following arguments are required: --replica"),
    ("inject kill --replica 0 --at-step 3 --after 2", "not allowed with argument"),
    ("schedule", "the following arguments are required: --every"),
    ("train --spares -1", "expected an integer >= 0, got -1"),
    ("scale 0", "expected a positive integer"),
    ("schedule --every 5 --at-once 0", "expected a positive integer"),
    ("up --partition debug", "--partition and --time need --slurm"),
    ("up --image my/worker:1", "--image need --k8s"),
    ("up --namespace ns --context other", "--namespace, --context need --k8s"),
    ("up --k8s --slurm", "--k8s and --slurm: give one"),
    ("up --k8s --image 'bad image'", "image: 'bad image' is not a container image reference"),
    ("up --procs 10000", "procs: 10000 x 1 host(s) = 10000 processes on this machine"),
    ("wait", "the following arguments are required: {rejoin,step,spare}"),
    ("wait forever", "invalid choice: 'forever'"),
    ("wait step", "the following arguments are required: N"),
    ("wait step 0", "expected a positive integer, got 0"),
    ("wait step 5 --replica -1", "expected an integer >= 0, got -1"),
    ("wait rejoin --timeout 0", "expected a positive number of seconds"),
    ("wait rejoin 5", "unrecognized arguments: 5"),
    ("check --timeout soon", "expected a positive number of seconds, got 'soon'"),
])
def test_bad_line_arguments_raise_usage_error_with_usage(shell, line, expected):
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("monarch", line)
    assert expected in str(err.value)
    assert "usage:" in str(err.value)
    # the usage shown is that of the subcommand given (not the list of every subcommand)
    first = (line.split() or [""])[0]
    if first not in ("", "launch"):  # not a subcommand: the list of them is the usage
        words = line.split()[:2]
        sub = " ".join(words if first == "wait" and words[1:] in (["rejoin"], ["step"]) else words[:1])
        assert f"usage: %monarch {sub} " in str(err.value), str(err.value)[:300]


@pytest.mark.parametrize("line, expected", [
    ("inject kill --replica 0", "no fault-tolerant run is active; start one with `%monarch train`"),
    ("stop", "no fault-tolerant run is active"),
    ("scale 4", "no fault-tolerant run is active"),
    ("train --model gpt5", "model"),
    ("train --replicas 60 --spares 10", "replicas: 60 groups + 10 spares is more than 64"),
    ("train --job process --spares 1", "spares: not available with job='process'"),
    ("train --slurm --job process", "--slurm and --job process disagree"),
    ("train --backend nccl --platform cpu", "backend: 'nccl' needs GPUs and this platform is cpu"),
    ("wait rejoin", "no fault-tolerant run is active"),
    ("wait step 10", "no fault-tolerant run is active"),
    ("check", "no fault-tolerant run is active"),
    ("train --config nosuch.toml", "config: nosuch.toml not found; looked in "),
    ("train --name ../escape", "run_name: '../escape' is not allowed: a run name is one directory name"),
    ("train --name ''", "run_name: '' is not allowed"),
    ("train --resume runs/x --resume-from runs/y/checkpoints", "--resume continues a run from its own checkpoints"),
    ("train --resume-from /nonexistent/ckpt", "resume_from: /nonexistent/ckpt does not exist"),
    (f"train --config {EXAMPLE} --seq-len 4", "seq_len: must be an integer >= 8, got 4"),
])
def test_training_commands_refuse_bad_input_before_starting_anything(shell, msession, line, expected):
    before = set(msession.meshes)
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("monarch", line)
    assert expected in str(err.value)
    assert set(msession.meshes) == before


def test_unknown_mesh_lists_the_known_ones(shell, msession):
    with pytest.raises(UsageError, match="no mesh named 'ghost'; known meshes: main"):
        run_cell_magic(shell, "--mesh ghost", "1")


@pytest.mark.parametrize("selector, expected", [
    ("gpus=7", "gpus=7 is outside mesh 'main' (shape gpus=3; gpus is 0..2)"),
    ("hosts=1", "mesh 'main' has no dim 'hosts'; its shape is gpus=3"),
    ("gpus=5:9", "selects nothing in mesh 'main' (shape gpus=3)"),
    ("gpus=x", "expected DIM=INDEX or DIM=START:STOP"),
])
def test_a_slice_outside_the_mesh_names_its_shape(shell, selector, expected):
    with pytest.raises(UsageError) as err:
        run_cell_magic(shell, f"--on {selector}", "1")
    assert expected in str(err.value)


def test_bad_cell_timeout_is_a_usage_error(shell):
    with pytest.raises(UsageError, match="positive number of seconds"):
        run_cell_magic(shell, "--timeout -1", "1")


def test_kill_replace_and_down(shell, msession):
    mesh = msession.mesh("main")
    with capture_output():
        shell.run_line_magic("monarch", "kill --rank 2")
    wait_for(lambda: mesh.failed_ranks == [2], 10, "rank 2 to be marked failed")
    with pytest.raises(UsageError, match=r"rank 9 is outside mesh 'main' \(ranks 0..2\)"):
        shell.run_line_magic("monarch", "kill --rank 9")
    with capture_output():
        shell.run_line_magic("monarch", "replace main")
    assert msession.mesh("main").state == "healthy"
    cap = run_cell_magic(shell, "", "rank")
    assert cap.outputs[0].data["text/plain"].count("Out:") == 3
    pids = [p.pid for p in msession.mesh("main").procs]
    with capture_output() as out:
        shell.run_line_magic("monarch", "down")
    assert "stopped: main" in out.stdout
    assert_gone(pids)
    assert msession.meshes == {}


def test_help_prints_usage_without_raising(shell):
    with capture_output() as cap:
        shell.run_line_magic("monarch", "up --help")
    assert "--procs" in cap.stdout


def test_load_ext_registers_the_magic_in_a_plain_shell():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "monarch_nb")
    assert "monarch" in shell.magics_manager.magics["line"]
    assert "monarch" in shell.magics_manager.magics["cell"]


# ---- wait / check / train --config on a run fed by hand (no worker starts) ------------------


@pytest.fixture
def fed_run(shell, tmp_path):
    """A real, never-started FTRun as the notebook's current run; the test feeds its events."""
    from monarch_nb.ft import FTRun, RunConfig

    magics = shell.magics_manager.registry["MonarchMagics"]
    run = FTRun(RunConfig(replicas=3, steps=100, runs_root=str(tmp_path)))
    magics.training.run = run
    yield run
    magics.training.run = None
    run.events.close()


def _feed_later(run, delay, *events):
    threading.Timer(delay, lambda: [run.events.append(e) for e in events]).start()


def test_wait_rejoin_prints_which_group_came_back_at_which_step_and_how_long_after_the_fault(shell, fed_run):
    from monarch_nb.telemetry.events import FailureDetected, FaultInjected, Rejoined

    fed_run.events.append(FaultInjected(fault="kill", replica=1, rank=0, step=5))
    _feed_later(fed_run, 0.2, FailureDetected(replica=1, rank=0, reason="Killed(sig=9)"),
                Rejoined(t=time.time() + 0.2, replica=1, step=9, seconds_since_failure=6.4))
    with capture_output() as out:
        shell.run_line_magic("monarch", "wait rejoin --replica 1 --timeout 10")
    assert out.stdout.strip() == "replica 1 rejoined at step 9, 6.4 s after the fault"


def test_wait_timeouts_are_one_line_naming_what_was_waited_for(shell, fed_run):
    from monarch_nb.telemetry.events import FailureDetected

    fed_run.events.append(FailureDetected(replica=2, rank=0, reason="x"))
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("monarch", "wait rejoin --timeout 0.2")
    assert str(err.value).startswith("wait rejoin: replica 2 (recovering) did not rejoin within 0.2 s")
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("monarch", "wait step 5 --replica 0 --timeout 0.2")
    assert str(err.value).startswith("wait step 5: replica 0 had not committed step 5 within 0.2 s")
    assert "pass a longer --timeout" in str(err.value) and "\n" not in str(err.value)


def test_wait_step_prints_when_every_group_committed_it(shell, fed_run):
    from monarch_nb.telemetry.events import Step

    _feed_later(fed_run, 0.1, *[Step(replica=r, step=12, loss=1.0, tokens_per_s=1.0, committed=True) for r in range(3)])
    with capture_output() as out:
        shell.run_line_magic("monarch", "wait step 12 --timeout 10")
    assert out.stdout.startswith("step 12 committed by every replica group (0, 1, 2)")
    with pytest.raises(UsageError, match=r"step 101 is past the run's last step \(steps=100\)(.|\n)*usage:"):
        shell.run_line_magic("monarch", "wait step 101")
    with pytest.raises(UsageError, match=r"--replica: 5 is not an active replica group; active groups: 0, 1, 2"):
        shell.run_line_magic("monarch", "wait step 3 --replica 5")


def test_check_prints_the_verdict_or_names_the_ranks_that_differ(shell, fed_run):
    from monarch_nb.telemetry.events import ReplicasIdentical

    # the run itself: never started, so no group trains and there is nothing to compare
    with pytest.raises(UsageError, match=r"^check: fewer than two replica groups are training"):
        shell.run_line_magic("monarch", "check")
    # the magic's words for a verdict (the comparison itself is tested in test_ft_units.py)
    same = {f"replica{r}/rank0": "params:a optim:b" for r in range(3)}
    fed_run.check_identical = lambda timeout: ReplicasIdentical(step=40, identical=True, hashes=same)
    with capture_output() as out:
        shell.run_line_magic("monarch", "check")
    assert out.stdout.strip() == "replicas bit-identical at step 40 (3 ranks)"
    differ = dict(same, **{"replica2/rank0": "params:z optim:b"})
    fed_run.check_identical = lambda timeout: ReplicasIdentical(step=41, identical=False, hashes=differ)
    with pytest.raises(UsageError, match=r"^check: replicas are NOT bit-identical at step 41: "
                                         r"replica2/rank0 \(parameters\) differs"):
        shell.run_line_magic("monarch", "check")


def test_train_config_reads_the_job_file_and_flags_override_it(shell, monkeypatch):
    import monarch_nb.ft

    made = []

    class RecordingRun:  # stands in for FTRun: records the config, starts nothing
        def __init__(self, config, session=None):
            from monarch_nb.telemetry import EventStore

            self.config, self.run_id, self.run_dir, self.stopped = config, "recorded", Path("/nowhere"), False
            self.resume_from, self.resume_source, self.events = None, None, EventStore()
            made.append(self)

        def start(self):
            return self

        def wait_for_step(self, *args, **kwargs):
            pass

    monkeypatch.setattr(monarch_nb.ft, "FTRun", RecordingRun)
    magics = shell.magics_manager.registry["MonarchMagics"]
    try:
        with capture_output() as out:
            shell.run_line_magic("monarch", f"train --config {EXAMPLE} --steps 50 --model small --max-respawns 2")
    finally:
        magics.training.run = None
        shell.user_ns.pop("run", None)
    cfg = made[0].config
    assert (cfg.steps, cfg.model, cfg.respawn.max_respawns) == (50, "small", 2)  # the flags
    assert (cfg.replicas, cfg.seq_len, cfg.hang_timeout_s) == (3, 64, 5.0)  # the file
    assert f"from {EXAMPLE}" in out.stdout


def test_restart_from_scratch_must_be_asked_for_by_name_and_is_refused_on_a_run_that_is_not_running(shell, fed_run):
    with pytest.raises(UsageError, match=r"--from-scratch(.|\n)*usage: %monarch restart"):
        shell.run_line_magic("monarch", "restart")
    with pytest.raises(UsageError, match=r"^restart_from_scratch: the run is not running"):
        shell.run_line_magic("monarch", "restart --from-scratch")
