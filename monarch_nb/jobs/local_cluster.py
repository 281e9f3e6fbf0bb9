"""The one-machine SLURM cluster of ``scripts/slurm_cluster.sh``, from Python (tests, benchmarks).

``up(netns=True)`` puts every virtual node in a network namespace of its own with rate-limited
links (mnb0: the node's address; mnb1: a second network); :func:`link_bytes` reads how many
bytes each node has sent on each link, from the counters of its rate limiter (``tc -s qdisc``),
which is how a test or benchmark tells which link carried a heal.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_cluster.sh"
LINKS = ("mnb0", "mnb1")
# This machine's address on each node network of --netns mode (the script's NET_PREFIXES + ".1").
CONTROLLER_ADDRS = ("10.77.0.1", "10.78.0.1")
NAMESPACE_PREFIX = "mnb-"


@dataclass(frozen=True)
class ClusterMode:
    """How the cluster runs: one namespace, or a namespace per node with links of ``link_rate``."""

    netns: bool
    link_rate: str | None
    nodes: int


def _slurm_dir() -> Path:
    return Path(os.environ.get("MONARCH_NB_SLURM_DIR", "/var/tmp/monarch_nb_slurm"))


def mode() -> ClusterMode:
    """The mode the cluster was last brought up in (the script records it)."""
    marker = _slurm_dir() / "run" / "netns"
    rate = marker.read_text().strip() if marker.exists() else None
    conf = Path("/etc/slurm/slurm.conf")
    nodes = sum(line.startswith("NodeName=") for line in conf.read_text().splitlines()) if conf.exists() else 0
    return ClusterMode(netns=rate is not None, link_rate=rate, nodes=nodes)


def up(netns: bool = False, link_rate: str = "2gbit", nodes: int = 2) -> subprocess.CompletedProcess:
    """``scripts/slurm_cluster.sh up`` in the given mode (restarts the daemons if it changed)."""
    args = [str(SCRIPT), "up"] + (["--netns", "--link-rate", link_rate] if netns else [])
    env = {**os.environ, "MONARCH_NB_SLURM_NETNS": "0", "MONARCH_NB_SLURM_NODES": str(nodes)}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


def restore(before: ClusterMode) -> subprocess.CompletedProcess:
    return up(before.netns, before.link_rate or "2gbit", before.nodes or 2)


def link_bytes() -> dict[tuple[str, str], int]:
    """{(node, link): bytes the node has sent on that link} over every node namespace (one
    ``tc`` call per node: a benchmark reads it every few tenths of a second)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    out = {}
    for ns in (line.split()[0] for line in listed.splitlines() if line.startswith(NAMESPACE_PREFIX)):
        shown = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"],
                               capture_output=True, text=True, check=True).stdout
        for q in json.loads(shown):
            if q.get("kind") == "tbf" and q.get("dev") in LINKS:
                out[(ns.removeprefix(NAMESPACE_PREFIX), q["dev"])] = int(q["bytes"])
    return out
