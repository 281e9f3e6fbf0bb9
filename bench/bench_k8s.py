"""Kubernetes figures, measured on the real one-machine cluster (`./run.sh k8s up`).

In one invocation:
- pod start and mesh up: ``Session.up(hosts=1, job=local_k8s.spec())`` ``--repeats`` times, split into
  the pod set being created and Ready (``pods_ready_s``) and Monarch attaching to it (``attach_s``);
- recovery per fault kind as Kubernetes delivers it - ``pod_delete`` (the pod deleted through the
  API), ``eviction`` (the Eviction API, allowed by the pod set's PodDisruptionBudget) and
  ``node_notready`` (the node's kubelet stopped until the node controller marks it NotReady) -
  each ``--repeats`` times, in a run without a spare and in one with a warm spare pod set.
  Every figure comes from the runs' event logs through the one recovery model
  (``monarch_nb.ft.record.recovery``): ``back_s`` is fault -> the victim's first committed step
  and adds up from the phases; ``stall_steps`` is the survivors' longest gap between commits in
  their median steps; ``identical`` is the parameter/optimizer check after the rejoin.

Usage:
  python bench/bench_k8s.py --quick --out /tmp/k8s.json      # 1 repeat, 2 groups (~5 min)
  python bench/bench_k8s.py --out bench/results/k8s.json     # 3 repeats, 3 groups
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb import FTRun, RunConfig, Session  # noqa: E402
from monarch_nb.jobs import local_k8s  # noqa: E402
from monarch_nb.telemetry.events import Rejoined, ReplicasIdentical, SpareState  # noqa: E402

KINDS = {"pod_delete": "pod_delete", "eviction": "evict", "node_notready": "node_notready"}  # record kind -> fault


def mesh_up(repeats: int) -> list[dict]:
    records = []
    session = Session(default_timeout=60)
    try:
        for i in range(repeats):
            t0 = time.monotonic()
            mesh = session.up(f"probe{i}", procs=1, hosts=1, job=local_k8s.spec())
            took = time.monotonic() - t0
            records.append({"kind": "mesh_up", "mesh_up_s": took, **mesh.allocation.timings,
                            "node": mesh.allocation.nodes[0]})
            print(f"mesh up {took:.2f} s (pods ready {mesh.allocation.timings['pods_ready_s']:.2f} s, "
                  f"attach {mesh.allocation.timings['attach_s']:.2f} s)", flush=True)
            t1 = time.monotonic()
            session.down(f"probe{i}")
            records[-1]["down_s"] = time.monotonic() - t1
    finally:
        session.shutdown()
    return records


def all_training(run: FTRun) -> bool:
    return all(s["state"] == "training" for k, s in run.status().items() if isinstance(k, int))


def recoveries(kinds: list[str], repeats: int, spares: int, replicas: int, timeout: float) -> tuple[list, list]:
    # A node lost takes every group on it; once every group sits on one node (after the first node
    # fault they all do), nothing live holds the state: durable checkpoints are the ladder's last rung.
    durable = {"checkpoint_every": 10} if "node_notready" in kinds else {}
    run = FTRun(RunConfig(replicas=replicas, model="tiny", job="kubernetes", spares=spares, **durable,
                          run_name=f"bench-k8s-{time.strftime('%Y%m%d-%H%M%S')}-s{spares}"))
    failures: list[str] = []
    t0 = time.time()
    try:
        run.start()
        print(f"[spares={spares}] {replicas} groups on pods in {time.time() - t0:.1f} s; run dir {run.run_dir}",
              flush=True)
        run.wait_for_step(5, timeout=300)
        n = 0
        for kind in kinds:
            for _ in range(repeats):
                victim = n % replicas
                n += 1
                if spares:
                    run.wait_for(lambda e: isinstance(e, SpareState) and e.state == "ready"
                                 and run.supervisor.spares.ready() > 0, timeout=timeout)
                node = run.session.mesh(f"replica{victim}").allocation.nodes[0]
                since = time.time()
                try:
                    run.inject(KINDS[kind], replica=victim)
                    rej = run.wait_for(lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v,
                                       timeout=timeout, since=since)
                    # a node takes every group on it: the next fault waits until each one trains again
                    run.wait_for(lambda e: all_training(run), timeout=timeout, since=since)  # re-read at every event
                    run.wait_for(lambda e, t=rej.t: isinstance(e, ReplicasIdentical) and e.t >= t, timeout=timeout)
                    print(f"  [spares={spares}] {kind:<13} replica {victim} on {node}: back "
                          f"{rej.seconds_since_failure or 0:.2f} s after the fault", flush=True)
                except TimeoutError as exc:
                    failures.append(f"spares={spares}: {kind} on replica {victim}: {exc}")
                    print(f"  [spares={spares}] {kind} replica {victim}: NOT RECOVERED ({exc})", flush=True)
                finally:
                    if kind == "node_notready":
                        local_k8s.start_node(node)  # returns once every node is Ready and untainted
    finally:
        run.stop()
    fault_of = {v: k for k, v in KINDS.items()}
    records = []
    for rec in run.history().recoveries():
        phases = rec.durations()
        records.append({"kind": fault_of.get(rec.fault, rec.fault), "spare": rec.acquired_how == "spare",
                        "back_s": rec.total_s, "detect_s": phases.get("detect"), "rung": rec.rung,
                        "stall_steps": rec.survivor_stall_steps, "stall_s": rec.survivor_stall_s,
                        "identical": rec.identical, "acquired_how": rec.acquired_how,
                        "phases": phases, "reason": rec.reason})
    return records, failures


def summarize(records: list[dict]) -> list[str]:
    lines = []
    ups = [r for r in records if r["kind"] == "mesh_up"]
    if ups:
        lines.append(f"mesh up (1 pod): median {statistics.median(r['mesh_up_s'] for r in ups):.2f} s = pods ready "
                     f"{statistics.median(r['pods_ready_s'] for r in ups):.2f} s + attach "
                     f"{statistics.median(r['attach_s'] for r in ups):.2f} s ({len(ups)} runs)")
    for kind in KINDS:
        for spare in (False, True):
            rows = [r for r in records if r["kind"] == kind and r["spare"] == spare and r["back_s"] is not None]
            if not rows:
                continue
            back = [r["back_s"] for r in rows]
            stall = [r["stall_steps"] for r in rows if r["stall_steps"] is not None]
            lines.append(f"{kind:<13} {'spare' if spare else 'new pod':<8} back median {statistics.median(back):.2f} s "
                         f"(max {max(back):.2f}), detect median {statistics.median(r['detect_s'] or 0 for r in rows):.2f} s, "
                         f"survivors' stall median {statistics.median(stall) if stall else float('nan'):.1f} steps, "
                         f"identical {sum(bool(r['identical']) for r in rows)}/{len(rows)} ({len(rows)} faults)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat, 2 groups")
    p.add_argument("--repeats", type=int, default=None, help="per kind and configuration (default 3; --quick 1)")
    p.add_argument("--replicas", type=int, default=None, help="replica groups (default 3; --quick 2)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--timeout", type=float, default=180.0, help="per fault: inject -> identical check")
    p.add_argument("--out", help="write the records and the summary here (JSON)")
    a = p.parse_args(argv)
    repeats = a.repeats or (1 if a.quick else 3)
    replicas = a.replicas or (2 if a.quick else 3)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"--kinds: unknown {bad}; allowed: {', '.join(KINDS)}")
    if not local_k8s.is_up():
        p.error("the local Kubernetes cluster is not up: ./run.sh k8s up")
    records = mesh_up(repeats)
    failures: list[str] = []
    for spares in (0, 1):
        recs, fails = recoveries(kinds, repeats, spares, replicas, a.timeout)
        records += recs
        failures += fails
    lines = summarize(records)
    print()
    for line in lines:
        print(line)
    for f in failures:
        print("FAILED:", f)
    if a.out:
        Path(a.out).write_text(json.dumps({"cluster": "one machine, 2 nodes, Kubernetes v1.36.3 (scripts/k8s_cluster.sh)",
                                           "repeats": repeats, "replicas": replicas, "records": records,
                                           "summary": lines, "failures": failures}, indent=1))
    return 1 if failures or not all(r["identical"] for r in records if r["kind"] != "mesh_up") else 0


if __name__ == "__main__":
    sys.exit(main())
