"""The parts of a failure's cost, each measured on its own, so that costmodel can compose them
for a cluster this machine is not (issue 18, item 4).

On this 2-core box, R groups that rebuild at once share two cores, so a measured restart of R
groups grows with R for a reason a cluster (one node per group) does not have. This benchmark
measures instead:

* **alone** (``--alone``): one group coming back when it is the only thing rebuilding, in wall
  time and in CPU-seconds of its new process (psutil, at its first committed step): a peer
  recovery (FTRun, 2 groups, ``kill``; phases from the run's history) and a restart from a
  durable checkpoint (FTRun, 1 group, ``on_failure="restart"``).
* **the parts that depend on R**, for R in ``--groups`` (default 1,2,4,8,16), each run by R real
  processes from one pool started once (so their ``import torch`` is not counted):
  - ``store``: R processes meet at a torch ``TCPStore`` (every worker connected);
  - ``process_group``: gloo's process group over that store plus one all-reduce (what a plain
    torchtitan restart builds, as torchrun would);
  - ``quorum_steady``: R torchft Lighthouse clients asking for a quorum every step against a
    real ``LighthouseServer`` with our settings (torchft's per-step quorum). A membership change
    is not measured here: the survivors wait for the dead group's heartbeats to stop
    (``heartbeat_timeout_ms``, a setting) and bench_scale.py measures their whole stall per R;
  - ``dcp_read``: R processes each loading the whole state of the model (weights and Adam's two
    moments) from one DCP checkpoint at once, as every group of a restart does.
  Wall time is from the moment all R processes were released to the last one done; CPU-seconds
  are summed over the R processes.

Writes ``{"alone": {model: {"peer"|"restart": {"wall_s", "cpu_s", "failures"}}}, "parts": [{"part", "groups", "wall_s", "cpu_s", ...}], ...}``;
bench/seed_clusters.py --parts composes them with costmodel.compose.

Usage: python bench/bench_cost_parts.py --out bench/results/cost_parts.json [--groups 1,2,4,8,16]
           [--model tiny] [--rounds 5] [--alone tiny,debugmodel] [--faults 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("RUST_LOG", "warn")  # torchft's Lighthouse logs every quorum at info


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the pool's worker: one process, many parts ------------------------------------------

def _store_and_group(rank: int, groups: int, port: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    t0, c0 = time.time(), _cpu()
    store = dist.TCPStore("127.0.0.1", port, groups, is_master=rank == 0, timeout=timedelta(seconds=120),
                          wait_for_workers=True)
    store.add("arrived", 1)
    store.wait(["arrived"])
    while int(store.add("arrived", 0)) < groups:  # every rank has arrived: the store's rendezvous
        time.sleep(0.001)
    t1, c1 = time.time(), _cpu()
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=groups)
    dist.all_reduce(torch.ones(1))
    t2, c2 = time.time(), _cpu()
    dist.destroy_process_group()
    # the master's store must outlive every client's last use of it
    store.add("done", 1)
    while rank == 0 and int(store.add("done", 0)) < groups:
        time.sleep(0.001)
    return {"store_end": t1, "store_cpu": c1 - c0, "group_end": t2, "group_cpu": c2 - c1, "start": t0}


def _quorum(rank: int, addr: str, rounds: int) -> dict[str, Any]:
    """``rounds`` quorums of all the groups, one per step as torchft asks (the Lighthouse has
    min_replicas = R, so the first round waits for every group and the next ones are its fast
    path: every member of the last quorum is back)."""
    from torchft._torchft import LighthouseClient

    c0 = _cpu()
    client = LighthouseClient(addr, timedelta(seconds=30))
    took = []
    for step in range(rounds):
        t = time.time()
        client.quorum(replica_id=f"g{rank}", timeout=timedelta(seconds=60), step=step)
        took.append(time.time() - t)
    return {"rounds_s": took, "cpu": _cpu() - c0, "end": time.time()}


def _dcp_read(directory: str, shapes: dict[str, list[int]]) -> dict[str, float]:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {k: torch.empty(v) for k, v in shapes.items()}
    c0 = _cpu()
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    return {"end": time.time(), "cpu": _cpu() - c0, "bytes": sum(t.numel() * t.element_size() for t in state.values())}


def _worker(rank: int, commands: Any, results: Any, go: Any) -> None:
    import torch  # noqa: F401  (imported once, before any part is timed)
    import torch.distributed.checkpoint  # noqa: F401
    import torchft._torchft  # noqa: F401

    results.put(("imported", rank, None))
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        part, args = cmd
        results.put(("ready", rank, None))
        go.wait()
        try:
            if part == "store":
                out = _store_and_group(rank, *args)
            elif part == "quorum":
                out = _quorum(rank, *args)
            else:
                out = _dcp_read(*args)
        except Exception as exc:  # reported, not swallowed: the parent raises it
            out = {"error": f"{type(exc).__name__}: {exc}"}
        results.put(("done", rank, out))


class Pool:
    """``size`` worker processes that have imported torch; ``run(part, R, args)`` releases R of
    them at one instant and returns (release time, each one's result)."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.go = ctx.Event()
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=_worker, args=(i, self.commands[i], self.results, self.go), daemon=True)
                      for i in range(size)]
        for p in self.procs:
            p.start()
        for _ in range(size):
            self._expect("imported")

    def _expect(self, kind: str) -> tuple[int, Any]:
        got, rank, out = self.results.get(timeout=600)
        assert got == kind, f"expected {kind}, got {got}"
        if isinstance(out, dict) and "error" in out:
            raise RuntimeError(f"rank {rank}: {out['error']}")
        return rank, out

    def run(self, part: str, groups: int, args_of: Any) -> tuple[float, list[dict[str, Any]]]:
        self.go.clear()
        for rank in range(groups):
            self.commands[rank].put((part, args_of(rank)))
        for _ in range(groups):
            self._expect("ready")
        t_go = time.time()
        self.go.set()
        outs: list[dict[str, Any]] = [{}] * groups
        for _ in range(groups):
            rank, out = self._expect("done")
            outs[rank] = out
        return t_go, outs

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


PARTS = ("store", "process_group", "quorum_steady", "dcp_read")


# ---- the parts ----------------------------------------------------------------------------

def _checkpoint(model: str, directory: str) -> tuple[dict[str, list[int]], int]:
    """A DCP checkpoint of ``model``'s weights and Adam's two moments (fp32), as a restart reads."""
    import torch
    import torch.distributed.checkpoint as dcp

    from monarch_nb.ft.settings.flavors import model_config

    with torch.device("cpu"):
        net = model_config(model).build()
    state = {}
    for name, p in net.named_parameters():
        state[f"model.{name}"] = p.detach().float().contiguous()
        state[f"optim.{name}.exp_avg"] = torch.randn_like(state[f"model.{name}"])
        state[f"optim.{name}.exp_avg_sq"] = torch.rand_like(state[f"model.{name}"])
    dcp.save(state, checkpoint_id=directory, no_dist=True)
    return {k: list(v.shape) for k, v in state.items()}, sum(v.numel() * 4 for v in state.values())


def measure_parts(groups_list: list[int], model: str, rounds: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from monarch_nb.ft.control.lighthouse import LighthouseSettings
    from torchft._torchft import LighthouseServer

    records: list[dict[str, Any]] = []
    settings = LighthouseSettings()
    with tempfile.TemporaryDirectory(prefix="cost_parts_") as tmp:
        shapes, state_bytes = _checkpoint(model, tmp)
        pool = Pool(max(groups_list))
        try:
            for groups in groups_list:
                for _ in range(rounds):
                    port = _free_port()
                    t_go, outs = pool.run("store", groups, lambda r, p=port: (groups, p))
                    store_end = max(o["store_end"] for o in outs)
                    records.append({"part": "store", "groups": groups, "wall_s": store_end - t_go,
                                    "cpu_s": sum(o["store_cpu"] for o in outs)})
                    records.append({"part": "process_group", "groups": groups,
                                    "wall_s": max(o["group_end"] for o in outs) - store_end,
                                    "cpu_s": sum(o["group_cpu"] for o in outs)})
                server = LighthouseServer(bind="[::]:0", min_replicas=groups, join_timeout_ms=settings.join_timeout_ms,
                                          quorum_tick_ms=settings.quorum_tick_ms,
                                          heartbeat_timeout_ms=settings.heartbeat_timeout_ms)
                try:
                    addr = server.address()
                    t_go, outs = pool.run("quorum", groups, lambda r: (addr, rounds + 1))
                finally:
                    server.shutdown()
                cpu = sum(o["cpu"] for o in outs) / (rounds + 1)  # per quorum, summed over the groups
                for k in range(1, rounds + 1):  # round 0 waited for the slowest group to arrive
                    records.append({"part": "quorum_steady", "groups": groups,
                                    "wall_s": max(o["rounds_s"][k] for o in outs), "cpu_s": cpu})
                for _ in range(rounds):
                    t_go, outs = pool.run("dcp_read", groups, lambda r: (tmp, shapes))
                    records.append({"part": "dcp_read", "groups": groups,
                                    "wall_s": max(o["end"] for o in outs) - t_go,
                                    "cpu_s": sum(o["cpu"] for o in outs),
                                    "bytes_read": sum(o["bytes"] for o in outs)})
                print(f"R={groups:>2}: " + "  ".join(
                    f"{p} {statistics.median(r['wall_s'] for r in records if r['part'] == p and r['groups'] == groups):.3f}s"
                    for p in PARTS if any(r["part"] == p and r["groups"] == groups for r in records)), flush=True)
        finally:
            pool.close()
    return records, {"model": model, "state_bytes": state_bytes}


def measure_alone(model: str, faults: int) -> dict[str, Any]:
    """One group back alone: a peer recovery (2 groups) and a restart from disk (1 group)."""
    import psutil

    from monarch_nb.ft import FTRun, RunConfig

    out: dict[str, Any] = {}
    for mode, replicas in (("peer", 2), ("restart", 1)):
        cfg = RunConfig(replicas=replicas, model=model, on_failure=mode, steps=100000,
                        checkpoint_every=5 if mode == "restart" else None,
                        run_name=f"cost-alone-{mode}-{model}-{time.strftime('%H%M%S')}")
        run = FTRun(cfg)
        rows = []
        try:
            run.start()
            if mode == "restart":
                run.wait_for(lambda e: e.kind == "checkpoint_saved", timeout=300)
            run.wait_for_step(5, timeout=300)
            victim = replicas - 1
            for _ in range(faults):
                since = time.time()
                run.inject("kill", replica=victim)
                run.wait_for(lambda e: e.kind == "rejoined" and e.replica == victim, timeout=300, since=since)
                cpu = 0.0
                for pid in run.status()[victim]["pids"]:  # the new process: its start, build, load or heal
                    try:
                        t = psutil.Process(pid).cpu_times()
                        cpu += t.user + t.system + t.children_user + t.children_system
                    except psutil.NoSuchProcess:
                        pass
                rows.append({"cpu_s": cpu})
                step = max(s["step"] for k, s in run.status().items() if isinstance(k, int))
                run.wait_for_step(step + 3, timeout=300)
        finally:
            run.stop()
        recs = [r for r in run.history().recoveries() if r.rejoined_t is not None][-faults:]
        for row, rec in zip(rows, recs):
            row.update({"wall_s": rec.total_s, "phases": {p.name: p.duration_s for p in rec.phases()},
                        "heal_s": rec.heal_s, "heal_bytes": rec.heal_bytes})
        out[mode] = {"groups": replicas, "failures": rows,
                     "wall_s": statistics.median(r["wall_s"] for r in rows),
                     "cpu_s": statistics.median(r["cpu_s"] for r in rows)}
        print(f"alone {model} {mode}: wall {out[mode]['wall_s']:.2f} s, cpu {out[mode]['cpu_s']:.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", default="1,2,4,8,16")
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--alone", default="", help="models to measure one group back alone with (FTRun), "
                   "e.g. tiny,debugmodel; none by default")
    p.add_argument("--faults", type=int, default=3)
    p.add_argument("--out", default="bench/results/cost_parts.json")
    a = p.parse_args(argv)
    groups_list = sorted({int(g) for g in a.groups.split(",")})
    t0 = time.time()
    records, meta = measure_parts(groups_list, a.model, a.rounds)
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                              **meta, "rounds": a.rounds, "parts": records}
    if a.alone:
        result["alone"] = {m: measure_alone(m, a.faults) for m in a.alone.split(",")}
    result["seconds"] = time.time() - t0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
