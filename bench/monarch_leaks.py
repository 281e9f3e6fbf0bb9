"""What a controller's memory keeps for good of each mesh it replaces and each actor call it
makes, measured inside Monarch and through monarch_nb, side by side in one invocation.

A long fault-tolerant run does both all the time: every recovered fault is a mesh cycle (the
failed group's mesh stops, a new one starts), and the supervisor polls every group several
times a second. What they leave behind is the floor of the controller's memory slope.

  mesh_monarch   Monarch alone: ``this_host().spawn_procs``, one call, ``ProcMesh.stop``
  mesh_session   monarch_nb's ``Session.up`` / ``down`` (which drops Monarch's own references
                 to a stopped mesh, ``seam.forget_proc_mesh``)
  call_monarch   ``actor.endpoint.call().get()`` on a live one-process mesh
  call_session   ``session.deadline(actor).endpoint.call()`` (the supervisor's path: to one
                 actor, a once port, which Monarch frees when the reply arrives)
  call_open_port the same call through a port opened for several replies (the supervisor's path
                 before: such a port stays in the controller's mailbox until it exits)
  call_session3  ``session.deadline(actors).endpoint.call()`` to a three-process mesh (several
                 replies need that port)
For the meshes: the RSS growth per unit after a warm-up, fitted by least squares, and how many
ActorMesh / ProcMesh Python objects are still alive at the end. For the calls: the paths take
turns (``--rounds``, so the box's noise falls on all of them alike), and each unit's figure is
the RSS it added in its turns, over its calls; freed heap is handed back (``malloc_trim``) before
each reading, so what is counted is what is kept.

Usage: python bench/monarch_leaks.py [--cycles 40] [--calls 10000] [--rounds 5] [--out bench/results/monarch_leaks.json]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import monarch_nb  # noqa: E402,F401  (first: Monarch's supervision settings)
import psutil  # noqa: E402
from monarch.actor import Actor, endpoint, send, this_host  # noqa: E402

from monarch_nb import seam  # noqa: E402
from monarch_nb.session import Session  # noqa: E402


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def rss_mb(trim: bool = False) -> float:
    if trim:  # freed heap back to the system first: what is left is what is kept
        ctypes.CDLL(None).malloc_trim(0)
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


def open_port_call(actor) -> int:
    """One call through a port opened for several replies, as ``calls.Replies`` made every call
    before it took a once port for a single actor."""
    port, replies = seam.open_outcome_channel()
    send(actor.ping, (1,), {}, port=port)
    return replies.recv().get(timeout=10.0)


def measure_calls(paths: dict, calls: int, rounds: int) -> list[dict]:
    """Each path makes ``calls`` calls in ``rounds`` turns, the paths alternating."""
    for call in paths.values():  # warm-up
        for _ in range(max(1, calls // (10 * rounds))):
            call()
    added = {name: [] for name in paths}
    per_turn = calls // rounds
    for _ in range(rounds):
        for name, call in paths.items():
            before = rss_mb(trim=True)
            for _ in range(per_turn):
                call()
            added[name].append(rss_mb(trim=True) - before)
    records = []
    for name, mbs in added.items():
        record = {"path": name, "units": per_turn * rounds, "unit": "call",
                  "rss_mb_added_per_turn": [round(x, 2) for x in mbs],
                  "kb_per_unit": round(1024 * sum(mbs) / (per_turn * rounds), 3)}
        print(f"{name:15} {record['kb_per_unit']:.2f} KB per call  (MB per turn: {record['rss_mb_added_per_turn']})",
              flush=True)
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", choices=["meshes", "calls"], help="measure only these")
    p.add_argument("--out")
    a = p.parse_args(argv)
    session = Session()
    try:
        records = []
        if a.only != "calls":
            records += [measure_meshes("mesh_monarch", monarch_cycle, session, a.cycles, a.warmup),
                        measure_meshes("mesh_session", session_cycle, session, a.cycles, a.warmup)]
        if a.only != "meshes":
            session.up("calls", procs=1)
            actor = session.spawn("echo", Echo, mesh="calls")
            session.up("calls3", procs=3)
            actors3 = session.spawn("echo3", Echo, mesh="calls3")
            records += measure_calls({
                "call_monarch": lambda: actor.ping.call(1).get(),
                "call_session": lambda: session.deadline(actor, 10.0).ping.call(1),
                "call_open_port": lambda: open_port_call(actor),
                "call_session3": lambda: session.deadline(actors3, 10.0).ping.call(1),
            }, a.calls, a.rounds)
    finally:
        session.shutdown()
    if a.out:
        Path(a.out).write_text(json.dumps({"records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
