"""bench/bench_cost_parts.py measures what it says, with real processes: a TCPStore, a gloo
process group, a torchft Lighthouse quorum and DCP reads, by R processes at once; and its JSON
composes through costmodel (what bench/seed_clusters.py does with it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lab.costmodel import Parts, compose

REPO = Path(__file__).resolve().parent.parent


def test_every_part_is_measured_at_every_r_by_that_many_processes(tmp_path):
    out = tmp_path / "parts.json"
    done = subprocess.run([sys.executable, str(REPO / "bench/bench_cost_parts.py"), "--groups", "1,2",
                           "--rounds", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    seen = {(r["part"], r["groups"]) for r in result["parts"]}
    assert seen == {(p, g) for p in ("store", "process_group", "quorum_steady", "dcp_read") for g in (1, 2)}
    for r in result["parts"]:
        assert 0 < r["wall_s"] < 60 and r["cpu_s"] >= 0, r
    reads = [r for r in result["parts"] if r["part"] == "dcp_read"]
    # each of the R processes read the whole state: R times the checkpoint's bytes
    assert {r["groups"]: r["bytes_read"] for r in reads} == {1: result["state_bytes"], 2: 2 * result["state_bytes"]}
    assert "alone" not in result  # only with --alone
    result["alone"] = {"tiny": {"peer": {"wall_s": 5.0, "cpu_s": 4.0}, "restart": {"wall_s": 4.0, "cpu_s": 4.0}}}
    parts = Parts.from_json(result)
    assert compose(parts, 2)["rendezvous_s"] >= 0 and compose(parts, 2, cores=1)["restart_wall_s"] >= 8.0
