"""The controller on real Monarch worker processes (no kernel involved)."""

import os
import signal
import time

import pytest
from monarch.actor import Actor, current_rank, endpoint

from monarch_nb import CallTimeout, MonarchNbError, RemoteError, UnknownMeshError
from monarch_nb.telemetry.events import WorkerExitReported, WorkerFailed

from helpers.proc_checks import assert_gone, wait_for


class Worker(Actor):
    def __init__(self, offset: int = 0):
        self.offset = offset

    @endpoint
    def rank_plus(self, x: int) -> int:
        return current_rank().rank + x + self.offset

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def slow_on(self, slow_rank: int, seconds: float) -> int:
        if current_rank().rank == slow_rank:
            time.sleep(seconds)
        return current_rank().rank

    @endpoint
    def hold_gil_on(self, rank: int, seconds: float) -> None:
        if current_rank().rank == rank:
            from monarch_nb.ft.worker.fault_firing import hold_gil

            hold_gil(seconds)

    @endpoint
    def fail_on(self, bad_rank: int) -> str:
        if current_rank().rank == bad_rank:
            raise ValueError(f"rank {bad_rank} refuses")
        return "ok"


def test_spawn_returns_a_real_actor_mesh_with_monarch_adverbs(session):
    mesh = session.up("main", procs=3)
    assert mesh.shape == {"gpus": 3} and mesh.state == "healthy"
    assert all(p.pid and p.host for p in mesh.procs)
    workers = session.spawn("workers", Worker, 10)
    assert type(workers).__name__ == "ActorMesh"
    values = workers.rank_plus.call(1).get(timeout=30)
    assert sorted(v for _, v in values.items()) == [11, 12, 13]
    assert workers.slice(gpus=2).rank_plus.call_one(0).get(timeout=30) == 10  # slice-local rank 0
    assert workers.rank_plus.choose(0).get(timeout=30) in (10, 11, 12)
    assert sorted(f.get(timeout=30) for f in workers.rank_plus.stream(0)) == [10, 11, 12]
    assert session.actors("workers") is workers


def test_deadline_call_returns_per_rank_values_in_global_ranks(session):
    session.up("main", procs=4)
    workers = session.spawn("workers", Worker)
    result = session.deadline(workers.slice(gpus=slice(2, 4)), 10).pid.call()
    assert result.ranks == [2, 3] and set(result.values) == {2, 3}
    assert result.values[2] == session.mesh("main").procs[2].pid


def test_a_call_past_its_deadline_names_the_silent_ranks(session):
    session.up("main", procs=3)
    workers = session.spawn("workers", Worker)
    started = time.monotonic()
    with pytest.raises(CallTimeout) as err:
        session.deadline(workers, 3.0).slow_on.call(1, 60.0)
    took = time.monotonic() - started
    assert took < 30, f"the call took {took:.1f} s: it waited for rank 1's 60 s instead of its 3 s deadline"
    assert err.value.missing_ranks == [1]
    assert set(err.value.partial) == {0, 2}
    assert "ranks [1] did not answer within 3 s" in str(err.value)
    assert session.events.events("call_timed_out")[-1].missing_ranks == [1]


def test_an_exception_on_some_ranks_keeps_the_others_results(session):
    session.up("main", procs=3)
    workers = session.spawn("workers", Worker)
    with pytest.raises(RemoteError) as err:
        session.deadline(workers, 10).fail_on.call(2)
    assert set(err.value.errors) == {2} and err.value.results == {0: "ok", 1: "ok"}
    assert "rank 2 refuses" in str(err.value)
    # the actor survived its exception
    assert session.deadline(workers, 10).fail_on.call(-1).values == {0: "ok", 1: "ok", 2: "ok"}


def test_a_killed_worker_is_detected_within_seconds_and_the_rest_stay_usable(session):
    mesh = session.up("main", procs=3)
    workers = session.spawn("workers", Worker)
    seen: list[tuple[float, WorkerFailed]] = []
    session.on_failure(lambda ev: seen.append((time.monotonic(), ev)))
    pid = mesh.procs[1].pid
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: seen, 10, "the failure event")
    detected_after = seen[0][0] - killed_at
    # the session's watcher checks pids 4 times a second; Monarch's supervision poll (10 s) would
    # take up to ~10 s: 5 s is 20x the watcher's worst
    assert detected_after < 5.0, f"kill -> failure event took {detected_after:.2f} s"
    event = seen[0][1]
    assert isinstance(event, WorkerFailed) and (event.mesh, event.rank) == ("main", 1)
    assert event.reason.startswith(f"process {pid} of rank 1 ") and event.reason.endswith("(found by pid check)")
    # Monarch's account of how it ended comes at its next poll, as the explanation, not a second failure
    wait_for(lambda: [e for _, e in seen if isinstance(e, WorkerExitReported)], 25, "Monarch's account")
    assert "Killed" in next(e for _, e in seen if isinstance(e, WorkerExitReported)).reason
    assert len([e for _, e in seen if e.rank == 1 and isinstance(e, WorkerFailed)]) == 1, \
        "one failure must be reported once"
    assert mesh.state == "degraded" and mesh.failed_ranks == [1]
    assert session.events.events("worker_failed")[0].rank == 1
    with pytest.raises(CallTimeout) as err:
        session.deadline(workers, 2).pid.call()
    assert err.value.missing_ranks == [1] and err.value.failed_ranks == [1]
    assert session.deadline(workers.slice(gpus=0), 10).pid.call().ok


def test_a_failure_found_by_our_own_check_is_reported_once_with_its_cause_and_a_stop_is_no_failure(session):
    mesh = session.up("main", procs=2)
    session.spawn("workers", Worker)
    mesh.failure_action = "the owner replaces it"
    seen = []
    session.on_failure(seen.append)
    pid = mesh.procs[1].pid
    assert session.report_failure("main", 1, "SIGKILL sent by a test")
    assert not session.report_failure("main", 1, "reported again"), "a rank is reported failed once"
    os.kill(pid, signal.SIGKILL)
    assert_gone([pid])
    wait_for(lambda: [e for e in seen if isinstance(e, WorkerExitReported)], 25, "Monarch's account of the death")
    failed = [e for e in seen if isinstance(e, WorkerFailed)]
    assert [(e.mesh, e.rank, e.reason, e.action) for e in failed] == \
        [("main", 1, "SIGKILL sent by a test", "the owner replaces it")]
    assert "Killed" in next(e for e in seen if isinstance(e, WorkerExitReported)).reason
    session.down("main", kill=True)  # our own kill of rank 0: Monarch reports it, never as a failure
    assert [e for e in seen if isinstance(e, WorkerFailed)] == failed
    assert session.events.events(WorkerFailed) == failed


def test_an_exception_escaping_an_actor_is_reported_as_a_failure(session):
    session.up("main", procs=2)
    workers = session.spawn("workers", Worker)
    seen = []
    session.on_failure(seen.append)
    workers.fail_on.broadcast(0)  # no reply port: Monarch fails the actor on an exception
    wait_for(lambda: seen, 10, "the actor failure")
    assert seen[0].rank == 0 and "rank 0 refuses" in seen[0].reason


def test_replace_starts_a_fresh_mesh_and_respawns_its_actors(session):
    mesh = session.up("main", procs=2)
    session.spawn("workers", Worker, 100)
    old_pids = [p.pid for p in mesh.procs]
    os.kill(old_pids[0], signal.SIGKILL)
    wait_for(lambda: mesh.failed_ranks, 10, "the failure")
    fresh = session.replace("main")
    assert fresh.state == "healthy" and not set(p.pid for p in fresh.procs) & set(old_pids)
    assert_gone(old_pids)
    workers = session.actors("workers")
    assert sorted(session.deadline(workers, 20).rank_plus.call(0).values.values()) == [100, 101]


def test_down_with_kill_does_not_wait_on_a_hung_worker(session):
    mesh = session.up("main", procs=2)
    workers = session.spawn("workers", Worker)
    pids = [p.pid for p in mesh.procs]
    workers.hold_gil_on.broadcast(1, 60.0)  # rank 1's interpreter is frozen for a minute
    with pytest.raises(CallTimeout):  # rank 1 really is hung
        session.deadline(workers, 2).pid.call()
    started = time.monotonic()
    session.down("main", kill=True)
    assert_gone(pids, timeout=5)
    took = time.monotonic() - started
    # a kill teardown takes ~0.1 s; 6 s is a sanity bound, far from the 60 s the hang lasts
    assert took < 6.0, f"down(kill=True) of a mesh with a hung rank took {took:.1f} s"


def test_multi_host_mesh_through_process_job(session):
    mesh = session.up("cluster", procs=2, hosts=2)
    assert mesh.shape == {"hosts": 2, "gpus": 2}
    assert [p.coords for p in mesh.procs][2] == {"hosts": 1, "gpus": 0}
    workers = session.spawn("workers", Worker)
    result = session.deadline(workers.slice(hosts=1), 20).pid.call()
    assert result.ranks == [2, 3]
    host_pids = mesh.allocation.pids()
    pids = [p.pid for p in mesh.procs] + host_pids
    session.down("cluster")
    assert_gone(pids)


def test_bad_names_and_unknown_meshes_get_clear_errors(session):
    with pytest.raises(UnknownMeshError, match="known meshes: none"):
        session.mesh("nope")
    session.up("main", procs=1)
    with pytest.raises(UnknownMeshError, match="no mesh named 'other'; known meshes: main"):
        session.spawn("w", Worker, mesh="other")
    with pytest.raises(MonarchNbError, match="already up"):
        session.up("main", procs=1)
    with pytest.raises(ValueError, match="procs must be a positive integer"):
        session.up("x", procs=0)
    with pytest.raises(ValueError, match="not valid"):
        session.up("1bad", procs=1)
    session.spawn("w", Worker)
    with pytest.raises(MonarchNbError, match="already exists"):
        session.spawn("w", Worker)


def test_shutdown_leaves_no_worker_and_later_use_says_so(session):
    mesh = session.up("main", procs=2)
    pids = [p.pid for p in mesh.procs]
    session.shutdown()
    assert_gone(pids)
    with pytest.raises(MonarchNbError, match="shut down"):
        session.up("main")


def test_a_downed_mesh_leaves_nothing_of_it_in_the_controller(session):
    """Monarch holds every mesh a controller spawned until the controller exits; a kernel that
    replaces failed groups for days must not (seam.forget_proc_mesh)."""
    import gc

    def alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o).__name__ in ("ActorMesh", "ProcMesh"))

    session.up("churn0", procs=1)
    session.spawn("w", Worker, mesh="churn0")
    session.down("churn0")
    before = alive()
    for i in range(1, 4):
        session.up(f"churn{i}", procs=1)
        session.spawn("w", Worker, mesh=f"churn{i}")
        session.down(f"churn{i}", kill=i == 3)  # a polite stop, and a kill
    assert alive() == before


def test_a_late_report_is_placed_on_a_mesh_only_by_the_unique_name_of_its_actor_mesh(tmp_path):
    """Monarch's supervision reports lag (it polls every 10 s): a report about a previous run's
    "trainer1" once landed on the next run's same-named mesh while Monarch had not yet named its
    new actor mesh, and failed that run's start (notebook 07). Unit level: the lookup alone."""
    import types

    from monarch_nb.mesh_lifecycle import MeshLifecycle
    from monarch_nb.reaper import Reaper
    from monarch_nb.telemetry import EventStore

    meshes = MeshLifecycle(events=EventStore(), reaper=Reaper(), log_dir=tmp_path, on_up=lambda: None,
                           on_down=lambda names: None)
    new = types.SimpleNamespace(name="replica1", actor_full_names={})
    meshes._meshes["replica1"], meshes._actor_owner["trainer1"] = new, "replica1"
    assert meshes.holder_of("trainer1-old") is None  # the new actor mesh not named yet: not its report
    new.actor_full_names["trainer1"] = "trainer1-new"
    assert meshes.holder_of("trainer1-old") is None  # an actor mesh replaced since
    assert meshes.holder_of("trainer1-new") is new
