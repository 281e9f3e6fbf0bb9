"""An idle controller holding ``--meshes`` one-process meshes: how fast its RSS grows with
nothing but Monarch's supervision polling them (the mesh controllers in the client check every
actor and proc mesh each ``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY``, and keep a little of
each check). Measured 2026-12-02, 4 meshes, one Echo actor mesh each beside the session's agent,
RSS after malloc_trim: 33 KB/s per mesh at 300ms (monarch_nb's default), 12 at 1s, 2.6 at 10s
(Monarch's default); Monarch alone (no session, no agent) 20 KB/s per mesh at 300ms. The
setting is read at import: run once per value.

Usage: HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY=300ms python bench/supervision_growth.py [--meshes 4]
       [--seconds 60] [--plain] [--actors 1] [--out FILE.json (a record is added to its "records")]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import monarch_nb  # noqa: E402,F401
import psutil  # noqa: E402
from monarch.actor import Actor, endpoint, this_host  # noqa: E402

from monarch_nb.session import Session  # noqa: E402


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def rss_mb() -> float:
    ctypes.CDLL(None).malloc_trim(0)
    return psutil.Process().memory_info().rss / 2**20


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--meshes", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--plain", action="store_true", help="Monarch alone: this_host().spawn_procs, no session")
    p.add_argument("--actors", type=int, default=1, help="actor meshes per proc mesh")
    p.add_argument("--out", help="JSON file to add this measurement's record to")
    a = p.parse_args()
    session = Session()
    keep = []
    try:
        for i in range(a.meshes):
            if a.plain:
                procs = this_host().spawn_procs(per_host={"gpus": 1})
                keep.append(procs)
                for j in range(a.actors):
                    procs.spawn(f"echo{i}_{j}", Echo).ping.call(1).get()
            else:
                session.up(f"m{i}", procs=1)
                for j in range(a.actors):
                    session.spawn(f"echo{i}_{j}", Echo, mesh=f"m{i}")
        time.sleep(5)  # settle before measuring
        t0, samples = time.time(), []
        while time.time() - t0 < a.seconds:
            samples.append((time.time() - t0, rss_mb()))
            time.sleep(5)  # the sampling interval
        slope = statistics.linear_regression([t for t, _ in samples], [m for _, m in samples]).slope
        poll = os.environ.get("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY")
        print(f"poll={poll} meshes={a.meshes} "
              f"plain={a.plain} actors={a.actors}: RSS {samples[0][1]:.1f} -> {samples[-1][1]:.1f} MB, "
              f"{slope * 3600:.0f} MB/h, {slope * 1024 / max(1, a.meshes):.1f} KB/s per mesh", flush=True)
        if a.out:
            out = Path(a.out)
            result = json.loads(out.read_text()) if out.exists() else {"records": []}
            result["records"].append({"poll": poll, "meshes": a.meshes, "plain": a.plain, "actors": a.actors,
                                      "seconds": a.seconds, "rss_mb": [[round(t, 1), round(m, 2)] for t, m in samples],
                                      "mb_per_hour": round(slope * 3600, 1),
                                      "kb_per_s_per_mesh": round(slope * 1024 / max(1, a.meshes), 2)})
            out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        for procs in keep:
            procs.stop().get()
        session.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
