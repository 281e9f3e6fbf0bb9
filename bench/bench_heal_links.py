"""A striped heal from k donors over rate-limited links (issue: heal at the machine's limit;
target: with k donors on rate-limited links, a speed-up of at least 0.7 x k over one donor).

On the SLURM cluster whose nodes have networks of their own (``scripts/slurm_cluster.sh up
--netns``): max(k) + 1 nodes, each in its own network namespace, what each sends limited to
``--link-rate`` by tc (a node's uplink: what a donor pays). For each k, a run of R = k + 1 groups,
one per node (the partition spreads them, least loaded first); the last group is killed and heals
from the k others at once (bench_heal.py's ``heal``: join_timeout_ms=10000 so every survivor is in
the victim's quorum). The rate limiters' byte counters (``tc -s qdisc``) say what each node sent
on which link while the heal ran (``sent_gb``), so the JSON shows the donors' shares too.

It brings the cluster up in that mode and, at the end, back in the mode it found it (unless
``--keep``); `up` restarts the SLURM daemons when the mode changes (a few seconds).

Each record: ``{"path": "heal_links", "donors": k, "size_gb", "gbps", "seconds", "speedup",
"per_donor_efficiency", "link_rate", "link_gbps", "sent_gb": {"node/link": GB}, "nodes"}``;
``speedup`` is gbps over the one-donor heal's in the same invocation; ``donors`` is how many
served the heal (``survivors`` = k were up: one left out of the victim's quorum would show here).

Usage: python bench/bench_heal_links.py [--donors 1,2,3] [--link-rate 1gbit] [--size 0.35] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_heal import heal  # noqa: E402

from monarch_nb.jobs import local_cluster  # noqa: E402

UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def link_gbps(rate: str) -> float:
    """GB/s of a tc rate such as "1gbit"."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
    if not m:
        raise SystemExit(f"--link-rate: {rate!r} is not a rate like 1gbit or 500mbit")
    return float(m.group(1)) * UNITS[m.group(2)] / 8 / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--donors", default="1,2,3", help="donor counts k, comma-separated (1 first: the reference)")
    p.add_argument("--link-rate", default="1gbit", help="what each node may send, as tc says it")
    p.add_argument("--size", type=float, default=0.35, help="GB of state (the nearest model flavour)")
    p.add_argument("--keep", action="store_true", help="leave the cluster in netns mode afterwards")
    p.add_argument("--out")
    a = p.parse_args(argv)
    ks = sorted({int(k) for k in a.donors.split(",")})
    rate = link_gbps(a.link_rate)
    before = local_cluster.mode()
    up = local_cluster.up(netns=True, link_rate=a.link_rate, nodes=max(ks) + 1)
    if up.returncode != 0:
        raise SystemExit(f"the netns cluster did not come up:\n{up.stderr[-2000:]}")
    records = []
    try:
        for k in ks:
            r = heal("heal_links", a.size, k + 1, "striped", counters=local_cluster.link_bytes, job="slurm")
            counted = r.pop("counted")
            r.update(survivors=k, link_rate=a.link_rate, link_gbps=rate,
                     sent_gb={f"{node}/{link}": round(v / 1e9, 4) for (node, link), v in sorted(counted.items())})
            records.append(r)
    finally:
        if not a.keep:
            local_cluster.restore(before)
    one = next((r["gbps"] for r in records if r["donors"] == 1), None)
    for r in records:
        r["speedup"] = r["gbps"] / one if one else None
        r["per_donor_efficiency"] = r["speedup"] / r["donors"] if one else None
        print(f"k={r['donors']}  {r['gbps']:.3f} GB/s  ({r['gbps'] / rate:.0%} of one link)  "
              f"speed-up {r['speedup'] or 0:.2f} = {r['per_donor_efficiency'] or 0:.2f} x k", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"link_rate": a.link_rate, "link_gbps": rate, "records": records,
                                           "argv": list(argv if argv is not None else sys.argv[1:])}, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
