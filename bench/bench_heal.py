"""How fast a heal moves a live peer's state, against what this machine and torchft can do
(issue: heal at the machine's limit). One invocation, side by side, per state size (GB):

References (no training, in this process):
  memcpy          one copy of the state in memory (torch ``copy_``): no heal beats it
  loopback_1      the state's bytes through one loopback TCP stream (two threads; sockets
                  release the GIL)
  loopback_N      the same split over N parallel streams (``--streams``)
  torchft_http    torchft's ``HTTPTransport`` send/recv of a state dict of 3 MB tensors, as its
                  own ``http_transport_bench`` does it (``num_chunks`` 0), and chunked (N)
  striped_1       monarch_nb's transport (ft/worker/heal_transport.py): one donor, digests checked
  striped_N       the same from N donors (``--donors``, default 2) at once
The heal itself, in a real run (``--heal``, default on): a model flavour whose trainer state
(parameters + AdamW) is nearest the size, R groups training; one group is killed, respawned
and heals while the survivors hold their step (they wait for it in the step's allreduce):
  heal            R = 2: one donor, heal_transport "striped"
  heal_striped    R = 3: two donors at once
  heal_torchft    R = 2 over torchft's HTTPTransport (heal_transport "http"): the old path
  torchft_pg      R = 2 over torchft's PGTransport (heal_transport "pg"): it needs the quorum's
                  process group, so it is measured as a heal in a run too
The heal runs use ``join_timeout_ms=10000``: with the default (1 s, stretched by processes per
core) a victim that asks for its quorum more than that before the survivors finish their step
gets a quorum with the first survivor only, and the others are not donors (see RESULTS.md,
"left out"); this benchmark measures the transfer, so every survivor is in the victim's quorum.
GB/s of a heal is the state's bytes over what the victim spent receiving and loading them.
``donor_extra_rss_gb``: a donor's largest RSS during the heal minus its largest over the two
training steps before the kill; ``victim_extra_rss_gb``: the victim's largest RSS during the heal minus its RSS
just before it began (rebuilt, its own state allocated).
Each record: ``{"path", "size_gb", "gbps", "seconds", "donors", "donor_extra_rss_gb"}``.

Usage: python bench/bench_heal.py [--sizes 0.1,1,4] [--quick] [--streams 4] [--no-heal] [--out FILE.json]
  --quick: sizes 0.1 and 1 (debugmodel and small for the heals).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

CHUNK_BYTES = 3_000_000  # torchft's own bench: state dicts of 3 MB tensors
SOCKET_BLOCK = 1 << 20


def record(path: str, size_gb: float, seconds: float) -> dict:
    gbps = size_gb / seconds if seconds > 0 else None
    print(f"{path:22} {size_gb:6.2f} GB  {seconds:7.3f} s  {gbps:6.2f} GB/s", flush=True)
    return {"path": path, "size_gb": size_gb, "gbps": gbps, "seconds": seconds, "donors": None,
            "donor_extra_rss_gb": None}


def memcpy(size: int) -> float:
    src = torch.ones(size // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)  # its pages exist: the copy is timed, not the page faults
    t = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - t


def loopback(size: int, streams: int) -> float:
    """Seconds to push ``size`` bytes from one buffer through ``streams`` loopback connections."""
    payload = memoryview(bytearray(size))
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(streams)
    port = server.getsockname()[1]
    share = -(-size // streams)

    def drain(conn: socket.socket) -> None:
        buf = bytearray(SOCKET_BLOCK)
        while conn.recv_into(buf):
            pass
        conn.close()

    def accept() -> None:
        for _ in range(streams):
            conn, _ = server.accept()
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]

    def push(i: int) -> None:
        part = payload[i * share: min(size, (i + 1) * share)]
        for off in range(0, len(part), SOCKET_BLOCK):
            clients[i].sendall(part[off: off + SOCKET_BLOCK])
        clients[i].shutdown(socket.SHUT_WR)
        clients[i].recv(1)  # the receiver closing: every byte was read

    t = time.perf_counter()
    pushers = [threading.Thread(target=push, args=(i,)) for i in range(streams)]
    for p in pushers:
        p.start()
    for p in pushers:
        p.join()
    seconds = time.perf_counter() - t
    for c in clients:
        c.close()
    server.close()
    return seconds


def torchft_http(size: int, num_chunks: int) -> float:
    from torchft.checkpointing.http_transport import HTTPTransport

    timeout = timedelta(seconds=600)
    transport = HTTPTransport(timeout, num_chunks=num_chunks)
    try:
        state = {f"chunk/{i}": torch.zeros(CHUNK_BYTES // 4) for i in range(0, size, CHUNK_BYTES)}
        transport.send_checkpoint(dst_ranks=[0], step=1, state_dict=state, timeout=timeout)
        t = time.perf_counter()
        transport.recv_checkpoint(src_rank=1, metadata=transport.metadata(), step=1, timeout=timeout)
        return time.perf_counter() - t
    finally:
        transport.shutdown(wait=False)


def striped(size: int, donors: int) -> float:
    """monarch_nb's transport alone: ``donors`` transports serving one state, one receiving it."""
    from monarch_nb.ft.worker.heal_transport import StripedTransport

    timeout = timedelta(seconds=600)
    served = {f"t{i}": torch.ones(CHUNK_BYTES // 4) for i in range(0, size, CHUNK_BYTES)}
    mine = {k: torch.zeros_like(v) for k, v in served.items()}
    senders = [StripedTransport("127.0.0.1", timeout, target=dict, peers=list, replica=i) for i in range(donors)]
    for t in senders:
        t.offer(1, served)
    addresses = [t.metadata() for t in senders]
    receiver = StripedTransport("127.0.0.1", timeout, target=lambda: mine, peers=lambda: addresses)
    try:
        t = time.perf_counter()
        receiver.recv_checkpoint(0, addresses[0], 1, timeout)
        return time.perf_counter() - t
    finally:
        for x in senders + [receiver]:
            x.shutdown(wait=False)


# Model flavours by their trainer state's size in GB (parameters + AdamW's two moments, fp32).
FLAVOR_STATE_GB = {"debugmodel": 0.074, "debug4x": 0.35, "small": 1.25, "medium": 4.9}


def flavour_for(gb: float) -> str:
    import math

    return min(FLAVOR_STATE_GB, key=lambda f: abs(math.log(FLAVOR_STATE_GB[f] / gb)))


def rss_gb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e9
    except OSError:
        return None


def heal(path: str, size_asked: float, replicas: int, transport: str, backend: str | None = None,
         counters: Callable[[], dict] | None = None, **config: Any) -> dict:
    """A real run: kill the last group, wait for its heal; the heal's bandwidth and the donors'
    extra RSS while they served it. ``counters``: read every 0.2 s; their growth over the heal
    (the last reading before it began to the first after it ended) is recorded (``"counted"``,
    keyed as ``counters`` returns them); ``config``: more
    RunConfig fields (e.g. ``job="slurm"``)."""
    from monarch_nb.ft import FTRun, RunConfig
    from monarch_nb.telemetry.events import Healed, Step

    model = flavour_for(size_asked)
    cfg = RunConfig(replicas=replicas, model=model, heal_transport=transport, backend=backend, init_timeout_s=900,
                    hang_timeout_s=120, pg_timeout_s=120, join_timeout_ms=10000,
                    run_name=f"bench-heal-{path}-{model}-{time.strftime('%H%M%S')}", **config)
    run = FTRun(cfg)
    victim, donors = replicas - 1, list(range(replicas - 1))
    try:
        run.start()
        run.wait_for_step(3, timeout=900)
        pids = [pid for d in donors for pid in run.groups[d].pids]
        samples: list[tuple[float, float, float | None]] = []  # (t, donors' RSS summed, victim's RSS)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                values = [rss_gb(p) for p in pids]
                victim_pids = run.groups[victim].pids
                mine = [rss_gb(p) for p in victim_pids]
                samples.append((time.time(), sum(v for v in values if v is not None),
                                sum(v for v in mine if v is not None) if victim_pids else None))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # The baseline spans two whole steps (a step's own peak: activations, gradients).
        done = max(e.step for e in run.events.events(Step) if e.committed and e.replica in donors)
        run.wait_for_step(done + 2, replicas=donors, timeout=900)
        nodes = _nodes(run)
        readings: list[tuple[float, dict]] = []  # (t, counters()) every 0.2 s
        if counters:
            threading.Thread(target=_read_every, args=(counters, 0.2, readings, stop), daemon=True).start()
        t = time.time()
        run.inject("kill", replica=victim)
        healed = run.wait_for(lambda e: isinstance(e, Healed) and e.replica == victim and e.cause == "recovery",
                              timeout=900, since=t)
        counted = _growth(readings, healed.t - healed.seconds, healed.t, stop) if counters else None
        nodes[victim] = _nodes(run).get(victim)
        stop.set()
        sampler.join()
        start = healed.t - healed.seconds
        before = [d for ts, d, _ in samples if ts < t]
        during = [d for ts, d, _ in samples if start - 0.5 <= ts <= healed.t + 0.5]
        extra = (max(during) - max(before)) / len(donors) if before and during else None
        # the victim: its RSS just before the heal began (rebuilt, its own state allocated)
        # against its peak during the heal
        v_before = [v for ts, _, v in samples if start - 0.3 <= ts < start and v]
        v_during = [v for ts, _, v in samples if start <= ts <= healed.t + 0.5 and v]
        victim_extra = max(v_during) - v_before[-1] if v_before and v_during else None
    finally:
        run.stop()
    gb = healed.bytes / 1e9
    out = record(path, gb, healed.seconds)
    out.update(donors=len(healed.donors) if healed.donors else 1, donor_extra_rss_gb=extra,
               victim_extra_rss_gb=victim_extra, model=model,
               transfer_gbps=healed.gbps, corrupt=healed.corrupt, size_asked_gb=size_asked,
               breakdown=healed.breakdown, passed_over=healed.passed_over, bytes=healed.bytes)
    if counters:
        out.update(counted=counted, nodes=nodes)
    return out


def _read_every(read: Callable[[], dict], period: float, out: list, stop: threading.Event) -> None:
    while True:
        out.append((time.time(), read()))
        if stop.wait(period):
            return


def _growth(readings: list[tuple[float, dict]], start: float, end: float, stop: threading.Event) -> dict:
    """How much each counter grew from its last reading before ``start`` to its first after ``end``."""
    while not any(ts >= end for ts, _ in readings) and not stop.is_set():
        time.sleep(0.05)  # the reader's next reading
    before = [r for ts, r in readings if ts <= start] or readings[:1]
    after = [r for ts, r in readings if ts >= end] or readings[-1:]
    return {k: v - before[-1].get(k, 0) for k, v in after[0].items()}


def _nodes(run: Any) -> dict[int, str | None]:
    """The SLURM node of each group's allocation (None for a group on this host)."""
    out = {}
    for g in run.groups:
        allocation = run.session.mesh(g.name).allocation if g.name in run.session.meshes else None
        out[g.index] = allocation.nodes[0] if allocation is not None and getattr(allocation, "nodes", None) else None
    return out


def plot(records: list[dict], path: Path) -> None:
    """GB/s against state size, one line per path (heals at their model's state size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r["path"] for r in records):
        pts = sorted((r["size_gb"], r["gbps"]) for r in records if r["path"] == name and r["gbps"])
        style = "o-" if name.startswith("heal") else "s--"
        ax.plot([x for x, _ in pts], [y for _, y in pts], style, label=name, linewidth=2 if name.startswith("heal") else 1)
    ax.set_xscale("log")
    ax.set_xlabel("state size (GB)")
    ax.set_ylabel("GB/s")
    ax.set_title("heal bandwidth vs the machine's references (2-core CPU box, loopback)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.1,1,4", help="GB of state, comma-separated")
    p.add_argument("--quick", action="store_true", help="sizes 0.1 and 1 GB")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--donors", type=int, default=2, help="donors of the striped_N reference")
    p.add_argument("--no-heal", dest="heal", action="store_false", help="the references only")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="the runs' collectives (default: the platform's)")
    p.add_argument("--out")
    a = p.parse_args(argv)
    sizes = [0.1, 1.0] if a.quick else [float(x) for x in a.sizes.split(",")]
    records = []
    for gb in sizes:
        size = int(gb * 1e9)
        records.append(record("memcpy", gb, memcpy(size)))
        records.append(record("loopback_1", gb, loopback(size, 1)))
        records.append(record(f"loopback_{a.streams}", gb, loopback(size, a.streams)))
        records.append(record("torchft_http", gb, torchft_http(size, 0)))
        records.append(record(f"torchft_http_chunks_{a.streams}", gb, torchft_http(size, a.streams)))
        records.append(record("striped_1", gb, striped(size, 1)))
        records.append(record(f"striped_{a.donors}", gb, striped(size, a.donors)))
        if a.heal:
            records.append(heal("heal", gb, 2, "striped", a.backend))
            records.append(heal("heal_striped", gb, 3, "striped", a.backend))
            records.append(heal("heal_torchft", gb, 2, "http", a.backend))
            records.append(heal("torchft_pg", gb, 2, "pg", a.backend))
    if a.out:
        out = Path(a.out)
        out.write_text(json.dumps({"records": records, "args": vars(a), "argv": list(argv or sys.argv[1:])}, indent=1))
        plot(records, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
