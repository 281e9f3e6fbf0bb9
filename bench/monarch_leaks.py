"""What a controller's memory keeps for good of each mesh it replaces and each actor call it
makes, measured inside Monarch and through monarch_nb, side by side in one invocation.

A long fault-tolerant run does both all the time: every recovered fault is a mesh cycle (the
failed group's mesh stops, a new one starts), and the supervisor polls every group several
times a second. What they leave behind is the floor of the controller's memory slope.

  mesh_monarch   Monarch alone: ``this_host().spawn_procs``, one call, ``ProcMesh.stop``
  mesh_session   monarch_nb's ``Session.up`` / ``down`` (which drops Monarch's own references
                 to a stopped mesh, ``seam.forget_proc_mesh``)
  call_monarch   ``actor.endpoint.call().get()`` on a live one-process mesh
  call_session   ``session.deadline(actor).endpoint.call()`` (the supervisor's path)
For each: the RSS growth per unit after a warm-up, fitted by least squares, and for the meshes
how many ActorMesh / ProcMesh Python objects are still alive at the end.

Usage: python bench/monarch_leaks.py [--cycles 40] [--calls 10000] [--out bench/results/monarch_leaks.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import monarch_nb  # noqa: E402,F401  (first: Monarch's supervision settings)
import psutil  # noqa: E402
from monarch.actor import Actor, endpoint, this_host  # noqa: E402

from monarch_nb.session import Session  # noqa: E402


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def meshes_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ in ("ActorMesh", "ProcMesh"))


def slope(samples: list[float]) -> float:
    """Least-squares growth per step of ``samples``."""
    return statistics.linear_regression(range(len(samples)), samples).slope


def monarch_cycle(i: int, _: Session) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    procs.spawn(f"echo{i}", Echo).ping.call(1).get()
    procs.stop().get()


def session_cycle(i: int, session: Session) -> None:
    session.up(f"churn{i}", procs=1)
    session.spawn("echo", Echo, mesh=f"churn{i}").ping.call(1).get()
    session.down(f"churn{i}")


def measure_meshes(path: str, cycle, session: Session, cycles: int, warmup: int) -> dict:
    alive0 = meshes_alive()
    samples = []
    for i in range(cycles):
        cycle(i, session)
        gc.collect()
        samples.append(rss_mb())
    record = {"path": path, "units": cycles, "unit": "mesh", "rss_mb": [round(x, 1) for x in samples],
              "kb_per_unit": round(1024 * slope(samples[warmup:]), 1),
              "meshes_alive_after": meshes_alive() - alive0}
    print(f"{path:13} {record['kb_per_unit']:.0f} KB per mesh, {record['meshes_alive_after']} meshes still alive",
          flush=True)
    return record


def measure_calls(path: str, call, calls: int) -> dict:
    for _ in range(calls // 10):  # warm-up
        call()
    samples = []
    for i in range(calls):
        call()
        if i % 500 == 0:
            samples.append(rss_mb())
    record = {"path": path, "units": calls, "unit": "call", "rss_mb": [round(x, 1) for x in samples],
              "kb_per_unit": round(1024 * slope(samples) / 500, 3)}
    print(f"{path:13} {record['kb_per_unit']:.2f} KB per call", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--out")
    a = p.parse_args(argv)
    session = Session()
    try:
        records = [measure_meshes("mesh_monarch", monarch_cycle, session, a.cycles, a.warmup),
                   measure_meshes("mesh_session", session_cycle, session, a.cycles, a.warmup)]
        session.up("calls", procs=1)
        actor = session.spawn("echo", Echo, mesh="calls")
        records += [measure_calls("call_monarch", lambda: actor.ping.call(1).get(), a.calls),
                    measure_calls("call_session", lambda: session.deadline(actor, 10.0).ping.call(1), a.calls)]
    finally:
        session.shutdown()
    if a.out:
        Path(a.out).write_text(json.dumps({"records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
