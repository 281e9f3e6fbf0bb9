"""Replica groups on separate Monarch "hosts" (ProcessJob), each sharded with FSDP over two
processes: a broken communicator on one rank is rebuilt in place; a crash of one rank takes its
group down and back up, the group heals every shard from its peer, and shard-by-shard hashes
agree afterwards."""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import (FailureDetected, Healed, Rejoined, Repaired, ReplicasIdentical, Respawned,
                                         RungStarted, Step)
from helpers.proc_checks import assert_gone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    run = FTRun(RunConfig(replicas=2, group_size=2, job="process", runs_root=str(tmp_path_factory.mktemp("ft_hosts"))))
    try:
        run.start()
        run.wait_for_step(3, timeout=240)
        host_pids = run.placement.extra_pids()
        # Which ProcessJob host process each group's workers descend from.
        run.hosts_of_groups = {g.index: {_host_ancestor(pid, host_pids) for pid in g.pids} for g in run.groups}
        comms_since = time.time()
        run.inject("comms", replica=0, rank=1)
        back = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 0, timeout=120, since=comms_since)
        run.comms = comms_since, back, time.time()  # (the rejoin may precede the controller's events)
        since = time.time()
        run.inject("exit", replica=1, rank=1)
        rejoined = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == 1, timeout=240, since=since)
        identical = run.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.t >= rejoined.t, timeout=120)
    finally:
        run.stop()
    return run, since, rejoined, identical


def _host_ancestor(pid: int, host_pids: list[int]) -> int | None:
    import psutil

    for parent in psutil.Process(pid).parents():
        if parent.pid in host_pids:
            return parent.pid
    return None


def test_groups_run_on_separate_hosts(sharded_run):
    run = sharded_run[0]
    hosts = run.hosts_of_groups
    assert len(hosts[0]) == len(hosts[1]) == 1 and None not in hosts[0] | hosts[1], hosts
    assert hosts[0] != hosts[1], "each group must run under its own ProcessJob host"
    steps = [e for e in run.events.events(Step) if e.committed and e.participants == 2]
    assert {e.replica for e in steps} == {0, 1}, "both groups must have trained together"


def test_a_comms_fault_on_one_rank_of_a_sharded_group_is_repaired_in_place(sharded_run):
    """The ``communicator`` rung for a group of several ranks: torchft's error path fails the
    step's commit on every rank of every group and the next quorum rebuilds each rank's process
    group; the group's ranks retry the step alike (FSDP gathers in its compute). Nothing replaced,
    nothing healed; the identity check after the crash below covers both faults."""
    run = sharded_run[0]
    since, back, until = run.comms
    window = [e for e in run.events.events() if since <= e.t <= until]
    assert {e.replica for e in window if isinstance(e, FailureDetected)} == {0}
    assert [e.rung for e in window if isinstance(e, RungStarted)] == ["communicator"]
    assert not [e for e in window if isinstance(e, (Respawned, Healed))]
    (repaired,) = [e for e in window if isinstance(e, Repaired)]
    assert repaired.at_once and repaired.kept_member, repaired
    assert back.t - since < 10, back  # a replaced group of two ranks takes ~28 s here


def test_crash_of_one_rank_respawns_the_group_and_heals_every_shard(sharded_run):
    run, since, rejoined, identical = sharded_run
    (respawned,) = [e for e in run.events.events(Respawned) if e.t >= since]
    (healed,) = [e for e in run.events.events(Healed) if e.t >= since]
    assert respawned.replica == healed.replica == 1 and healed.source_replica == 0
    assert healed.bytes > 1_000_000
    assert identical.identical, identical.hashes
    assert set(identical.hashes) == {"replica0/rank0", "replica0/rank1", "replica1/rank0", "replica1/rank1"}
    # FSDP: each rank holds a different shard, so ranks differ while replicas agree.
    assert identical.hashes["replica0/rank0"] != identical.hashes["replica0/rank1"]


def test_every_rank_of_every_group_has_a_log_file_with_its_own_lines(sharded_run):
    run = sharded_run[0]
    names = sorted(p.name for p in run.log_dir.glob("*.log"))
    assert names == ["replica0-rank0.log", "replica0-rank1.log", "replica1-rank0.log", "replica1-rank1.log"], names
    for name in names:
        mesh, rank = name[:-4].split("-rank")
        text = (run.log_dir / name).read_text()
        assert text.count(f"[{mesh} rank {rank}]") >= 5, (name, text[:2000])
        assert f"[{mesh} rank {int(rank) ^ 1}]" not in text  # only its own lines
    # the crashed rank's group was respawned: its new processes wrote on in the same files
    # (at least twice: a loaded CI box may need another attempt to bring the group back)
    assert (run.log_dir / "replica1-rank1.log").read_text().count("writes here as replica1 rank 1") >= 2
    view = run.logs(1, tail=0)
    assert view.lines and all(ln.where[0][0] == "replica1" for ln in view.lines)


def test_no_orphans_after_stop(sharded_run):
    run = sharded_run[0]
    assert_gone(run.spawned_pids + [run.lighthouse_pid], timeout=15)
