"""Every private attribute of Monarch, torchft, torchtitan and ipykernel that monarch_nb touches.

Public APIs are used directly everywhere else. What those libraries do not expose - a
ranked reply carrying a remote exception as data, an actor mesh's ranks and name, the pids
of a ProcessJob's hosts, torchft's last quorum result, torchtitan's device globals - is
reached only through the functions below. Each has a test in ``tests/test_seam.py`` that
checks it against the pinned version (torchmonarch 0.7.0, torchft 0.2.0, torchtitan 0.3.0),
so an upgrade that moves one of them fails one clear test instead of degrading silently.

Imports of the libraries are inside the functions: the controller imports this module
without importing torchft or torchtitan, and workers without importing the notebook layer.
"""

from __future__ import annotations

import inspect
import re
import sys
import time
import types
from datetime import timedelta
from typing import Any, Callable

# ---- Monarch (torchmonarch 0.7.0) ------------------------------------------------------------


def open_outcome_channel() -> tuple[Any, Any]:
    """A port for ``monarch.actor.send`` and a receiver whose ``recv()`` resolves to
    ``(rank, ok, value)``: a rank's exception arrives as data, with its rank.

    Monarch's public ``PortReceiver.ranked()`` raises a remote exception and loses which
    rank raised it; the ranked reply's ``kind.rank`` and ``PortReceiver._process`` (which
    decodes one reply) are private.
    """
    from monarch.actor import Channel

    port, receiver = Channel.open()
    return port, _outcome_receiver_class()(receiver._mailbox, receiver._receiver)


_OUTCOME_RECEIVER: list[type] = []  # one class for every call (a class per call is garbage per call)


def _outcome_receiver_class() -> type:
    if not _OUTCOME_RECEIVER:
        from monarch.actor import PortReceiver

        class _OutcomeReceiver(PortReceiver):
            def _process(self, msg: Any) -> tuple[int | None, bool, Any]:
                rank = getattr(msg.kind, "rank", None)
                try:
                    return rank, True, PortReceiver._process(self, msg)
                except Exception as exc:  # the remote exception, delivered as data
                    return rank, False, exc

        _OUTCOME_RECEIVER.append(_OutcomeReceiver)
    return _OUTCOME_RECEIVER[0]


def forget_proc_mesh(proc_mesh: Any) -> None:
    """Drop the controller's own references to a stopped proc mesh and the actor meshes on it.

    Monarch keeps every ProcMesh and ActorMesh a controller ever spawned until the controller
    exits: the client's actor instance holds them in ``_children``, the host mesh they came from
    in ``_proc_meshes`` and ``_pending_spawns``, and a killed (never stopped) mesh its actor
    meshes in ``_pending_actor_spawns``. A kernel that replaces failed processes
    for days would hold every one it ever had (measured: one ActorMesh and ProcMesh per spare).
    """
    from monarch.actor import context

    def ours(obj: Any) -> bool:
        return obj is proc_mesh or getattr(obj, "_proc_mesh", None) is proc_mesh

    spawning = getattr(proc_mesh, "_pending_actor_spawns", None)
    if spawning:  # never drained when the mesh was killed rather than stopped
        spawning.clear()
    children = getattr(context().actor_instance, "_children", None)
    if children:
        children[:] = [c for c in children if not ours(c)]
    host = getattr(proc_mesh, "_host_mesh", None)
    if host is not None:
        meshes = getattr(host, "_proc_meshes", None)
        if meshes:
            meshes[:] = [m for m in meshes if m is not proc_mesh]
        spawns = getattr(host, "_pending_spawns", None)
        if spawns:
            spawns[:] = [t for t in spawns if t is not getattr(proc_mesh, "_proc_mesh", None)]


def actor_mesh_ranks(actors: Any) -> list[int]:
    """The proc-mesh ranks an actor mesh (or a slice of one) covers, in order."""
    return list(actors._ndslice)


def actor_mesh_name(actors: Any) -> str:
    """The name an actor mesh was spawned with (``proc_mesh.spawn(name, ...)``)."""
    return str(actors._mesh_name)


def actor_mesh_class(actors: Any) -> type | None:
    """The Actor subclass an actor mesh runs."""
    return getattr(actors, "_class", None)


def actor_mesh_unique_name(actors: Any, timeout: float = 10.0) -> str:
    """Monarch's unique name for an actor mesh ("trainer-3kEBefMLoHR"); failure reports use it."""
    return str(actors._name.get(timeout=timeout))


_CRASHED = re.compile(r"crashed_ranks=\[([0-9, ]*)\]")


def failure_details(failure: Any) -> tuple[str, list[int], str]:
    """(unique mesh name, crashed ranks, reason text) of a ``MeshFailure``.

    ``mesh_name`` is public; the crashed ranks are only in the text of the report.
    """
    text = str(failure)
    match = _CRASHED.search(text)
    ranks = [int(r) for r in match.group(1).split(",") if r.strip()] if match else []
    return str(getattr(failure, "mesh_name", "") or ""), ranks, text.split("failed:", 1)[-1].strip()


def job_host_pids(job: Any) -> list[int]:
    """Pids of the host processes a local ``ProcessJob`` started (they outlive a SIGKILLed
    controller: they run in their own session, so the reaper must know them)."""
    return [int(state.pid) for state in getattr(job, "_host_to_pid", {}).values() if getattr(state, "pid", 0)]


# The logger Monarch's "blocking get() inside an event loop" notices come from.
TELEMETRY_LOGGER = "monarch._src.actor.telemetry"
# Loggers of Monarch's job launchers: INFO lines ("Submitting SLURM job ...") on every allocation.
JOB_LOGGERS = ("monarch._src.job.slurm", "monarch._src.job.job")

# Where IPython finds Monarch's mesh classes by name (ActorMesh is not exported publicly).
DISPLAY_TYPES = {
    "ValueMesh": ("monarch._src.actor.actor_mesh", "ValueMesh"),
    "ProcMesh": ("monarch._src.actor.proc_mesh", "ProcMesh"),
    "ActorMesh": ("monarch._src.actor.actor_mesh", "ActorMesh"),
}


# ---- torchft (0.2.0) -------------------------------------------------------------------------


class QuorumRecorder:
    """Stands in for a Manager's ``_client`` (a ``ManagerClient``) to keep the last
    ``_quorum`` result: membership and heal source, which the Manager does not expose."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.last: Any = None

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self._client._quorum(*args, **kwargs)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def record_quorums(manager: Any) -> QuorumRecorder:
    recorder = QuorumRecorder(manager._client)
    manager._client = recorder
    return recorder


def manager_state_dict(manager: Any) -> Callable[[], Any]:
    """The state a torchft Manager serves to a healing peer (its private ``_manager_state_dict``:
    the user's state and torchft's own, under the Manager's read lock), as a callable: read only
    when a peer asks."""
    return manager._manager_state_dict


def commit_failures(manager: Any) -> int:
    """How many steps in a row a torchft Manager failed to commit (its private
    ``_commit_failures``): sent with its next quorum request, where a count above zero makes
    the Lighthouse give that quorum a new id, so every member builds a fresh process group."""
    return int(manager._commit_failures)


def count_commit_failure(manager: Any) -> None:
    """Count one failed commit on a torchft Manager, as its own ``should_commit`` does when a
    collective failed: its next quorum request then asks the Lighthouse for a new quorum id, and
    every member rebuilds its process group (a semi-synchronous group whose communicator died
    between meetings, where no collective failed yet). Its next successful commit resets it."""
    manager._commit_failures += 1


def semi_sync_training(ft_config: Any, manager: Any, model: Any, optimizers: Any, fragment_fn: Any) -> Any:
    """torchtitan's ``maybe_semi_sync_training`` around a torchft Manager of ours: it reads the
    Manager from its own wrapper's private ``_manager``, so it gets a holder with just that."""
    from types import SimpleNamespace

    from torchtitan.experiments.torchft.manager import maybe_semi_sync_training

    return maybe_semi_sync_training(ft_config, SimpleNamespace(_manager=manager), model, len(model.layers),
                                    optimizers, fragment_fn=fragment_fn)


def semi_sync_local_steps(algorithm: Any) -> int:
    """Steps a torchft LocalSGD / DiLoCo took since its last meeting (its private counter)."""
    return int(algorithm._local_step)


def set_semi_sync_local_steps(algorithm: Any, steps: int) -> None:
    """Set that counter: a group restored from a durable checkpoint goes on where it was saved."""
    algorithm._local_step = int(steps)


def diloco_fragments(algorithm: Any) -> list[tuple[dict[str, Any], Any]]:
    """Each torchft DiLoCo fragment's parameters the groups last agreed on and its outer optimizer
    (private ``_fragments``, ``original_parameters``, ``_outer_optimizer``); none under LocalSGD."""
    return [(f.original_parameters, f._outer_optimizer) for f in getattr(algorithm, "_fragments", [])]


def process_group_is_down(ft_pg: Any) -> bool:
    """A torchft ProcessGroup whose inner group was aborted and not rebuilt."""
    return getattr(ft_pg, "_pg", True) is None


def set_collective_timeout(ft_pg: Any, timeout: timedelta) -> None:
    """Set the collective timeout of the gloo group inside a torchft ``ProcessGroupGloo``, once
    built: torchft builds it with one timeout for connecting and for collectives (what torch's
    own ``_set_pg_timeout`` does, on torchft's inner group)."""
    import torch

    inner = getattr(ft_pg, "_pg", None)
    if inner is not None:
        inner._get_backend(torch.device("cpu"))._set_default_timeout(timeout)


def http_transport_port(transport: Any) -> int:
    """The port torchft's ``HTTPTransport`` checkpoint server listens on."""
    return int(transport._server.socket.getsockname()[1])


def close_http_transport(transport: Any) -> None:
    """Stop torchft's ``HTTPTransport`` checkpoint server and close its socket. Its own
    ``shutdown(wait=False)`` sets a flag name-mangled for the wrong class, so the server keeps
    listening and serving: one socket and thread left per Manager. No-op for other transports."""
    server, thread = getattr(transport, "_server", None), getattr(transport, "_thread", None)
    if server is None:
        return
    if thread is not None and thread.is_alive():
        server.shutdown()  # returns once serve_forever has stopped (it polls every 0.5 s)
        thread.join(timeout=5)
    server.server_close()


def silence_manager(manager: Any) -> bool:
    """Stop a Manager's ManagerServer (group rank 0), and so its heartbeats to the Lighthouse,
    keeping its process group: the rest of ``Manager.shutdown`` happens later. Whether it did."""
    server = getattr(manager, "_manager", None)
    if server is not None:
        server.shutdown()
    return server is not None


def shutdown_manager(manager: Any) -> None:
    """Shut a torchft Manager down without waiting for its executor, closing its checkpoint
    server too (see ``close_http_transport``). Its ManagerServer (group rank 0 only) stops
    first: ``Manager.shutdown`` stops it only after the transport, so a transport that fails
    to stop would leave it heartbeating to the Lighthouse for good."""
    silence_manager(manager)
    manager.shutdown(wait=False)
    close_http_transport(manager._checkpoint_transport)


GHOST_MARGIN_S = 0.2  # a heartbeat in flight when the server stopped, and the Lighthouse's tick


def retire_manager(manager: Any, heartbeat_timeout: timedelta) -> float:
    """Shut a Manager down before a new one of the same group joins; returns the seconds waited.
    torchft 0.2.0's Lighthouse keeps a quorum request as a participant after its caller gave up
    (a quorum timeout), and counts it while the Manager's last heartbeat is younger than
    ``heartbeat_timeout``: a new Manager of the group asking within that window gets a quorum
    with the ghost of its predecessor (participants [1, 1]), whose process group never forms;
    on a slow host each group then pairs with its own ghost, timeout after timeout. Waiting out
    the heartbeat timeout after the old server stopped makes the ghost unhealthy first."""
    stopped = time.monotonic()
    try:
        shutdown_manager(manager)
    except Exception:  # noqa: BLE001 - a half-stopped transport must not keep the group out
        pass
    left = heartbeat_timeout.total_seconds() + GHOST_MARGIN_S - (time.monotonic() - stopped)
    if left > 0:
        time.sleep(left)
    return time.monotonic() - stopped



# ---- torchtitan (0.3.0) ----------------------------------------------------------------------


def set_torchtitan_device(device_type: str) -> None:
    """torchtitan reads the device type from module globals set at import ("cuda" by
    default); point them at ours before building the model or the parallel dims."""
    import torch
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type = device_type
    tt_utils.device_module = getattr(torch, device_type)
    parallel_dims.device_type = device_type


# What a worker imports of torchtitan, at once, while torch.compile is deferred (import_torchtitan).
TORCHTITAN_MODULES = ("torchtitan.models.common", "torchtitan.models.llama3", "torchtitan.distributed",
                      "torchtitan.config", "torchtitan.components.loss", "torchtitan.components.optimizer")


class _CompiledOnFirstCall:
    """What ``torch.compile(fn, **options)`` returns while deferred: compiles on its first call."""

    def __init__(self, compile_: Callable[..., Any], fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self._compile, self._fn, self._options = compile_, fn, options
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            self._compiled = self._compile(self._fn, **self._options)
        return self._compiled(*args, **kwargs)


def import_torchtitan() -> None:
    """Import the torchtitan modules a rank uses. torchtitan 0.3.0 calls ``torch.compile`` at
    import time (flex attention, block masks), which imports torch._inductor; Llama 3 with sdpa
    never calls them. While these modules import, ``torch.compile`` returns a wrapper that
    compiles on its first call, which keeps ~0.5 s of CPU (of ~3.5 s) off every worker's start:
    a run's start and every replaced process (the recovery ladder's process rung)."""
    import importlib

    import torch

    if all(name in sys.modules for name in TORCHTITAN_MODULES):
        return
    real = torch.compile

    def deferred(fn: Any = None, **options: Any) -> Any:
        if fn is None:  # @torch.compile(mode=...) as a decorator factory
            return lambda f: _CompiledOnFirstCall(real, f, options)
        return _CompiledOnFirstCall(real, fn, options)

    torch.compile = deferred  # type: ignore[assignment]
    try:
        for name in TORCHTITAN_MODULES:
            importlib.import_module(name)
    finally:
        torch.compile = real  # type: ignore[assignment]


TRITON_KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


def stub_triton_kernels() -> bool:
    """torchtitan 0.3.0 imports Triton MoE kernels at import time (via models.common);
    Llama 3 never calls them. Where Triton is absent, register a stand-in module that fails
    only if used. Returns True when the stand-in was installed."""
    if TRITON_KERNELS_MODULE in sys.modules:
        return False
    try:
        import triton  # noqa: F401

        return False
    except ImportError:
        pass
    stub = types.ModuleType(TRITON_KERNELS_MODULE)
    stub.__file__ = "<monarch_nb stub: triton unavailable>"

    def _unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Triton kernels are unavailable on this platform (no triton installed)")

    def _getattr(attr: str) -> Callable[..., Any]:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _unavailable

    stub.__getattr__ = _getattr  # type: ignore[attr-defined]
    sys.modules[TRITON_KERNELS_MODULE] = stub
    return True



# ---- Monarch's SlurmJob on SLURM 22.05 (Debian 12) ---------------------------------------------

# Terminal job states SlurmJob does not list (NODE_FAIL: a node went down under the job).
_MORE_TERMINAL_STATES = {"NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE"}


def _normalize_squeue_job(job: dict[str, Any]) -> dict[str, Any]:
    """One job of SLURM 22.05's ``squeue --json`` in the shape SlurmJob reads: ``job_state`` a
    list (22.05: a string), ``job_resources.nodes.allocation[i].name`` (22.05: a hostlist string
    in ``nodes`` and the names in ``allocated_nodes[i].nodename``)."""
    job = dict(job)
    state = job.get("job_state")
    states = [state] if isinstance(state, str) else list(state or [])
    if _MORE_TERMINAL_STATES.intersection(states):
        states.append("FAILED")
    job["job_state"] = states
    resources = job.get("job_resources") or {}
    if not isinstance(resources.get("nodes"), dict):
        allocation = [{"name": n["nodename"]} for n in resources.get("allocated_nodes") or []]
        job["job_resources"] = dict(resources, nodes={"allocation": allocation})
    return job


def slurm_job(**kwargs: Any) -> Any:
    """Monarch's ``SlurmJob`` whose private ``_get_job_info_json`` reads our job (22.05's
    ``squeue --json`` ignores ``--job`` and lists every job it remembers, oldest first; SlurmJob
    takes the first) in the shape SlurmJob expects. Works on newer SLURM's shape too."""
    import json
    import subprocess

    from monarch.job import SlurmJob

    class _SlurmJob(SlurmJob):
        def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
            try:
                out = subprocess.run(["squeue", "--job", str(job_id), "--json"], capture_output=True, text=True,
                                     check=True, timeout=30).stdout
                jobs = json.loads(out).get("jobs", []) if out.strip() else []
            except (subprocess.SubprocessError, json.JSONDecodeError):
                return None
            return next((_normalize_squeue_job(j) for j in jobs if str(j.get("job_id")) == str(job_id)), None)

    return _SlurmJob(**kwargs)


def slurm_job_id(job: Any) -> str | None:
    """The id ``sbatch`` gave a SlurmJob's allocation."""
    return getattr(job, "_slurm_job_id", None)


def rebind_http_transport(transport: Any, host: str) -> None:
    """Make torchft's ``HTTPTransport`` checkpoint server listen on ``host`` only (it binds every
    interface, ``("", 0)``, with no option): its request handler is moved to a new server on
    ``host`` and the original one is shut down. Used for runs whose peers are all on this
    machine, so a heal server is not reachable from the network."""
    import threading
    from http.server import ThreadingHTTPServer

    class _Server(ThreadingHTTPServer):
        request_queue_size = 1024  # as torchft's own server

    old = transport._server
    transport._server = _Server((host, 0), old.RequestHandlerClass)
    old.shutdown()
    old.server_close()
    transport._thread.join(timeout=5)
    transport._thread = threading.Thread(target=transport._serve, daemon=True)
    transport._thread.start()


def manager_server_port(manager: Any) -> int | None:
    """The port of a torchft Manager's own server (rank 0 of a group only; it binds ``[::]``)."""
    server = getattr(manager, "_manager", None)
    return int(server.address().rsplit(":", 1)[1]) if server is not None else None


def show_interrupts_in_one_line(shell: Any, types: tuple[type, ...]) -> None:
    """IPython shows an exception of ``types`` as one ``KeyboardInterrupt: message`` line (the
    cell still ends in error, so "Run all" stops there) instead of a traceback through the
    magic's frames. ``set_custom_exc`` is public; ``_showtraceback`` is the hook ipykernel
    overrides to send the error to the frontend."""

    def one_line(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
        stb = [f"KeyboardInterrupt: {value}"]
        shell._showtraceback(KeyboardInterrupt, value, stb)
        return stb

    shell.set_custom_exc(types, one_line)


def call_before_kernel_shutdown(kernel: Any, release: Callable[[bool], None]) -> None:
    """Call ``release(restart)`` when ipykernel is asked to shut down or restart, before it
    SIGTERMs the children of its process group: its ``shutdown_request`` calls ``do_shutdown``
    (the override point) first and ``_at_shutdown`` (which signals the children) after. The
    instance's ``do_shutdown`` is wrapped; ipykernel 7's IPythonKernel answers it at once, its
    base class awaits it."""
    if kernel is None or getattr(kernel, "_monarch_nb_release", False):
        return
    shutdown = kernel.do_shutdown

    async def do_shutdown(restart: bool) -> Any:
        release(restart)
        reply = shutdown(restart)
        return await reply if inspect.isawaitable(reply) else reply

    kernel.do_shutdown = do_shutdown
    kernel._monarch_nb_release = True


def actor_debug_controller() -> Callable[[], Any]:
    """Call in an endpoint: a function that, from any thread, returns the ``DebugController`` of
    the client that spawned this actor (Monarch's ``debug_controller()`` asks the calling
    context's controller registry: from a plain thread of a worker that is the worker's own, so
    each worker spawned a controller of its own and the second could not bind the debug port).
    ``_controller_controller`` is private."""
    from monarch.actor import context
    from monarch._src.actor.debugger.debug_controller import DebugController
    from monarch._src.actor.sync_state import fake_sync_state

    registry = context().actor_instance._controller_controller

    def get() -> Any:
        with fake_sync_state():
            return registry.get_or_spawn.call_one(registry, "debug_controller", DebugController).get()

    return get


def cell_pdb(rank: int, coords: dict[str, int], actor_id: Any, controller: Any,
             on_stop: Callable[[Any], None]) -> Any:
    """Monarch's own remote pdb for code that runs outside any endpoint (a ``%%monarch`` cell's
    thread): the ``PdbWrapper`` that Monarch's ``breakpoint()`` hook builds, driven by the
    ``DebugController`` in the client process (``monarch debug``'s TCP protocol). The hook
    reads rank and actor from the endpoint's context, which a cell thread does not have, so
    they are given here (``controller`` from :func:`actor_debug_controller`). ``on_stop(frame)``
    is called when it stops for commands and ``on_stop(None)`` when it goes on. ``PdbWrapper``
    is private to Monarch."""
    from monarch._src.actor.debugger.pdb_wrapper import PdbWrapper

    class CellPdb(PdbWrapper):
        def interaction(self, frame: Any, tb: Any) -> None:
            on_stop(frame)
            try:
                super().interaction(frame, tb)
            finally:
                on_stop(None)

    return CellPdb(rank, coords, actor_id, controller)


def is_monarch_breakpointhook(hook: Any) -> bool:
    """Whether ``hook`` is the one Monarch's worker bootstrap installs (``remote_breakpointhook``)."""
    return getattr(hook, "__module__", "") == "monarch._src.actor.debugger.breakpoint"


def actor_breakpoint(frame: Any) -> None:
    """What Monarch's ``remote_breakpointhook`` does, stopping at ``frame``: that hook stops at
    its caller's frame, which is ours when we dispatch to it (an endpoint's ``breakpoint()``
    would stop in our hook). ``DebugContext`` and ``PdbWrapper`` are private."""
    from monarch.actor import context, debug_controller
    from monarch._src.actor.actor_mesh import DebugContext
    from monarch._src.actor.debugger.pdb_wrapper import PdbWrapper

    ctx = context()
    rank = ctx.message_rank
    pdb = PdbWrapper(rank.rank, {k: rank[k] for k in rank}, ctx.actor_instance.actor_id, debug_controller())
    DebugContext.set(DebugContext(pdb))
    pdb.set_trace(frame)


def actor_name(actor_id: Any) -> str:
    """The name Monarch's debugger lists an actor's sessions under (``ActorId.actor_name``)."""
    return str(actor_id.actor_name)


def debug_server_address() -> tuple[str, int]:
    """Where Monarch's debug server (its ``DebugController``, in the client process) listens:
    ``MONARCH_DEBUG_SERVER_HOST``/``_PORT``, default localhost:27000. The readers are private
    to ``monarch.tools.debug_env``."""
    from monarch.tools import debug_env

    return debug_env._get_debug_server_host(), int(debug_env._get_debug_server_port())


def start_debug_server() -> None:
    """Spawn Monarch's ``DebugController`` here (once per process) so its server listens; a
    rank's first ``breakpoint()`` would spawn it too."""
    from monarch.actor import debug_controller

    debug_controller()
