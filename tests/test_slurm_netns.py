"""The SLURM cluster whose nodes have networks of their own (`scripts/slurm_cluster.sh up --netns`).

Each virtual node runs in its own network namespace with two rate-limited links, mnb0 (its
address: SLURM, Monarch, the collectives) and mnb1 (a second network). A run there must work as on
a real cluster (workers reach the controller, the Lighthouse and each other by address, not over
one shared loopback), and ``RunConfig(heal_interface="mnb1")`` must move a heal's bytes over mnb1:
the byte counters of the nodes' rate limiters (``tc -s qdisc``) say which link carried them.
"""

import time

import pytest

from monarch_nb.jobs import local_cluster
from monarch_nb.telemetry.events import Healed

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


def test_a_heal_goes_over_the_interface_it_names(netns_cluster, tmp_path):
    from monarch_nb.ft import FTRun, RunConfig

    run = FTRun(RunConfig(replicas=2, job="slurm", heal_interface="mnb1", runs_root=str(tmp_path)))
    try:
        run.start()
        run.wait_for_step(3, timeout=180)
        nodes = {g.index: run.session.mesh(g.name).allocation.nodes[0] for g in run.groups}
        assert nodes[0] != nodes[1], f"the groups share a node: {nodes}"
        before, since = local_cluster.link_bytes(), time.time()
        run.inject("kill", replica=1)
        healed = run.wait_for(lambda e: isinstance(e, Healed) and e.replica == 1 and e.cause == "recovery",
                              timeout=180, since=since)
        after = local_cluster.link_bytes()
        victim_node = run.session.mesh("replica1").allocation.nodes[0]
    finally:
        run.stop()
    sent = {key: after[key] - before.get(key, 0) for key in after}
    donor = nodes[0]
    assert healed.donors == [0] and healed.bytes > 10e6, healed
    assert victim_node != donor, f"the victim came back on its donor's node {donor}: the heal never left it"
    # every byte of the state left the donor over mnb1; its mnb0 carried only heartbeats and telemetry
    assert sent[(donor, "mnb1")] >= healed.bytes, (sent, healed.bytes)
    assert sent[(donor, "mnb0")] < healed.bytes / 10, (sent, healed.bytes)
    # the run's own traffic (gradients, quorum, Monarch) used mnb0, the node's address
    assert sum(v for (node, link), v in sent.items() if link == "mnb0") > 0, sent
