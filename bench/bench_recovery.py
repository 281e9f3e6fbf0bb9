"""Recovery figures, measured on real fault-tolerant runs, with and without warm spares.

In one invocation: one ``FTRun`` per (spares, heal transport) configuration, each receiving
every fault kind ``--repeats`` times in turn (a rotating victim; the next fault only once the
victim rejoined, the replicas were checked identical and, with spares, a spare is ready
again). Everything reported comes from the runs' event logs, through the one recovery model
(``monarch_nb.ft.record.recovery``): six phases back to back - detect, teardown, acquire, build,
heal, rejoin - adding up to ``seconds_since_failure`` (fault -> the victim's first committed
step), plus how long the survivors stalled in units of their median step time.

The heal bandwidth is shown next to this machine's loopback TCP bandwidth, measured in the
same invocation: on one machine that is the physical limit of a peer-to-peer state copy.

With ``--semi-sync diloco`` (or ``local_sgd``) every configuration runs twice in the same
invocation, synchronous (a gradient allreduce every step) and semi-synchronous (the groups meet
every ``--sync-every`` steps); each record carries ``semi_sync`` (None for synchronous), ``kind``,
``rung`` and ``back_s`` (fault -> the victim's first committed step).

Usage:
  python bench/bench_recovery.py --kinds kill,comms --repeats 3 --spares 1 --out results.json
  python bench/bench_recovery.py --kinds comms,kill --semi-sync diloco --spares 0   # sync vs DiLoCo
  python bench/bench_recovery.py                      # every kind, once, spares 0 and 1
  python bench/bench_recovery.py --job slurm --kinds preempt,node_down   # on the SLURM cluster
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.ft import FaultKind, FTRun, RunConfig  # noqa: E402
from monarch_nb.ft.settings.faults import CLUSTER_KINDS  # noqa: E402
from monarch_nb.ft.record.recovery import PHASES  # noqa: E402
from monarch_nb.telemetry.events import Rejoined, ReplicasIdentical, SpareState  # noqa: E402

LOCAL_KINDS = [k.value for k in FaultKind if k not in CLUSTER_KINDS]


def loopback_bandwidth(megabytes: int = 256) -> float:
    """GB/s of one TCP stream over loopback on this machine (sender and receiver threads)."""
    payload = b"\0" * (1 << 20)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = [0]

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            while True:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    return
                received[0] += len(chunk)

    reader = threading.Thread(target=receive)
    reader.start()
    t0 = time.perf_counter()
    with socket.create_connection(server.getsockname()) as client:
        for _ in range(megabytes):
            client.sendall(payload)
    reader.join()
    seconds = time.perf_counter() - t0
    server.close()
    return received[0] / seconds / 1e9


def record(rec, label: str, transport: str, median_step: float | None, semi_sync: str | None = None) -> dict:
    phases = rec.durations()
    return {
        "run": label, "kind": rec.fault, "spare": rec.acquired_how == "spare", "transport": transport,
        "semi_sync": semi_sync, "back_s": rec.total_s,
        "acquired_how": rec.acquired_how, "victim": rec.replica, "seconds_since_failure": rec.total_s,
        "rung": rec.rung,  # an in-place repair has no teardown/acquire/build, a replacement no repair: None
        **{f"{name}_s": phases.get(name) for name in PHASES},
        "controller_saw_s": rec.detection_s,  # = detect, except for a rebuild at once (not on its path)
        "survivor_stall_steps": rec.survivor_stall_steps, "survivor_stall_s": rec.survivor_stall_s,
        "heal_MB": rec.heal_bytes / 1e6 if rec.heal_bytes else None, "heal_transfer_s": rec.heal_s,
        "heal_GBps": (rec.heal_bytes / rec.heal_s / 1e9) if rec.heal_bytes and rec.heal_s else None,
        "identical": rec.identical, "median_step_s": median_step, "reason": rec.reason,
    }


def one_run(kinds: list[str], repeats: int, spares: int, transport: str, a: argparse.Namespace,
            semi_sync: str | None = None) -> tuple[list, list]:
    label = f"spares={spares} transport={transport}" + (f" sync={semi_sync}" if semi_sync else "")
    sync = {"sync": semi_sync, "sync_every": a.sync_every} if semi_sync else {}
    cfg = RunConfig(replicas=a.replicas, group_size=a.group_size, spares=spares, heal_transport=transport,
                    backend=a.backend, **sync,
                    job=a.job, run_name=f"bench-recovery-{time.strftime('%Y%m%d-%H%M%S')}-s{spares}-{transport}"
                                      + (f"-{semi_sync}" if semi_sync else ""))
    run = FTRun(cfg)
    failures: list[str] = []
    t0 = time.time()
    try:
        run.start()
        print(f"[{label}] started {a.replicas} groups in {time.time() - t0:.1f} s; run dir {run.run_dir}", flush=True)
        run.wait_for_step(5, timeout=300)
        n = 0
        for kind in kinds:
            for _ in range(repeats):
                victim = n % a.replicas
                n += 1
                if spares:
                    run.wait_for(lambda e: isinstance(e, SpareState) and e.state == "ready"
                                 and run.supervisor.spares.ready() > 0, timeout=a.timeout)
                since = time.time()
                try:
                    run.inject(kind, replica=victim, rank=a.rank, hang_s=a.hang_s)
                    rej = run.wait_for(lambda e, v=victim: isinstance(e, Rejoined) and e.replica == v,
                                       timeout=a.timeout, since=since)
                    run.wait_for(lambda e, t=rej.t: isinstance(e, ReplicasIdentical) and e.t >= t, timeout=a.timeout)
                    print(f"  [{label}] {kind:<9} replica {victim}: back at step {rej.step}, "
                          f"{rej.seconds_since_failure or 0:.2f} s after the fault", flush=True)
                except TimeoutError as e:
                    failures.append(f"{label}: {kind} on replica {victim}: {e}")
                    print(f"  [{label}] {kind:<9} replica {victim}: NOT RECOVERED ({e})", flush=True)
                if kind == "node_down":
                    from monarch_nb.jobs.slurm import resume_node

                    for node in ("n1", "n2", "n3", "n4"):
                        try:
                            resume_node(node)
                        except Exception:
                            pass
    finally:
        run.stop()
    history = run.history()
    steps = [e.t for e in history.steps(0)]
    gaps = [b - x for x, b in zip(steps, steps[1:])]
    median_step = statistics.median(gaps) if gaps else None
    return [record(r, label, transport, median_step, semi_sync) for r in history.recoveries()], failures


def summarize(records: list[dict]) -> list[str]:
    lines = []
    cols = [f"{p}_s" for p in PHASES] + ["seconds_since_failure", "controller_saw_s", "survivor_stall_steps", "heal_GBps"]
    head = (f"{'kind':<10}{'sync':<10}{'spare':<6}{'transport':<10}{'n':>3} "
            + " ".join(f"{c.removesuffix('_s'):>22}" for c in cols))
    lines.append("median / max per phase (seconds unless named)")
    lines.append(head)
    group = ("kind", "semi_sync", "spare", "transport")
    for key in sorted({tuple(r.get(k) for k in group) for r in records}, key=str):
        rows = [r for r in records if tuple(r.get(k) for k in group) == key]
        cells = []
        for c in cols:
            values = [r[c] for r in rows if r[c] is not None]
            cells.append(f"{statistics.median(values):>10.3f} / {max(values):<9.3f}" if values else f"{'-':>22}")
        kind, sync, spare, transport = key
        lines.append(f"{str(kind):<10}{sync or 'step':<10}{str(spare):<6}{transport:<10}{len(rows):>3} " + " ".join(cells))
    return lines


def back_lines(records: list[dict]) -> list[str]:
    """The victim's wait, per fault kind (and sync mode): with a spare against without, and a
    semi-synchronous run against the synchronous one - never a median over mixed kinds."""
    def median(rows: list[dict]) -> float | None:
        values = [r["back_s"] for r in rows if r["back_s"] is not None]
        return statistics.median(values) if values else None

    lines = []
    for kind in sorted({r["kind"] for r in records if r["kind"]}):
        of_kind = [r for r in records if r["kind"] == kind]
        for sync in sorted({r["semi_sync"] for r in of_kind}, key=str):
            rows = [r for r in of_kind if r["semi_sync"] == sync]
            spare, without = median([r for r in rows if r["spare"]]), median([r for r in rows if not r["spare"]])
            rungs = ",".join(sorted({r["rung"] or "?" for r in rows}))
            parts = [f"{v:.2f} s {how}" for v, how in ((spare, "with a spare"), (without, "without")) if v is not None]
            ratio = f" ({without / spare:.1f}x)" if spare and without else ""
            lines.append(f"{kind} ({sync or 'synchronous'}, rung {rungs}): victim back median {', '.join(parts)}{ratio}")
        sync_back = median([r for r in of_kind if r["semi_sync"] is None])
        for sync in sorted({r["semi_sync"] for r in of_kind if r["semi_sync"]}):
            semi = median([r for r in of_kind if r["semi_sync"] == sync])
            if semi is not None and sync_back:
                lines.append(f"{kind}: {sync} back {semi:.2f} s vs synchronous {sync_back:.2f} s "
                             f"({semi / sync_back:.1f}x)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=None, help="comma-separated fault kinds (default: every kind)")
    p.add_argument("--repeats", type=int, default=1, help="faults per kind and configuration")
    p.add_argument("--spares", type=int, default=1, help="also measure a run with this many warm spares (0: only without)")
    p.add_argument("--transports", default="striped", help="heal transports to compare, e.g. striped,http,pg")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="collective backend (default: nccl on GPUs; gloo for several groups on one GPU)")
    p.add_argument("--group-size", type=int, default=1)
    p.add_argument("--rank", type=int, default=0, help="the rank of its group a fault hits (< --group-size)")
    p.add_argument("--job", default="local", choices=["local", "slurm"])
    p.add_argument("--semi-sync", default=None, choices=["diloco", "local_sgd"],
                   help="also run every configuration semi-synchronously, side by side with the synchronous run")
    p.add_argument("--sync-every", type=int, default=10, help="with --semi-sync: steps between meetings")
    p.add_argument("--hang-s", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=240.0, help="per fault: inject -> identical check")
    p.add_argument("--out", "--json", dest="out", help="write the records and the summary here (JSON)")
    a = p.parse_args(argv)
    kinds = [FaultKind.parse(k, "kinds").value for k in (a.kinds.split(",") if a.kinds else LOCAL_KINDS) if k]
    loopback = loopback_bandwidth()
    print(f"loopback TCP bandwidth on this machine: {loopback:.2f} GB/s", flush=True)
    records, failures = [], []
    for semi_sync in [None] + ([a.semi_sync] if a.semi_sync else []):
        for spares in sorted({0, a.spares}):
            for transport in a.transports.split(","):
                recs, fails = one_run(kinds, a.repeats, spares, transport, a, semi_sync)
                records += recs
                failures += fails
    print()
    for line in summarize(records):
        print(line)
    heal = [r["heal_GBps"] for r in records if r["heal_GBps"]]
    if heal:
        print(f"\nheal bandwidth median {statistics.median(heal):.2f} GB/s vs loopback {loopback:.2f} GB/s "
              f"({statistics.median(heal) / loopback:.0%} of it)")
    for line in back_lines(records):
        print(line)
    for f in failures:
        print("FAILED:", f)
    if a.out:
        Path(a.out).write_text(json.dumps({"loopback_GBps": loopback, "records": records,
                                           "summary": summarize(records) + back_lines(records),
                                           "failures": failures}, indent=1))
    return 1 if failures or not all(r["identical"] for r in records if r["kind"]) else 0


if __name__ == "__main__":
    sys.exit(main())
