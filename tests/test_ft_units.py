"""Fault-tolerance layer, the parts that need no process: config validation, respawn backoff,
fault specs and schedules, platform choice, the tiny data set, and history from a log."""

from __future__ import annotations

import json
import types

import pytest

from monarch_nb.ft import Fault, FaultKind, FaultSchedule, RespawnBackoff, RunConfig, open_run, select_platform
from monarch_nb.ft.control.run import FTRun
from monarch_nb.ft.settings.platform import check_gpu_sharing
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.events import (
    FailureDetected,
    FaultInjected,
    Healed,
    Rejoined,
    ReplicasIdentical,
    Respawned,
    RunStarted,
    Step,
)

# ---- config: clear errors naming the field and the allowed values, before any process ----


@pytest.mark.parametrize("changes, field, allowed", [
    ({"model": "gpt5"}, "model", "debugmodel"),
    ({"replicas": 0}, "replicas", ">= 1"),
    ({"group_size": 0}, "group_size", ">= 1"),
    ({"platform": "tpu"}, "platform", "auto, cpu, cuda, rocm"),
    ({"backend": "mpi"}, "backend", "gloo, nccl"),
    ({"job": "yarn"}, "job", "local, process, slurm, kubernetes"),
    ({"min_replicas": 4}, "min_replicas", "1..3"),
    ({"hang_timeout_s": 0.1}, "hang_timeout_s", "poll_interval_s"),
    ({"respawn": RespawnBackoff(max_respawns=-1)}, "respawn.max_respawns", ">= 0"),
    ({"heal_interface": "eth 1"}, "heal_interface", "not a network interface name"),
    ({"heal_interface": "eth1", "heal_transport": "pg"}, "heal_interface", "heal_transport='striped'"),
    ({"on_failure": "torchrun"}, "on_failure", "peer, restart, plain_restart"),
    ({"on_failure": "plain_restart", "spares": 1}, "spares", "on_failure='peer'"),
])
def test_invalid_config_names_field_and_allowed_values(changes, field, allowed):
    with pytest.raises(ValueError) as err:
        RunConfig(**changes).validate()
    assert str(err.value).startswith(field + ":"), err.value
    assert allowed in str(err.value)


def test_invalid_config_fails_before_any_process_starts(tmp_path):
    with pytest.raises(ValueError, match="replicas"):
        FTRun(RunConfig(replicas=0, runs_root=str(tmp_path)))
    assert not any(tmp_path.iterdir()), "nothing may be created for an invalid run"


def test_a_plain_restart_address_names_the_jobs_store_and_its_generation():
    from monarch_nb.ft.settings.plain_address import PlainAddress, is_plain

    a = PlainAddress("10.77.0.1", 29500, 3)
    assert str(a) == "plain://10.77.0.1:29500/3" and PlainAddress.parse(str(a)) == a and is_plain(str(a))
    assert not is_plain("http://127.0.0.1:29510")
    with pytest.raises(ValueError, match="not a plain_restart address"):
        PlainAddress.parse("http://127.0.0.1:29510")


def test_a_heal_interface_resolves_to_its_address_or_names_the_ones_there_are():
    from monarch_nb.ft.worker.heal_transport import interface_address

    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(ValueError, match=r"^heal_interface: this node \(.*\) has no IPv4 interface 'ib9'; it has .*lo \(127.0.0.1\)"):
        interface_address("ib9")


def test_config_round_trips_through_a_dict():
    cfg = RunConfig(replicas=2, respawn=RespawnBackoff(max_respawns=3, backoff_s=0.5))
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="^bogus: unknown config field"):
        RunConfig.from_dict({"bogus": 1})
    # a run recorded before the respawn backoff had its own name resumes with it
    old = {**cfg.to_dict(), "restart": {"max_restarts": 3, "backoff_s": 0.5}}
    del old["respawn"]
    assert RunConfig.from_dict(old) == cfg


def test_a_config_that_says_recovery_loads_as_on_failure():
    """``recovery`` was on_failure's name: an old dict (a run's recorded config) still loads, and
    one that gives both names, differently, is refused naming both and which to keep."""
    old = {**RunConfig(replicas=2).to_dict(), "recovery": "restart"}
    del old["on_failure"]
    assert RunConfig.from_dict(old) == RunConfig(replicas=2, on_failure="restart")
    assert RunConfig.from_dict({**old, "on_failure": "restart"}).on_failure == "restart"  # both, the same
    with pytest.raises(ValueError) as err:
        RunConfig.from_dict({**old, "on_failure": "peer"})
    assert str(err.value) == ("on_failure: on_failure = 'peer' and recovery = 'restart' (its older name) differ; "
                              "keep only on_failure")
    with pytest.raises(ValueError, match="^on_failure: unknown value 'torchrun'"):
        RunConfig.from_dict({"recovery": "torchrun"}).validate()


def test_a_run_recorded_with_recovery_resumes_with_its_on_failure(tmp_path):
    """FTRun.resume reads the run's recorded config: an old run's ``recovery`` is its on_failure,
    and an ``on_failure`` given to the resume replaces it."""
    import torch

    from monarch_nb.ft.control.opening import resume_point
    from monarch_nb.ft.settings.checkpoint_format import COMPLETE, META, step_dir

    recorded = {**RunConfig(replicas=2, model="tiny", checkpoint_every=5).to_dict(), "recovery": "restart"}
    del recorded["on_failure"]
    EventStore(tmp_path / "events.jsonl").append(RunStarted(t=1.0, run_id=tmp_path.name, config=recorded))
    checkpoint = step_dir(tmp_path / "checkpoints", 5)
    checkpoint.mkdir(parents=True)
    torch.save({"fingerprint": {"model": "tiny", "group_size": 1}, "run_id": tmp_path.name}, checkpoint / META)
    (checkpoint / COMPLETE).touch()
    cfg, _, at = resume_point(tmp_path, {})
    assert cfg.on_failure == "restart" and at.step == 5
    assert resume_point(tmp_path, {"on_failure": "peer"})[0].on_failure == "peer"


# ---- respawn backoff ----------------------------------------------------------------------


def test_respawn_backoff_retries_at_once_then_backs_off_up_to_a_cap_then_gives_up():
    p = RespawnBackoff(max_respawns=5, backoff_s=1.0, backoff_factor=2.0, max_backoff_s=5.0)
    # the first attempt after the group trained is immediate; attempts in a row back off
    assert [p.wait_before(n) for n in range(1, 7)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [p.allows(n) for n in (1, 5, 6)] == [True, True, False]  # attempts in a row
    assert not RespawnBackoff(max_respawns=0).allows(1)


@pytest.mark.parametrize("backoff, field", [
    (RespawnBackoff(backoff_s=-1), "respawn.backoff_s"),
    (RespawnBackoff(backoff_factor=0.5), "respawn.backoff_factor"),
    (RespawnBackoff(backoff_s=10, max_backoff_s=1), "respawn.max_backoff_s"),
])
def test_respawn_backoff_rejects_nonsense(backoff, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        backoff.validate()


# ---- faults -------------------------------------------------------------------------------


def test_fault_kinds_are_the_six_the_product_injects_and_unknown_kinds_are_named():
    assert {k.value for k in FaultKind} >= {"kill", "segfault", "exit", "exception", "comms", "hang"}
    with pytest.raises(ValueError, match="kind: unknown fault kind 'meteor'; allowed values: kill, segfault"):
        FaultKind.parse("meteor")


@pytest.mark.parametrize("fault, field", [
    (Fault(FaultKind.KILL, replica=3), "replica"),
    (Fault(FaultKind.KILL, replica=-1), "replica"),
    (Fault(FaultKind.KILL, replica=0, rank=1), "rank"),
    (Fault(FaultKind.KILL, replica=0, at_step=0), "at_step"),
    (Fault(FaultKind.KILL, replica=0, at_step=5, after_s=1.0), "at_step/after_s"),
])
def test_fault_target_out_of_range_is_rejected(fault, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        fault.validate(replicas=3, group_size=1)


def test_fault_schedule_is_deterministic_for_a_seed_and_only_targets_eligible_groups():
    a = FaultSchedule(every_s=5, kinds=["kill", "exception", "comms"], seed=7, at_once=2)
    b = FaultSchedule(every_s=5, kinds=["kill", "exception", "comms"], seed=7, at_once=2)
    waves_a = [a.next_wave(2, [0, 2, 3], limit=5) for _ in range(50)]
    waves_b = [b.next_wave(2, [0, 2, 3], limit=5) for _ in range(50)]
    assert waves_a == waves_b
    assert all(len(w) == 2 and len({f.replica for f in w}) == 2 for w in waves_a), "at_once distinct groups"
    faults = [f for w in waves_a for f in w]
    assert {f.replica for f in faults} == {0, 2, 3}
    assert {f.kind for f in faults} == {FaultKind.KILL, FaultKind.EXCEPTION, FaultKind.COMMS}
    assert {f.rank for f in faults} == {0, 1}
    assert len(a.next_wave(2, [1, 2], limit=1)) == 1 and a.next_wave(2, [], limit=5) == []


def test_fault_schedule_validates_its_arguments():
    with pytest.raises(ValueError, match="^every"):
        FaultSchedule(every_s=0)
    with pytest.raises(ValueError, match="^keep: must be an integer >= 1"):
        FaultSchedule(every_s=1, keep=0)
    with pytest.raises(ValueError, match="^kinds: unknown fault kind"):
        FaultSchedule(every_s=1, kinds=["kill", "flood"])


def test_scheduled_waves_never_leave_fewer_than_keep_training_groups(tmp_path):
    """8 groups, waves of 4, keep 4: a wave that finds its victims still out is skipped, so the
    training groups swing between 4 and 8 and never lower (the seed's 8 <-> 16 at half size)."""
    import threading
    import time

    from monarch_nb.ft.control.groups import FAILED, TRAINING, GroupTable
    from monarch_nb.ft.control.injector import FaultInjector

    groups = GroupTable(8)
    for g in groups:
        g.state = TRAINING
    lowest, sent, lock = [8], [], threading.Lock()

    def arm(fault):  # the victim goes down at once, as a fired fault takes it out
        with lock:
            groups[fault.replica].state = FAILED
            sent.append(fault.replica)
            lowest[0] = min(lowest[0], len(groups.training()))

    injector = FaultInjector(1, groups, str(tmp_path / "faults.jsonl"), arm, arm, lambda e: None, lambda: True)
    injector.schedule(0.02, kinds=["comms"], at_once=4, keep=4, seed=0)
    try:
        deadline = time.monotonic() + 10
        while len(sent) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # ten more ticks with 4 of 8 out: no wave
        assert len(sent) == 4 and lowest[0] == 4
        with lock:
            for g in groups:
                g.state = TRAINING  # the victims are back: the next wave goes
        while len(sent) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        injector.stop_schedule()
    assert len(sent) >= 8 and lowest[0] == 4


@pytest.mark.parametrize("groups, at_once, keep, message", [
    (2, 5, 3, r"^keep: 3 training groups kept standing leaves none of this run's 2 group\(s\) to fault; "
              r"allowed: --keep 1\.\.1"),
    (2, 1, 2, r"^keep: 2 training groups kept standing"),
    (1, 1, 1, r"allowed: none: a run of one group has no group to spare"),
    (2, 2, 1, r"^at_once: 2 groups at once can never be hit: the run has 2 groups and keeps 1 training; "
              r"allowed: --at-once 1\.\.1"),
    (16, 9, 8, r"^at_once: 9 groups at once can never be hit"),
])
def test_a_schedule_the_groups_can_never_satisfy_is_refused_when_set(tmp_path, groups, at_once, keep, message):
    from monarch_nb.ft.control.groups import TRAINING, GroupTable
    from monarch_nb.ft.control.injector import FaultInjector

    table = GroupTable(groups)
    for g in table:
        g.state = TRAINING
    injector = FaultInjector(1, table, str(tmp_path / "faults.jsonl"), lambda f: None, lambda f: None,
                             lambda e: None, lambda: True)
    with pytest.raises(ValueError, match=message):
        injector.schedule(30, kinds=["kill"], at_once=at_once, keep=keep)
    assert injector._schedule_stop is None  # nothing was started
    if groups > 1:
        with pytest.raises(ValueError, match=r"^rank: 3 is not a rank of a group of 1; allowed: 0\.\.0"):
            injector.schedule(30, kinds=["kill"], rank=3, keep=groups - 1)


def test_a_wave_that_finds_too_few_groups_training_is_recorded_as_skipped_with_its_reason(tmp_path):
    """4 groups, waves of 2 keeping 2: with 3 of them out, a wave cannot fire and says why."""
    import threading
    import time

    from monarch_nb.ft.control.groups import FAILED, TRAINING, GroupTable
    from monarch_nb.ft.control.injector import FaultInjector
    from monarch_nb.telemetry.events import FaultSkipped

    table = GroupTable(4)
    for g in table:
        g.state = TRAINING
    for g in list(table)[:2]:
        g.state = FAILED  # two already out: a wave of 2 keeping 2 has none to take
    events, lock = [], threading.Lock()

    def emit(e):
        with lock:
            events.append(e)

    injector = FaultInjector(1, table, str(tmp_path / "faults.jsonl"), lambda f: None, lambda f: None, emit,
                             lambda: True)
    injector.schedule(0.02, kinds=["comms"], at_once=2, keep=2, seed=0)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with lock:
                if any(isinstance(e, FaultSkipped) for e in events):
                    break
            time.sleep(0.01)
    finally:
        injector.stop_schedule()
    skipped = [e for e in events if isinstance(e, FaultSkipped)]
    assert skipped, events
    assert (skipped[0].wanted, skipped[0].fired, skipped[0].training, skipped[0].keep) == (2, 0, 2, 2)
    assert skipped[0].reason == ("a scheduled wave fired 0 of 2 fault(s): 2 group(s) training and 2 kept standing "
                                 "leave 0 to fault")


def test_one_notice_per_streak_of_skipped_waves_and_one_when_the_run_finishes():
    from types import SimpleNamespace

    from monarch_nb.notebook.notices import FailureNotices, notice_text
    from monarch_nb.telemetry import EventStore
    from monarch_nb.telemetry.events import FaultInjected, FaultSkipped, RunFinished

    shown: list = []
    notices = FailureNotices(show=shown.append)
    notices.pre_run_cell()
    run = SimpleNamespace(events=EventStore())
    notices.watch_run(run)
    skip = dict(wanted=2, fired=0, training=2, keep=2, reason="a scheduled wave fired 0 of 2 fault(s): ...")
    for _ in range(3):
        run.events.append(FaultSkipped(**skip))
    run.events.append(FaultInjected(fault="kill", replica=0, rank=0))
    run.events.append(FaultSkipped(**skip))
    run.events.append(RunFinished(step=50, checkpoint="/runs/r/checkpoints/step-0000050", seconds=0.1))
    assert [type(e).__name__ for e in shown] == ["FaultSkipped", "FaultSkipped", "RunFinished"]
    assert "finished at step 50" in notice_text(shown[-1]) and "step-0000050" in notice_text(shown[-1])
    notices.close()


def _dead_child(tmp_path, kind, log=None):
    """A real child process that fires ``kind`` the way a trainer does (recording it in the
    fault log first when ``log`` is given); returns it once it has ended, not reaped."""
    import os
    import subprocess
    import sys

    import psutil

    code = ("import os, sys\n"
            "from monarch_nb.ft.settings.faults import FaultKind, record_firing\n"
            "from monarch_nb.ft.worker.fault_firing import fire\n"
            "kind = FaultKind(sys.argv[1])\n"
            "if len(sys.argv) > 2:\n"
            "    record_firing(sys.argv[2], {'kind': 'fault_fired', 'fault': kind.value, 'replica': 0,\n"
            "                                'rank': 0, 'step': 5, 'pid': os.getpid()})\n"
            "fire(kind)\n")
    child = subprocess.Popen([sys.executable, "-c", code, kind] + ([log] if log else []))
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, still a zombie
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    return child


def _pid_check(tmp_path, pid):
    """The supervisor's pid check over one group whose rank 0 is ``pid``."""
    import socket

    from monarch_nb.ft.control.groups import GroupTable
    from monarch_nb.ft.control.injector import FaultInjector
    from monarch_nb.ft.control.supervisor import Supervisor

    groups = GroupTable(1)
    groups[0].procs = [(pid, socket.gethostname())]
    injector = FaultInjector(1, groups, str(tmp_path / "faults.jsonl"), arm=None, cluster=None, emit=None,
                             running=lambda: True)
    sup = Supervisor(RunConfig(replicas=1), None, groups, None, None, None, [], lambda replica: None,
                     None, lambda: "", fired_by=injector.fired_by)
    return sup.detector.dead_rank(groups[0])


@pytest.mark.parametrize("kind, how", [("segfault", "killed by signal 11 (SIGSEGV)"), ("exit", "exited with code 13")])
def test_the_pid_check_says_how_a_dead_process_ended(tmp_path, kind, how):
    # not reaped yet: the pid check reads the exit status itself (waitid without reaping)
    child = _dead_child(tmp_path, kind)
    failure = _pid_check(tmp_path, child.pid)
    assert failure.source == "pid" and failure.rank == 0
    assert failure.reason == f"process {child.pid} of rank 0 {how} (found by pid check)"
    child.wait()
    # reaped first, as Monarch's runtime reaps its workers: the exit status is gone
    assert _pid_check(tmp_path, child.pid).reason == f"process {child.pid} of rank 0 is gone (found by pid check)"
    # ... but a worker writes the fault log before it fires: that says how it ended
    child = _dead_child(tmp_path, kind, log=str(tmp_path / "faults.jsonl"))
    assert child.wait() == {"segfault": -11, "exit": 13}[kind]  # what really happened
    assert _pid_check(tmp_path, child.pid).reason == (f"process {child.pid} of rank 0 {how} (found by pid check; "
                                                      f"it fired an injected {kind} fault, per the fault log)")


def test_silence_is_counted_from_the_start_of_training_not_from_the_spawn():
    """16 groups on two cores take ~2 min to start; the first groups were spawned (and last heard
    from) that long before training started. A first poll that misses its 0.5 s under the load
    of the start must not read as 2 min of silence (it did: 9 of 16 groups declared hung)."""
    import time

    from monarch_nb.ft.control.groups import TRAINING, GroupTable
    from monarch_nb.ft.control.supervisor import Supervisor

    groups = GroupTable(1)
    g = groups[0]
    g.state, g.last_answer = TRAINING, time.monotonic() - 120.0  # spawned two minutes ago
    sup = Supervisor(RunConfig(replicas=1), None, groups, None, None, None, [], lambda replica: None,
                     None, lambda: "")
    sup.launcher.call = lambda *a, **k: None  # the trainer's start endpoint answered
    sup.detector.dead_rank = lambda g: None
    sup.poll = lambda g, timeout: types.SimpleNamespace(errors={}, values={}, missing=[0])  # no answer in time
    sup.start_training(g)
    assert sup.detector.check(g) is None, "a slow first poll is not a hang"
    g.last_answer -= sup.config.hang_timeout_s + 1  # silent past hang_timeout_s since then: that is one
    failure = sup.detector.check(g)
    assert failure is not None and failure.source == "hang" and "no answer from ranks [0]" in failure.reason


def test_the_poll_deadline_grows_while_answers_are_late_and_shrinks_when_they_are_quick():
    """32 groups on two cores: answers took 0.5-0.7 s against a fixed 0.5 s deadline, every poll
    missed, and groups that answered every poll were failed as hung. Missed: doubled, up to half
    the hang timeout (a real hang is still caught); answered: three times the latency, from 0.5."""
    from monarch_nb.ft.control.detector import next_poll_deadline

    def result(seconds=0.0, missing=(), errors=None):
        return types.SimpleNamespace(seconds=seconds, missing=list(missing), errors=errors or {})

    floor, cap = 0.5, 2.5  # hang_timeout_s = 5
    d = floor
    d = next_poll_deadline(d, result(0.5, missing=[0]), floor, cap)
    assert d == 1.0
    d = next_poll_deadline(d, result(1.0, missing=[0]), floor, cap)
    d = next_poll_deadline(d, result(2.0, missing=[0]), floor, cap)
    assert d == cap, "never past half the hang timeout"
    assert next_poll_deadline(d, result(0.7), floor, cap) == pytest.approx(2.1)  # answered in 0.7 s: room for it
    assert next_poll_deadline(2.1, result(0.02), floor, cap) == floor  # quick again: back to the quick check
    assert next_poll_deadline(1.0, result(0.1, errors={0: RuntimeError()}), floor, cap) == 1.0


# ---- platform: one module decides device and backend ------------------------------------


def _fake_torch(gpu: bool, hip: str | None):
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: gpu),
                                 version=types.SimpleNamespace(hip=hip))


def test_platform_is_cpu_gloo_without_a_gpu():
    p = select_platform("auto", torch_module=_fake_torch(False, None))
    assert (p.name, p.device_type, p.backend) == ("cpu", "cpu", "gloo")


def test_platform_selects_nccl_on_cuda_mocked_gpu():
    p = select_platform("auto", torch_module=_fake_torch(True, None))
    assert (p.name, p.device_type, p.backend) == ("cuda", "cuda", "nccl")


def test_platform_selects_nccl_on_rocm_mocked_gpu():
    p = select_platform("auto", torch_module=_fake_torch(True, "6.2.41133"))
    assert (p.name, p.device_type, p.backend) == ("rocm", "cuda", "nccl")  # nccl is RCCL on ROCm builds
    assert "RCCL" in p.describe()


def test_platform_rejects_a_gpu_platform_on_a_cpu_machine():
    with pytest.raises(ValueError, match="^platform: 'cuda' requested but this machine has no GPU"):
        select_platform("cuda", torch_module=_fake_torch(False, None))
    assert select_platform("auto", backend="gloo", torch_module=_fake_torch(True, None)).backend == "gloo"
    with pytest.raises(ValueError, match="^backend: 'nccl' needs GPUs and this platform is cpu"):
        select_platform("auto", backend="nccl", torch_module=_fake_torch(False, None))


def test_groups_sharing_a_host_need_a_gpu_per_rank_with_nccl_mocked_gpu_count():
    nccl = select_platform("auto", torch_module=_fake_torch(True, None))
    with pytest.raises(ValueError, match=r"^backend: nccl cannot put two ranks .* 3 groups .* need 3 GPUs; this host "
                                         r"has 1\. Use backend='gloo' \(%monarch train --backend gloo"):
        check_gpu_sharing(nccl, groups=3, group_size=1, devices=1)
    check_gpu_sharing(nccl, groups=4, group_size=2, devices=8)  # one GPU per rank: fine
    gloo = select_platform("auto", backend="gloo", torch_module=_fake_torch(True, None))
    check_gpu_sharing(gloo, groups=3, group_size=1, devices=1)  # gloo shares a GPU
    check_gpu_sharing(select_platform("cpu"), groups=3, group_size=1, devices=0)


def test_groups_on_one_host_take_gpus_one_after_another():
    import torch

    cuda = select_platform("auto", torch_module=_fake_torch(True, None))
    count = max(1, torch.cuda.device_count())  # a CPU host: everything wraps to device 0
    assert [cuda.device(i).index for i in range(3)] == [i % count for i in range(3)]
    assert select_platform("cpu").device(5) == torch.device("cpu")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU-host check: this host has a GPU")
def test_platform_on_a_cpu_only_host_is_cpu_gloo():
    p = select_platform()
    assert (p.device_type, p.backend) == ("cpu", "gloo")


# ---- tiny data ----------------------------------------------------------------------------


def test_tiny_tokenizer_and_corpus_are_built_locally_and_load_in_torchtitan(tmp_path):
    from monarch_nb.ft.settings.tinydata import ensure_tinydata

    out = ensure_tinydata(tmp_path)
    again = ensure_tinydata(tmp_path)
    assert out == again
    assert {p.name for p in out.iterdir()} >= {"tokenizer.json", "tokenizer_config.json", "corpus.jsonl"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert 256 < manifest["vocab_size"] <= 2048  # fits the Llama 3 debug model's vocabulary
    from monarch_nb import seam

    seam.stub_triton_kernels()
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tok = HuggingFaceTokenizer(tokenizer_path=str(out))
    ids = tok.encode("The cat sees the red ball.", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids[1:-1]) == "The cat sees the red ball."


# ---- history from the event log alone -----------------------------------------------------


def _write_synthetic_run(path):
    store = EventStore(path / "events.jsonl")
    t = 1000.0
    store.append(RunStarted(t=t, run_id="synthetic", config={"replicas": 2}))
    for s in range(1, 11):
        for r in (0, 1):
            store.append(Step(t=t + s, replica=r, step=s, loss=5.0 - 0.3 * s, tokens_per_s=100.0, committed=True))
    store.append(FaultInjected(t=t + 5.0, fault="corrupt", replica=0, rank=0, step=6))  # fails nothing
    store.append(FaultInjected(t=t + 10.2, fault="kill", replica=1, rank=0, step=11))
    store.append(FailureDetected(t=t + 11.0, replica=1, rank=0, reason="Killed(sig=9)", detection_s=0.5))
    for s in range(11, 16):
        store.append(Step(t=t + s + 0.5, replica=0, step=s, loss=2.0, tokens_per_s=100.0, committed=True))
    store.append(Respawned(t=t + 14.0, replica=1, attempt=1, seconds=3.0))
    store.append(Healed(t=t + 15.6, replica=1, step=15, bytes=1234, seconds=0.1, source_replica=0, donors=[0, 2],
                        gbps=1.5, corrupt=1))
    store.append(Step(t=t + 16.5, replica=1, step=16, loss=1.9, tokens_per_s=100.0, committed=True))
    store.append(Rejoined(t=t + 16.5, replica=1, step=16, seconds_since_failure=6.0))
    store.append(ReplicasIdentical(t=t + 18.0, step=18, identical=True, hashes={"a": "x", "b": "x"}))
    store.close()


def test_open_run_rebuilds_recoveries_from_the_file_alone(tmp_path):
    _write_synthetic_run(tmp_path)
    history = open_run(tmp_path)
    (rec,) = history.recoveries()
    assert rec.fault == "kill" and rec.replica == 1
    assert rec.detection_s == 0.5 and rec.respawn_s == 3.0
    assert (rec.heal_bytes, rec.heal_source, rec.rejoined_step) == (1234, 0, 16)
    assert (rec.heal_donors, rec.heal_gbps, rec.heal_corrupt) == ([0, 2], 1.5, 1)  # a striped heal, read back
    assert "from replicas 0, 2 at 1.50 GB/s, 1 corrupt piece(s) refetched" in str(rec)
    assert rec.survivor_commits_while_down == 5 and rec.identical is True
    assert rec.survivor_stall_steps == pytest.approx(1.5)
    assert history.summary()["loss_end"] < history.summary()["loss_start"]
    assert open_run(tmp_path / "events.jsonl").recoveries() == history.recoveries()


# ---- waiting on a run: which rejoin, and the identity verdict ------------------------------


@pytest.fixture
def unstarted_run(tmp_path):
    """A real FTRun that was never started: its event store is the live one, fed by hand."""
    run = FTRun(RunConfig(replicas=3, runs_root=str(tmp_path)))
    yield run
    run.events.close()


def _later(run, delay, *events):
    import threading

    def feed():
        for e in events:
            run.events.append(e)

    threading.Timer(delay, feed).start()


def test_wait_rejoin_waits_for_every_recovery_under_way(unstarted_run):
    from monarch_nb.ft.control.waiting import wait_for_rejoin

    run = unstarted_run
    run.events.append(FaultInjected(fault="kill", replica=0, rank=0, step=4))
    run.events.append(FailureDetected(replica=2, rank=0, reason="Killed(sig=9)"))
    _later(run, 0.2, Rejoined(replica=2, step=9, seconds_since_failure=3.0))
    _later(run, 0.4, FailureDetected(replica=0, rank=0, reason="Killed(sig=9)"),
           Rejoined(replica=0, step=11, seconds_since_failure=4.5))
    got = wait_for_rejoin(run, timeout=10)
    assert [(e.replica, e.step) for e in got] == [(2, 9), (0, 11)]


def test_wait_rejoin_of_one_replica_ignores_the_others(unstarted_run):
    from monarch_nb.ft.control.waiting import wait_for_rejoin

    run = unstarted_run
    run.events.append(FailureDetected(replica=0, rank=0, reason="x"))
    run.events.append(FailureDetected(replica=1, rank=0, reason="x"))
    _later(run, 0.1, Rejoined(replica=0, step=5), Rejoined(replica=1, step=6, seconds_since_failure=2.0))
    (e,) = wait_for_rejoin(run, replica=1, timeout=10)
    assert (e.replica, e.step) == (1, 6)
    with pytest.raises(ValueError, match=r"^replica: 7 is not an active replica group; active groups: 0, 1, 2"):
        wait_for_rejoin(run, replica=7)


def test_wait_rejoin_counts_a_commit_made_before_the_call_but_recorded_after(unstarted_run):
    """The controller records a rejoin one poll after the worker committed: it must not be missed."""
    import time

    from monarch_nb.ft.control.waiting import wait_for_rejoin

    run = unstarted_run
    now = time.time()
    run.events.append(FailureDetected(t=now - 5, replica=1, rank=0, reason="x"))
    _later(run, 0.3, Rejoined(t=now - 0.1, replica=1, step=7, seconds_since_failure=4.9))
    (e,) = wait_for_rejoin(run, timeout=10)
    assert e.step == 7


def test_wait_rejoin_with_nothing_under_way_waits_for_the_next_failure_and_rejoin(unstarted_run):
    import time

    from monarch_nb.ft.control.waiting import wait_for_rejoin

    run = unstarted_run
    t = time.time() - 60  # an earlier recovery, long finished, does not count
    run.events.append(FailureDetected(t=t, replica=1, rank=0, reason="x"))
    run.events.append(Rejoined(t=t + 5, replica=1, step=3, seconds_since_failure=5.0))
    with pytest.raises(TimeoutError, match=r"^no replica group rejoined within 0.3 s \(none was recovering"):
        wait_for_rejoin(run, timeout=0.3)
    soon = time.time() + 0.2  # the worker commits after the call
    _later(run, 0.2, FailureDetected(t=soon, replica=2, rank=0, reason="x"), Rejoined(t=soon, replica=2, step=12))
    (e,) = wait_for_rejoin(run, timeout=10)
    assert (e.replica, e.step) == (2, 12)


def test_wait_rejoin_names_what_it_waited_for_and_how_far_it_got(unstarted_run):
    from monarch_nb.ft.control.waiting import wait_for_rejoin
    from monarch_nb.telemetry.events import GaveUp

    run = unstarted_run
    run.events.append(FailureDetected(replica=1, rank=0, reason="x"))
    run.events.append(Respawned(replica=1, attempt=1, seconds=2.0))
    with pytest.raises(TimeoutError, match=r"^replica 1 \(recovering\) did not rejoin within 0.2 s "
                                           r"\(replica 1 healing\)"):
        wait_for_rejoin(run, timeout=0.2)
    _later(run, 0.1, GaveUp(replica=1, attempts=10))
    with pytest.raises(RuntimeError, match="replica 1 will not rejoin: the respawn policy gave up on it after 10"):
        wait_for_rejoin(run, timeout=10)


def test_describe_rejoin_is_one_line_with_the_step_and_the_time_since_the_fault():
    from monarch_nb.ft.control.waiting import describe_rejoin

    assert describe_rejoin(Rejoined(replica=1, step=42, seconds_since_failure=7.25)) == \
        "replica 1 rejoined at step 42, 7.2 s after the fault"
    assert describe_rejoin(Rejoined(replica=0, step=3)) == "replica 0 rejoined at step 3"


def _verdict(hashes):
    return ReplicasIdentical(step=30, identical=len({(k.split("/")[1], v) for k, v in hashes.items()})
                             == len({k.split("/")[1] for k in hashes}), hashes=hashes)


def test_differing_ranks_are_the_minority_of_their_rank():
    from monarch_nb.ft.control.waiting import differing_ranks

    same = "params:aa optim:bb"
    assert differing_ranks(_verdict({f"replica{r}/rank{k}": same + str(k) for r in range(3) for k in range(2)})) == []
    one = {"replica0/rank0": same, "replica1/rank0": "params:aa optim:XX", "replica2/rank0": same}
    assert differing_ranks(_verdict(one)) == ["replica1/rank0"]
    tie = {"replica0/rank1": same, "replica1/rank1": "params:zz optim:bb"}
    assert differing_ranks(_verdict(tie)) == ["replica0/rank1", "replica1/rank1"]


class _ReportingRun:
    """Stands in for a started run (two or more groups training) on the one call
    ``require_identical`` makes: ``check_identical`` runs the real identity check over digests
    the groups would report (parameters and optimizer state of each rank)."""

    def __init__(self, digests):
        self.digests = digests  # (replica, rank) -> (params, optim)

    def check_identical(self, timeout):
        from monarch_nb.ft.control.identity import IdentityChecks
        from monarch_nb.ft.record.ingest import HashReport

        verdicts = []
        checks = IdentityChecks(group_size=1, emit=verdicts.append)
        step = checks.request([(r, 27) for r, _ in self.digests], lambda replica, step: True)
        for (replica, rank), (params, optim) in self.digests.items():
            checks.record(HashReport(replica=replica, rank=rank, step=step, params=params, optim=optim))
        return verdicts[0]


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.blake2b(data, digest_size=12).hexdigest()


def test_require_identical_returns_the_verdict_or_names_the_ranks_that_differ(unstarted_run):
    from monarch_nb.ft.control.waiting import ReplicasDiffer, require_identical

    with pytest.raises(RuntimeError, match="^fewer than two replica groups are training"):
        require_identical(unstarted_run)  # never started: nothing to compare
    weights, adam, drifted = _digest(b"weights"), _digest(b"adam state"), _digest(b"adam state, stale lr")
    verdict = require_identical(_ReportingRun({(r, 0): (weights, adam) for r in range(3)}))
    assert verdict.identical and verdict.step == 30 and len(verdict.hashes) == 3
    with pytest.raises(ReplicasDiffer) as err:
        require_identical(_ReportingRun({(0, 0): (weights, adam), (1, 0): (weights, drifted), (2, 0): (weights, adam)}))
    assert err.value.ranks == ["replica1/rank0"]
    assert str(err.value) == ("replicas are NOT bit-identical at step 30: replica1/rank0 (optimizer state) differs "
                              "from the other replicas of the same rank (3 ranks compared)")

    class Silent:  # a group that never commits the checked step
        def check_identical(self, timeout):
            raise TimeoutError("no matching event")

    with pytest.raises(TimeoutError, match="^no identity verdict within 60 s: every training group must commit"):
        require_identical(Silent())


# ---- identity checks: never wait for a step a group has already passed -------------------


def test_an_identity_check_moves_ahead_when_fast_steps_outran_the_controllers_view():
    # A GPU commits many steps between two polls: the groups are past the first target the
    # controller picks (hash_at answers False). Found on an H200, where check_identical waited
    # for a step no group would report.
    from monarch_nb.ft.control.identity import IdentityChecks
    from monarch_nb.ft.record.ingest import HashReport

    emitted = []
    checks = IdentityChecks(group_size=1, emit=emitted.append)
    actual = {0: 100, 1: 101}  # where the groups really are; the controller believes 10
    asked = []

    def ask(replica, step):
        asked.append((replica, step))
        return step > actual[replica]

    target = checks.request([(0, 10), (1, 10)], ask)
    assert target > 101 and [s for _, s in asked] == [13, 13, 25, 25, 73, 73, 265, 265][:len(asked)]
    for r in (0, 1):
        checks.record(HashReport(replica=r, rank=0, step=target, params="p", optim="o"))
    assert [(e.step, e.identical) for e in emitted] == [(target, True)]
    # a group that cannot be asked (None) is left out; one that can never be armed gives up
    assert IdentityChecks(1, emitted.append).request([(0, 1), (1, 1)], lambda r, s: False) is None


def test_two_checks_aimed_at_one_step_share_it_and_one_unanswered_ask_leaves_no_group_out():
    """A rejoin starts its own check and the user's check_identical right after it aims at the same
    meeting step. The second replaced the first's pending check, and the first's unanswered ask
    (a busy host, 5 s) then took a healthy group out of the second's: CI saw a verdict of 2 of 3."""
    from monarch_nb.ft.control.identity import IdentityChecks
    from monarch_nb.ft.record.ingest import HashReport

    emitted = []
    checks = IdentityChecks(group_size=1, emit=emitted.append, every=10)  # semi-sync: meetings every 10
    groups = [(0, 72), (1, 70), (2, 72)]
    assert checks.request(groups, lambda r, s: None if r == 2 else True) == 80  # group 2 slow to answer
    checks.record(HashReport(replica=0, rank=0, step=80, params="p", optim="o"))
    assert checks.request(groups, lambda r, s: True) == 80  # the same step: joined, group 0's report kept
    for r in (1, 2):
        checks.record(HashReport(replica=r, rank=0, step=80, params="p", optim="o"))
    assert [(e.step, sorted(e.hashes)) for e in emitted] == [(80, ["replica0/rank0", "replica1/rank0",
                                                                   "replica2/rank0"])]
    # in the other order, a later unanswered ask does not undo an earlier armed one
    emitted.clear()
    assert checks.request([(0, 82), (1, 82), (2, 82)], lambda r, s: True) == 90
    assert checks.request([(0, 82), (1, 82), (2, 82)], lambda r, s: None if r == 2 else True) == 90
    for r in (0, 1, 2):
        checks.record(HashReport(replica=r, rank=0, step=90, params="p", optim="o"))
    assert [len(e.hashes) for e in emitted] == [3]


def test_an_identity_check_asks_every_group_at_once():
    """Asked one after another, 32 groups answering ~1 s each on a busy host outran the steps the
    check aimed ahead, and no check completed at R = 32. Every ask must be in flight together:
    a barrier of 32 parties only opens if they are."""
    import threading

    from monarch_nb.ft.control.identity import IdentityChecks

    barrier = threading.Barrier(32, timeout=10)

    def ask(replica, step):
        barrier.wait()
        return True

    assert IdentityChecks(group_size=1, emit=[].append).request([(r, 5) for r in range(32)], ask) == 8


@pytest.mark.parametrize("groups, expected", [(2, 0.25), (8, 0.25), (16, 0.5), (32, 1.0)])
def test_groups_are_polled_less_often_past_eight_so_the_controllers_polls_stay_flat(groups, expected):
    from monarch_nb.ft.control.groups import GroupTable
    from monarch_nb.ft.control.detector import POLLS_PER_S
    from monarch_nb.ft.control.supervisor import Supervisor

    table = GroupTable(groups)
    sup = Supervisor(RunConfig(replicas=groups), None, table, None, None, None, [], lambda replica: None,
                     lambda group, port: (), lambda: "")
    assert sup.detector.poll_interval() == pytest.approx(expected)
    assert groups / sup.detector.poll_interval() <= max(POLLS_PER_S, groups / 0.25)
    hasty = Supervisor(RunConfig(replicas=groups, hang_timeout_s=2.0), None, table, None, None, None, [],
                       lambda replica: None, lambda group, port: (), lambda: "")
    assert hasty.detector.poll_interval() <= 0.5  # a quarter of the hang timeout: a hang is still noticed in time


def test_most_groups_silent_at_once_reads_as_overload_not_as_hangs():
    """32 groups on two cores: every poll answers late. Failing them all as hung killed healthy
    groups and fed the overload with respawns (bench_scale at R = 32); one silent group is
    still a hang after hang_timeout_s."""
    from monarch_nb.ft.control.groups import TRAINING, GroupTable
    from monarch_nb.ft.control.detector import OVERLOAD_PATIENCE
    from monarch_nb.ft.control.supervisor import Supervisor

    table = GroupTable(8)
    for g in table:
        table.set_state(g, TRAINING)
        table.touch(g, 100.0)
    sup = Supervisor(RunConfig(replicas=8, hang_timeout_s=5.0), None, table, None, None, None, [],
                     lambda replica: None, lambda group, port: (), lambda: "")
    sup.detector.host_load = lambda: 0.5  # a quiet host
    table.touch(table[0], 90.0)  # one group silent for 10 s, the others answered just now
    assert sup.detector.hang_deadline(100.0) == 5.0
    for g in list(table)[:4]:  # half of them silent
        table.touch(g, 90.0)
    assert sup.detector.hang_deadline(100.0) == OVERLOAD_PATIENCE * 5.0
    small = GroupTable(3)  # too few groups to tell overload from hangs
    for g in small:
        small.set_state(g, TRAINING)
        small.touch(g, 90.0)
    sup3 = Supervisor(RunConfig(replicas=3, hang_timeout_s=5.0), None, small, None, None, None, [],
                      lambda replica: None, lambda group, port: (), lambda: "")
    sup3.detector.host_load = lambda: 0.5
    assert sup3.detector.hang_deadline(100.0) == 5.0


def test_a_group_starved_of_cpu_on_an_oversubscribed_host_is_not_a_hang():
    """32 groups on two cores (load ~35): healthy groups went 7-8 s between answers while a spare
    was built, and 14 were failed as hung against 5 s. A group on this host gets as many hang
    timeouts as the host has runnable work per core, up to STARVED_PATIENCE; a group elsewhere
    (a cluster node) is judged by its own silence alone."""
    import socket

    from monarch_nb.ft.control.groups import TRAINING, GroupTable
    from monarch_nb.ft.control.detector import STARVED_PATIENCE
    from monarch_nb.ft.control.supervisor import Supervisor

    table = GroupTable(2)
    for g in table:
        table.set_state(g, TRAINING)
        table.touch(g, 100.0)
    here, there = table
    here.procs, there.procs = [(1, socket.gethostname())], [(2, "node-elsewhere")]
    sup = Supervisor(RunConfig(replicas=2, hang_timeout_s=5.0), None, table, None, None, None, [],
                     lambda replica: None, lambda group, port: (), lambda: "")
    sup.detector.host_load = lambda: 3.0
    assert sup.detector.hang_deadline(100.0, here) == 15.0
    assert sup.detector.hang_deadline(100.0, there) == 5.0
    sup.detector.host_load = lambda: 17.5  # 35 runnable on 2 cores
    assert sup.detector.hang_deadline(100.0, here) == STARVED_PATIENCE * 5.0
    sup.detector.host_load = lambda: 0.3
    assert sup.detector.hang_deadline(100.0, here) == 5.0


def test_a_group_that_healed_past_the_checked_step_is_left_out_of_the_check():
    """At R = 32 on two cores groups dropped from a quorum healed from a peer past the step the
    check waited for, so it never heard from them and no check completed. A rank that skipped
    the step says so (``hashes_skipped``); the check compares those that committed it."""
    from monarch_nb.ft.control.identity import IdentityChecks
    from monarch_nb.ft.record.ingest import EventIngest, HashReport, HashSkipped

    emitted = []
    checks = IdentityChecks(group_size=1, emit=emitted.append)
    target = checks.request([(0, 10), (1, 10), (2, 10)], lambda r, s: True)
    for r in (0, 1):
        checks.record(HashReport(replica=r, rank=0, step=target, params="p", optim="o"))
    assert emitted == []  # replica 2 was asked and has not answered: no verdict yet
    [skip] = EventIngest(1).translate(2, {0: {"events": [{"kind": "hashes_skipped", "step": target, "at": target + 4,
                                                          "t": 1.0}]}})
    assert skip == HashSkipped(replica=2, rank=0, step=target, at=target + 4)
    checks.skipped(skip)
    [verdict] = emitted
    assert verdict.step == target and verdict.identical and sorted(verdict.hashes) == ["replica0/rank0", "replica1/rank0"]
    # every asked rank skipping it: the check is dropped, not left pending for ever
    t2 = checks.request([(0, 20), (1, 20)], lambda r, s: True)
    for r in (0, 1):
        checks.skipped(HashSkipped(replica=r, rank=0, step=t2, at=t2 + 1))
    assert len(emitted) == 1 and t2 not in checks._pending


def test_the_join_timeout_stretches_with_processes_per_core_on_a_shared_host():
    """32 groups on two cores: survivors came to the quorum after a failure more than the base
    1 s apart, were left out and healed (153 heals for 2 faults). Stretched by processes per core."""
    from monarch_nb.ft.control.lighthouse import join_timeout_for
    from monarch_nb.ft.control.placement import Placement, SlurmPlacement

    assert join_timeout_for(1000, 2, 2) == 1000  # a core each: unchanged
    assert join_timeout_for(1000, 1, 8) == 1000  # never shorter than asked
    assert join_timeout_for(1000, 9, 2) == 4500
    assert join_timeout_for(1000, 33, 2) == 8000  # at most 8x
    assert Placement.shares_this_host and not SlurmPlacement.shares_this_host


def test_an_address_this_host_cannot_name_from_its_files_is_reported_with_the_line_that_fixes_it():
    """torch's store client looks up the name of ::ffff:a.b.c.d on every connect; unnamed in
    /etc/hosts it asks DNS, and one lost reply held 16 groups' quorum change for 5 s."""
    from monarch_nb.ft.control.name_lookup import reverse_lookup_finding, store_form

    assert store_form("127.0.0.1") == "::ffff:127.0.0.1" and store_form("::1") == "::1"
    assert reverse_lookup_finding("127.0.0.1") is None  # ./run.sh setup wrote the mapped loopback line
    finding = reverse_lookup_finding("127.0.0.77")  # an address no file names
    assert finding is not None and "::ffff:127.0.0.77" in finding and "/etc/hosts" in finding, finding


def test_a_group_that_fails_before_the_checked_step_is_left_out_of_the_check():
    """At R = 32 each check asked after a rejoin still waited on a group the next fault took, and
    none completed: a failed group is dropped from every pending check."""
    from monarch_nb.ft.control.identity import IdentityChecks
    from monarch_nb.ft.record.ingest import HashReport

    emitted = []
    checks = IdentityChecks(group_size=2, emit=emitted.append)
    target = checks.request([(0, 10), (1, 10), (2, 10)], lambda r, s: True)
    for r in (0, 1):
        for k in (0, 1):
            checks.record(HashReport(replica=r, rank=k, step=target, params=f"p{k}", optim="o"))
    checks.record(HashReport(replica=2, rank=0, step=target, params="other", optim="o"))  # then group 2 died
    assert emitted == []
    checks.left_out(2)
    [verdict] = emitted
    assert verdict.identical and sorted(verdict.hashes) == [f"replica{r}/rank{k}" for r in (0, 1) for k in (0, 1)]


def test_the_ladder_enters_each_failure_at_the_lowest_rung_that_can_fix_it():
    from monarch_nb.ft.control.groups import Failure
    from monarch_nb.ft.control.ladder import ESCALATES_TO, RUNGS, entry_rung

    def enter(cause=None, lowest="communicator", group_size=1, gone=False, **more):
        config = RunConfig(lowest_rung=lowest, group_size=group_size, **more)
        return entry_rung(Failure("x", 0, 0.0, "trainer", cause=cause), config, gone)

    assert enter("comms") == "communicator" and enter("exception") == "step"
    assert enter(None) == "process"  # a dead or hung process
    assert enter(None, gone=True) == "hosts"  # the scheduler ended its allocation
    assert enter("comms", lowest="process") == "process"  # the reference run's way: replace every process
    assert enter("comms", group_size=2) == "communicator"  # torchft rebuilds every rank's group
    assert enter("exception", group_size=2) == "process"  # its groupmates wait in the step's collectives
    for sync in ("local_sgd", "diloco"):  # torchft's hooks keep the Manager: its communicator is rebuilt
        assert enter("comms", sync=sync) == "communicator" and enter("exception", sync=sync) == "process"
    # and the failure notice says what will happen, for the same reasons
    from monarch_nb.ft.control.ladder import Ladder

    def action(cause="comms", **config):
        return Ladder(types.SimpleNamespace(spares=None, config=RunConfig(**config))).action(cause)

    assert action().startswith("its communicator is rebuilt in place")
    assert action(group_size=2).startswith("its communicator is rebuilt in place")
    assert action("exception", group_size=2).startswith("its group is torn down and replaced")
    assert action(lowest_rung="process").startswith("its group is torn down and replaced")
    assert RUNGS == ("communicator", "step", "process", "hosts", "checkpoint")
    assert ESCALATES_TO["communicator"] == ESCALATES_TO["step"] == "process"
    with pytest.raises(ValueError, match="lowest_rung: unknown value 'hosts'; allowed values: communicator, process"):
        RunConfig(lowest_rung="hosts").validate()


def test_status_names_the_rung_a_recovering_group_is_on():
    from monarch_nb.ft.control.groups import REPAIRING, TRAINING, GroupTable
    from monarch_nb.notebook.html import run_status_html

    table = GroupTable(2)
    g = table.groups[1]
    table.set_state(g, REPAIRING)
    table.set_rung(g, "communicator")
    status = table.status()
    assert status[1]["state"] == "repairing" and status[1]["rung"] == "communicator"
    assert status[0]["rung"] is None  # starting, never failed
    html = run_status_html("r1", status)
    assert ">rung</th>" in html and "communicator" in html
    table.set_state(g, TRAINING)
    assert table.status()[1]["rung"] is None  # back: nothing to say about a rung while it trains


def test_a_semi_sync_meeting_that_heals_a_group_commits_its_step_after_a_failed_meeting_rolled_the_run_back():
    """The DiLoCo flake: the run reported step 60, a meeting failed (the groups went back to 50), a
    new process started with min_step=60 and healed at the meeting repeated at 60; its step 60
    was recorded uncommitted and it "rejoined" at 61, off the meeting."""
    from monarch_nb.ft.worker.train_step import floor_after_meeting

    floor = floor_after_meeting(60, 60, synced=True)
    assert 60 > floor and 61 > floor  # the healed step counts, and the one after
    assert floor_after_meeting(60, 57, synced=None) == 60  # between meetings: still provisional
    assert floor_after_meeting(60, 7, synced=False) == 60  # a failed meeting heals nobody
    assert floor_after_meeting(0, 60, synced=True) == 0  # a group never behind stays unbounded


def test_the_straggler_rule_names_a_slow_group_from_its_own_throughput_and_not_the_noise():
    """Each group's own throughput (its tokens over forward+backward, waits left out): a 2.5x slow
    group is named once its window is full; noise of +-25% on a 2-core box names nobody; back
    at speed it is cleared; a group that left is forgotten."""
    import random

    from monarch_nb.ft.control.stragglers import StragglerWatch
    from monarch_nb.telemetry.events import ReplicaState, Step, StragglerCleared, StragglerDetected

    out, acted = [], []
    watch = StragglerWatch(1.3, 20, "drain", out.append, lambda r, ratio: acted.append((r, ratio)))
    rng = random.Random(7)

    def steps(first, last, slow_factor=1.0):
        for s in range(first, last):
            for r in range(3):
                rate = 1000.0 * rng.uniform(0.75, 1.25) / (slow_factor if r == 1 else 1.0)
                watch.observe(Step(t=float(s), replica=r, step=s, loss=1.0, tokens_per_s=rate, committed=True))

    steps(0, 200)
    assert out == [] and watch.slow() == {}  # no false alarm
    steps(200, 210, slow_factor=2.5)
    assert out == []  # over the rule, not for long enough yet
    steps(210, 228, slow_factor=2.5)  # the median crosses after ~10 slow steps, and stays over for 10
    [named] = out
    assert isinstance(named, StragglerDetected) and named.replica == 1 and named.ratio > 1.3 and named.window == 20
    steps(228, 240, slow_factor=2.5)
    assert out == [named] and watch.slow()[1] > 2.0, watch.slow()  # named once
    import time

    for _ in range(50):
        if acted:
            break
        time.sleep(0.02)
    assert [r for r, _ in acted] == [1]  # the policy got it, once
    steps(240, 280)
    assert isinstance(out[-1], StragglerCleared) and out[-1].replica == 1 and watch.slow() == {}
    steps(280, 320, slow_factor=3.0)
    assert 1 in watch.slow()
    watch.observe(ReplicaState(t=400.0, replica=1, state="retired"))
    assert watch.slow() == {}


def test_a_cluster_fault_is_in_the_log_before_the_failure_the_cluster_reports_while_it_is_sent(tmp_path):
    """The Kubernetes pod watch saw an eviction 10 ms before the eviction call returned; the
    injection, logged after the call, came after the failure and the recovery lost its fault
    (CI: notebook 08's evict counted 'unplanned'). It is logged before the fault is sent."""
    from monarch_nb.ft.control.groups import TRAINING, GroupTable
    from monarch_nb.ft.control.injector import FaultInjector
    from monarch_nb.ft.record.recovery import RecoveryTracker
    from monarch_nb.telemetry.events import FailureDetected

    table = GroupTable(2)
    for g in table:
        g.state = TRAINING
    log: list = []

    def cluster(fault, announce=None):  # the scheduler's watch reports the failure before this returns
        if announce is not None:
            announce(7)
        log.append(FailureDetected(replica=fault.replica, rank=0, reason="POD_EVICTED", detection_s=0.01,
                                   source="supervision"))
        return 7

    injector = FaultInjector(1, table, str(tmp_path / "faults.jsonl"), lambda f: None, cluster, log.append,
                             lambda: True)
    injector.inject("evict", replica=1)
    assert [type(e).__name__ for e in log] == ["FaultInjected", "FailureDetected"]
    recoveries = RecoveryTracker()
    for e in log:
        recoveries.apply(e)
    (rec,) = recoveries.recoveries
    assert rec.fault == "evict" and rec.detection_s == 0.01, rec


def test_an_identity_check_retried_asks_the_groups_training_now_from_where_they_are():
    # Seen on pods: `%monarch check` right after `inject kill`; the dying group's hash_at hung 5 s
    # per attempt while the survivor, alone, ran ahead, and the check landed 70 s later.
    from monarch_nb.ft.control.identity import IdentityChecks

    view = [[(0, 10), (1, 10), (2, 10)], [(1, 500), (2, 501)]]  # group 0 failed during the first attempt
    asked = []

    def ask(replica, step):
        asked.append((replica, step))
        return None if replica == 0 else step > 505

    target = IdentityChecks(group_size=1, emit=lambda e: None).request(lambda: view[min(len(asked) // 3, 1)], ask)
    assert sorted(asked[:3]) == [(0, 13), (1, 13), (2, 13)]
    assert {r for r, _ in asked[3:]} == {1, 2} and target == 501 + 12, (asked, target)
    # with one group left there is nothing to compare: the check says so at once
    alone = [[(0, 10), (1, 10)], [(1, 500)]]
    calls = []
    assert IdentityChecks(1, lambda e: None).request(
        lambda: alone[min(len(calls), 1)], lambda r, s: calls.append(r) or (None if r == 0 else False)) is None
    assert len(calls) == 2


def test_a_rank_that_commits_a_step_after_waiting_for_a_peer_reports_training_with_that_step():
    """A poll between a step's event and the loop's state update read the committed step with
    "waiting_for_peer": the controller then took a group just resumed from a checkpoint for one
    still lost and resumed every group again (test_durable, seen in CI). The state changes with
    the event, under the same lock."""
    import collections
    import threading

    from monarch_nb.ft.worker.trainer_actor import TrainerActor

    rank = types.SimpleNamespace(_lock=threading.Lock(), _seq=0, _events=collections.deque(),
                                 _state="waiting_for_peer")
    TrainerActor._emit(rank, {"kind": "waiting_for_peer", "step": 10})
    TrainerActor._emit(rank, {"kind": "step", "step": 11, "committed": False})
    assert rank._state == "waiting_for_peer", "a step not committed (provisional) does not end the wait"
    TrainerActor._emit(rank, {"kind": "step", "step": 11, "committed": True})
    assert rank._state == "training"
    rank._state = "stalled"
    TrainerActor._emit(rank, {"kind": "step", "step": 12, "committed": True})
    assert rank._state == "stalled", "only the wait ends with a step; a stall is the ladder's to end"


@pytest.mark.parametrize("group_size, later, heals, quiet", [
    (1, False, [], True),
    (2, False, [], False),  # its other ranks still ask rank 0's ManagerServer
    (1, True, [], False),  # a meeting or an async quorum still to come
    (1, False, [2], False),  # a peer heals from it in this quorum
])
def test_a_leaving_group_goes_quiet_at_its_last_quorum_only_where_nothing_needs_its_manager_server(
        group_size, later, heals, quiet):
    from monarch_nb.ft.worker.torchft_replication import may_go_quiet

    q = types.SimpleNamespace(recover_dst_replica_ranks=heals)
    assert may_go_quiet(q, group_size, later) is quiet
    assert may_go_quiet(None, group_size, later) is False
