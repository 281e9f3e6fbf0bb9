"""Every private attribute of Monarch, torchft and torchtitan that monarch_nb touches, checked
against the pinned versions: each test exercises one function of ``monarch_nb.seam`` on the
real library and asserts it does what the rest of the package relies on. An upgrade that moves
one of them fails here, by name, instead of degrading silently elsewhere."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
from datetime import timedelta

import pytest
from monarch.actor import Actor, current_rank, endpoint

from monarch_nb import _runtime, seam
from monarch_nb.calls import receive
from helpers.proc_checks import assert_gone, wait_for


class Echo(Actor):
    @endpoint
    def rank_or_raise(self, bad: int) -> int:
        if current_rank().rank == bad:
            raise ValueError(f"rank {bad} raised")
        return current_rank().rank


# ---- Monarch -----------------------------------------------------------------------------------


def test_outcome_channel_delivers_each_ranks_value_or_exception_with_its_rank(session):
    session.up("main", procs=3)
    echo = session.spawn("echo", Echo)
    outcomes = {rank: (ok, value) for rank, ok, value in receive(echo.rank_or_raise, (1,), {}, 3, 30.0)}
    assert set(outcomes) == {0, 1, 2}
    assert outcomes[0] == (True, 0) and outcomes[2] == (True, 2)
    ok, err = outcomes[1]
    assert not ok and "rank 1 raised" in str(err)


def test_actor_mesh_ranks_name_class_and_unique_name(session):
    session.up("main", procs=3)
    echo = session.spawn("echo", Echo)
    assert seam.actor_mesh_ranks(echo) == [0, 1, 2]
    assert seam.actor_mesh_ranks(echo.slice(gpus=slice(1, 3))) == [1, 2]
    assert seam.actor_mesh_name(echo) == "echo"
    assert seam.actor_mesh_class(echo) is Echo
    unique = seam.actor_mesh_unique_name(echo)
    assert unique.startswith("echo-") and len(unique) > len("echo-")


def test_mesh_failure_names_the_actor_mesh_and_the_crashed_rank(session):
    mesh = session.up("main", procs=2)
    echo = session.spawn("echo", Echo)
    unique = seam.actor_mesh_unique_name(echo)
    seen = []
    remove = _runtime.add_fault_listener(lambda failure: seen.append(seam.failure_details(failure)))
    try:
        os.kill(mesh.procs[1].pid, signal.SIGKILL)
        ours = wait_for(lambda: [d for d in seen if d[0] == unique], 15, "a MeshFailure for the echo mesh")
    finally:
        remove()
    name, ranks, reason = ours[0]
    assert ranks == [1] and "sig" in reason.lower()


def test_process_job_exposes_the_pids_of_its_host_processes():
    from monarch.job import ProcessJob

    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    pids = seam.job_host_pids(job)
    try:
        assert len(pids) == 2 and all(wait_for(lambda p=p: os.path.exists(f"/proc/{p}"), 5, "host") for p in pids)
    finally:
        job.kill()
    assert_gone(pids)


def test_display_types_name_monarchs_mesh_classes():
    for name, (module, cls) in seam.DISPLAY_TYPES.items():
        assert getattr(importlib.import_module(module), cls).__name__ == name


# ---- torchft ----------------------------------------------------------------------------------


@pytest.fixture
def manager():
    """A real torchft Manager (rank 0 of a one-process group) against a real Lighthouse."""
    import torchft
    from torch.distributed import TCPStore

    from monarch_nb.ft.control.lighthouse import Lighthouse

    lighthouse = Lighthouse().start()
    store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=10))
    mgr = torchft.Manager(pg=pg, load_state_dict=lambda s: None, state_dict=lambda: {}, min_replica_size=1,
                          use_async_quorum=False, timeout=timedelta(seconds=10), rank=0, world_size=1,
                          store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=lighthouse.address,
                          replica_id="replica_0", hostname="127.0.0.1", init_sync=False)
    try:
        yield mgr, pg
    finally:
        seam.shutdown_manager(mgr)
        lighthouse.stop()


def _group_one_manager(lighthouse_address: str, store_port: int):
    import torchft

    return torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=5)), load_state_dict=lambda s: None,
                           state_dict=lambda: {}, min_replica_size=1, use_async_quorum=False,
                           timeout=timedelta(seconds=5), quorum_timeout=timedelta(seconds=1), rank=0, world_size=1,
                           store_addr="127.0.0.1", store_port=store_port, lighthouse_addr=lighthouse_address,
                           replica_id="replica_1", hostname="127.0.0.1", init_sync=False)


@pytest.mark.parametrize("retire", [False, True], ids=["shutdown_only_leaves_a_ghost", "retire_leaves_none"])
def test_a_rebuilt_manager_never_gets_a_quorum_with_its_predecessors_ghost(retire):
    """The quorum-timeout wedge: a Manager whose quorum timed out is replaced. With a plain
    shutdown, torchft's Lighthouse pairs the new Manager with the old one's request (both
    replica 1, a quorum whose process group never forms); ``retire_manager`` waits until the
    old one's heartbeat is stale, and the new one is alone (here: no quorum, two are needed).
    The first case pins torchft's behaviour: when it fails, the wait may go."""
    from torch.distributed import TCPStore

    from monarch_nb.ft.control.lighthouse import Lighthouse, LighthouseSettings

    heartbeat = timedelta(seconds=2)  # longer than building the new Manager takes
    lighthouse = Lighthouse(LighthouseSettings(min_replicas=2, join_timeout_ms=100,
                                               heartbeat_timeout_ms=int(heartbeat.total_seconds() * 1000))).start()
    store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    old = _group_one_manager(lighthouse.address, store.port)
    new = None
    try:
        with pytest.raises(TimeoutError):
            old.start_quorum()  # one group of the two the Lighthouse needs
        if retire:
            assert seam.retire_manager(old, heartbeat) >= heartbeat.total_seconds()
        else:
            seam.shutdown_manager(old)
        new = _group_one_manager(lighthouse.address, store.port)
        recorder = seam.record_quorums(new)
        if retire:
            with pytest.raises(TimeoutError):
                new.start_quorum()
            assert recorder.last is None
        else:
            new.start_quorum()
            ids = list(recorder.last.replica_ids)
            assert len(ids) == 2 and all(i.startswith("replica_1:") for i in ids), ids
    finally:
        for m in (old, new):
            if m is not None:
                seam.shutdown_manager(m)
        lighthouse.stop()
        del store  # its listener closes with it (a caught TimeoutError's traceback holds this frame)


def test_quorum_recorder_keeps_the_managers_last_quorum_result(manager):
    mgr, pg = manager
    recorder = seam.record_quorums(mgr)
    mgr.start_quorum()
    q = recorder.last
    assert q is not None and q.quorum_id >= 1
    assert list(q.replica_ids)[0].startswith("replica_0") and q.recover_src_replica_rank is None
    assert not seam.process_group_is_down(pg)
    pg.abort()
    assert seam.process_group_is_down(pg)


def test_the_lighthouse_process_serves_quorums_without_loading_torch(manager):
    """torchft's package imports torch: a Lighthouse started through it held 367 MB. Ours loads
    only torchft's extension (lighthouse_server.py): no libtorch mapped, and it serves the quorum
    the fixture's Manager just formed through it."""
    import psutil

    mgr, pg = manager
    recorder = seam.record_quorums(mgr)
    mgr.start_quorum()
    pg.abort()  # the quorum configured it; nothing else will use it
    assert recorder.last is not None and recorder.last.quorum_id >= 1
    lighthouse = next(c for c in psutil.Process().children() if "lighthouse_server.py" in " ".join(c.cmdline()))
    maps = {m.path for m in lighthouse.memory_maps()}
    assert not [m for m in maps if "libtorch" in m], "the Lighthouse process loaded torch"
    assert any("_torchft" in m for m in maps)


def test_http_transport_port_is_where_its_checkpoint_server_listens():
    import socket

    from torchft.checkpointing.http_transport import HTTPTransport

    transport = HTTPTransport(timeout=timedelta(seconds=5), num_chunks=0)
    try:
        port = seam.http_transport_port(transport)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        seam.close_http_transport(transport)
    # closed for real (torchft's own shutdown(wait=False) leaves it listening and serving)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert not transport._thread.is_alive()


# ---- torchtitan -------------------------------------------------------------------------------


def test_torchtitan_device_globals_follow_ours():
    seam.stub_triton_kernels()
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.tools.utils as tt_utils

    seam.set_torchtitan_device("cpu")
    assert tt_utils.device_type == "cpu" and parallel_dims.device_type == "cpu"


def test_triton_stub_stands_for_the_module_torchtitan_imports():
    import torch

    assert importlib.util.find_spec("torchtitan.distributed.minimal_async_ep") is not None
    seam.stub_triton_kernels()
    from torchtitan.models.common import ScaledDotProductAttention  # the import that needs it

    # the inner attention the trainer swaps in for CPU runs forward and backward here
    attention = ScaledDotProductAttention(ScaledDotProductAttention.Config())
    q, k, v = (torch.randn(1, 4, 2, 8, requires_grad=True) for _ in range(3))  # (batch, seq, heads, head dim)
    out = attention(q, k, v)
    assert out.shape == q.shape
    assert torch.allclose(out[:, 0], v[:, 0]), "causal: the first position attends to itself only"
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_torchtitan_imports_without_compiling_what_llama3_never_calls():
    import subprocess

    code = ("import sys, torch; from monarch_nb import seam; real = torch.compile; seam.stub_triton_kernels(); "
            "seam.import_torchtitan(); from torchtitan.models.common.attention import FlexAttention; "
            "print(torch.compile is real, 'torch._inductor.compile_fx' in sys.modules, "
            "type(FlexAttention._compiled_flex_attn).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "_CompiledOnFirstCall"], out.stdout + out.stderr[-2000:]
    # what torch.compile returned while deferred compiles at its first call, once
    compiled: list[tuple] = []

    def compile_(fn, **options):
        compiled.append((fn, options))
        return lambda x: fn(x) * 10

    wrapped = seam._CompiledOnFirstCall(compile_, lambda x: x + 1, {"mode": "max-autotune"})
    assert compiled == [] and wrapped(1) == 20 and wrapped(2) == 30 and len(compiled) == 1
    assert compiled[0][1] == {"mode": "max-autotune"}


def test_blocking_get_notices_come_from_the_named_logger_and_the_kernel_drops_them():
    import logging

    from monarch._src.actor.telemetry import log_with_tracing  # what Monarch's Future.get() calls

    from monarch_nb.notebook.extension import quiet_blocking_get

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(seam.TELEMETRY_LOGGER)
    handler = Keep()
    logger.addHandler(handler)
    try:
        log_with_tracing(logging.WARNING, "probe from monarch_nb's seam test")
        quiet_blocking_get()
        log_with_tracing(logging.WARNING, "Future.get() called from within an active event loop")
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1 and records[0].endswith("probe from monarch_nb's seam test"), records


# ---- Monarch's SlurmJob on SLURM 22.05 ---------------------------------------------------------


@pytest.mark.slurm
def test_slurm_job_reads_our_job_from_squeue_json_among_others(slurm_cluster):
    import subprocess

    from monarch.job import SlurmJob

    assert callable(getattr(SlurmJob, "_get_job_info_json", None))  # the method we override
    ids = [subprocess.run(["sbatch", "--parsable", "-J", "monarch_nb-seam-test", "-o", "/dev/null", "--wrap", "sleep 60"],
                          capture_output=True, text=True, check=True).stdout.strip() for _ in range(2)]
    try:
        job = seam.slurm_job(meshes={"hosts": 1})
        wait_for(lambda: job._get_job_info_json(ids[1]) and "RUNNING" in job._get_job_info_json(ids[1])["job_state"],
                 30, "the second job to run")
        info = job._get_job_info_json(ids[1])
        assert str(info["job_id"]) == ids[1]  # not the first job squeue lists
        assert [n["name"] for n in info["job_resources"]["nodes"]["allocation"]][0] in ("n1", "n2")
        assert seam.slurm_job_id(job) is None  # not applied: no job of its own
    finally:
        subprocess.run(["scancel", *ids])
    # job_state is a list, as SlurmJob's terminal-state checks expect (22.05 gives a string)
    wait_for(lambda: "CANCELLED" in (job._get_job_info_json(ids[0]) or {}).get("job_state", []), 15,
             "squeue to list the first job as CANCELLED")


def test_squeue_22_05_job_shape_is_mapped_to_what_slurm_job_reads():
    job = {"job_id": 7, "job_state": "NODE_FAIL", "job_resources": {"nodes": "n[1-2]", "allocated_nodes": [
        {"nodename": "n1"}, {"nodename": "n2"}]}}
    out = seam._normalize_squeue_job(job)
    assert out["job_state"] == ["NODE_FAIL", "FAILED"]  # terminal for SlurmJob too
    assert out["job_resources"]["nodes"] == {"allocation": [{"name": "n1"}, {"name": "n2"}]}
    newer = {"job_id": 8, "job_state": ["RUNNING"], "job_resources": {"nodes": {"allocation": [{"name": "a"}]}}}
    assert seam._normalize_squeue_job(newer)["job_resources"] == newer["job_resources"]


def test_http_transport_rebound_to_loopback_still_serves_a_checkpoint():
    import torch
    from torchft.checkpointing.http_transport import HTTPTransport

    sender = HTTPTransport(timeout=timedelta(seconds=10), num_chunks=0)
    receiver = HTTPTransport(timeout=timedelta(seconds=10), num_chunks=0)
    try:
        seam.rebind_http_transport(sender, "127.0.0.1")
        assert sender._server.server_address[0] == "127.0.0.1"
        state = {"w": torch.arange(6.0)}
        sender.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=timedelta(seconds=10))
        got = receiver.recv_checkpoint(src_rank=0, metadata=sender.metadata(), step=7, timeout=timedelta(seconds=10))
        assert torch.equal(got["w"], state["w"])
    finally:
        seam.close_http_transport(sender)
        seam.close_http_transport(receiver)


def test_manager_server_port_names_the_port_of_the_managers_own_server(manager):
    import socket

    mgr, _ = manager
    port = seam.manager_server_port(mgr)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_our_interrupts_show_as_one_line_through_ipython_s_custom_exception_hook():
    """seam.show_interrupts_in_one_line: IPython's set_custom_exc + _showtraceback (the hook
    ipykernel overrides to send the error): the cell fails with one line, no traceback."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from monarch_nb.errors import Interrupted
    from monarch_nb.seam import show_interrupts_in_one_line

    shell = InteractiveShell.instance()
    show_interrupts_in_one_line(shell, (Interrupted,))
    try:
        shell.user_ns["Interrupted"] = Interrupted
        with capture_output() as cap:
            result = shell.run_cell("def deep():\n    raise Interrupted('stopped waiting')\ndeep()")
        assert isinstance(result.error_in_exec, Interrupted)
        assert cap.stdout.strip() == "KeyboardInterrupt: stopped waiting", cap.stdout
        with capture_output() as cap:  # anything else keeps its full traceback
            shell.run_cell("raise KeyboardInterrupt('plain')")
        assert "Traceback" in cap.stdout or "---" in cap.stdout
    finally:
        shell.set_custom_exc((), None)


def test_a_kernel_shutdown_calls_our_release_before_ipykernel_signals_its_children():
    """seam.call_before_kernel_shutdown: ipykernel's shutdown_request calls do_shutdown before
    _at_shutdown, which SIGTERMs the kernel's children; the wrapped do_shutdown of a real (in-process)
    IPythonKernel calls the release, then answers as before. In an interpreter of its own: an
    in-process kernel makes IPython's shell and ipykernel's kernel singletons of the process it runs
    in, which the suite's own shell and widgets must not meet. The whole path: tests/test_kernel.py."""
    import json
    import subprocess
    import textwrap

    script = textwrap.dedent("""
        import asyncio, inspect, json
        from ipykernel.inprocess.manager import InProcessKernelManager
        from ipykernel.kernelbase import Kernel
        from monarch_nb import seam

        source = inspect.getsource(Kernel.shutdown_request)
        order = source.index("self.do_shutdown(") < source.index("self._at_shutdown()")
        signals = "_progressively_terminate_all_children" in inspect.getsource(Kernel._at_shutdown)
        km = InProcessKernelManager()
        km.start_kernel()
        calls = []
        seam.call_before_kernel_shutdown(km.kernel, calls.append)
        seam.call_before_kernel_shutdown(km.kernel, calls.append)  # once per kernel
        reply = asyncio.run(km.kernel.do_shutdown(True))
        km.shutdown_kernel()
        print(json.dumps({"order": order, "signals": signals, "calls": calls,
                          "status": reply["status"], "restart": reply["restart"]}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"order": True, "signals": True, "calls": [True], "status": "ok", "restart": True}, seen


def test_monarchs_debugger_pieces_that_live_breakpoints_use_are_where_we_look(monkeypatch):
    """Live breakpoints (agent.py, live_debug.py) build Monarch's own remote pdb for a cell's thread
    and reach its debug server; the real path runs in tests/test_kernel_interactive.py."""
    import inspect

    from monarch._src.actor.actor_mesh import DebugContext
    from monarch._src.actor.debugger import breakpoint as monarch_breakpoint
    from monarch._src.actor.debugger.pdb_wrapper import PdbWrapper
    from monarch._src.actor.proc_mesh import get_or_spawn_controller

    assert seam.is_monarch_breakpointhook(monarch_breakpoint.remote_breakpointhook)
    assert not seam.is_monarch_breakpointhook(sys.__breakpointhook__)
    for name in ("set_trace", "interaction", "clear_all_breaks", "end_debug_session"):
        assert callable(getattr(PdbWrapper, name)), name
    assert callable(DebugContext.set)
    assert "_controller_controller" in inspect.getsource(get_or_spawn_controller)  # actor_debug_controller
    monkeypatch.setenv("MONARCH_DEBUG_SERVER_PORT", "27123")
    monkeypatch.setenv("MONARCH_DEBUG_SERVER_HOST", "127.0.0.1")
    assert seam.debug_server_address() == ("127.0.0.1", 27123)

    class ActorId:
        actor_name = "nb_agent_main"

    assert seam.actor_name(ActorId()) == "nb_agent_main"
