"""The SLURM cluster whose nodes have networks of their own (`scripts/slurm_cluster.sh up --netns`).

Each virtual node runs in its own network namespace with two rate-limited links, mnb0 (its
address: SLURM, Monarch, the collectives) and mnb1 (a second network). A run there must work as on
a real cluster (workers reach the controller, the Lighthouse and each other by address, not over
one shared loopback), and ``RunConfig(heal_interface="mnb1")`` must move a heal's bytes over mnb1:
the byte counters of the nodes' rate limiters (``tc -s qdisc``) say which link carried them.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_nb.jobs import local_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def netns_cluster(slurm_cluster):
    """The suite's cluster, switched to one network namespace per node for this module and back
    to the mode it was in afterwards."""
    before = local_cluster.mode()
    up = local_cluster.up(netns=True, link_rate=before.link_rate or "2gbit", nodes=max(2, before.nodes))
    if up.returncode != 0 and "CAP_NET_ADMIN" in up.stderr:
        local_cluster.restore(before)
        pytest.skip(f"this machine cannot make network namespaces: {up.stderr.strip()[-300:]}")
    assert up.returncode == 0, up.stderr[-2000:]
    yield
    back = local_cluster.restore(before)
    assert back.returncode == 0, back.stderr[-2000:]


# The run goes in a fresh process: Monarch's client keeps the address of the first TCP transport
# it used, and earlier SLURM tests in this process used the one-namespace cluster's loopback one,
# which workers in a namespace of their own cannot reach (an attach then times out). A kernel
# switching cluster modes needs a restart for the same reason (README).
RUN = """
import json, sys, threading, time
from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.jobs import local_cluster
from monarch_nb.telemetry.events import Healed

# quorum="sync": the heal is done before the next forward pass, so no training traffic (which
# goes over mnb0) falls between the kill and the Healed event this window is measured over; under
# the async quorum the healed group's first allreduce runs beside its heal
run = FTRun(RunConfig(replicas=2, job="slurm", heal_interface=sys.argv[1] or None, runs_root=sys.argv[2],
                      quorum="sync"))
try:
    run.start()
    run.wait_for_step(3, timeout=180)
    nodes = {g.index: run.session.mesh(g.name).allocation.nodes[0] for g in run.groups}
    # the counters are sampled all along: the window ends at the first sample after the heal
    # ended in the worker (its event's t), not when the controller heard of it - the group's
    # first allreduces (~40 MB on mnb0) fell between the two on a loaded box (CI)
    samples, done = [], threading.Event()

    def sample():  # every 50 ms: a reading is ~4 subprocesses, not to be spun on 2 cores
        while not done.wait(0.05):
            samples.append((time.time(), local_cluster.link_bytes()))

    sampler = threading.Thread(target=sample, daemon=True)
    before, since = local_cluster.link_bytes(), time.time()
    sampler.start()
    run.inject("kill", replica=1)
    healed = run.wait_for(lambda e: isinstance(e, Healed) and e.replica == 1 and e.cause == "recovery",
                          timeout=180, since=since)
    done.set()
    sampler.join()
    # none after it when the event came within a sampling period: a reading now (a wider window)
    after = next((b for t, b in samples if t >= healed.t), None) or local_cluster.link_bytes()
    victim_node = run.session.mesh("replica1").allocation.nodes[0]
finally:
    run.stop()
print(json.dumps({"nodes": nodes, "victim_node": victim_node, "donors": healed.donors, "bytes": healed.bytes,
                  "sent": {f"{n}/{link}": v - before.get((n, link), 0) for (n, link), v in after.items()}}))
"""


def heal_on_netns(heal_interface: str | None, runs_root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN, heal_interface or "", str(runs_root)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_heal_goes_over_the_interface_it_names(netns_cluster, tmp_path):
    got = heal_on_netns("mnb1", tmp_path)
    sent, donor, size = got["sent"], got["nodes"]["0"], got["bytes"]
    assert got["nodes"]["0"] != got["nodes"]["1"], f"the groups share a node: {got['nodes']}"
    assert got["donors"] == [0] and size > 10e6, got
    assert got["victim_node"] != donor, f"the victim came back on its donor's node {donor}: the heal never left it"
    # every byte of the state left the donor over mnb1; its mnb0 carried less than half of one state
    # (heartbeats, polls and logs over the recovery: 1-9 MB seen against a 74 MB state)
    assert sent[f"{donor}/mnb1"] >= size, (sent, size)
    assert sent[f"{donor}/mnb0"] < size / 2, (sent, size)
    # the run's own traffic (gradients, quorum, Monarch) used mnb0, the node's address
    assert sum(v for key, v in sent.items() if key.endswith("/mnb0")) > 0, sent
