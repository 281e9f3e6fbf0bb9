"""How fast state can move on this machine, and how fast torchft's transports move it: the
references a heal is measured against (issue: heal at the machine's limit).

For each state size (GB), side by side in one invocation:
  memcpy          one copy of the state in memory (torch ``copy_``): no heal beats it
  loopback_1      the state's bytes through one loopback TCP stream (sender and receiver are
                  two threads of this process; sockets release the GIL)
  loopback_N      the same split over N parallel streams (``--streams``)
  torchft_http    torchft's ``HTTPTransport`` send/recv of a state dict of 3 MB tensors, as its
                  own ``http_transport_bench`` does it (``num_chunks`` 0), and chunked (N)
Each record: ``{"path", "size_gb", "gbps", "seconds", "donors", "donor_extra_rss_gb"}`` (donors
and the donor's extra RSS apply to heals and are null here). The heal itself (``heal``,
``heal_striped``: a run, a kill, ``healed`` with the donor training) is not measured by this
script yet.

Usage: python bench/bench_heal.py [--sizes 0.1,1] [--quick] [--streams 4] [--out FILE.json]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.1,1,4", help="GB of state, comma-separated")
    p.add_argument("--quick", action="store_true", help="sizes 0.1 and 1 GB")
    p.add_argument("--streams", type=int, default=4)
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
    if a.out:
        Path(a.out).write_text(json.dumps({"records": records, "args": vars(a)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
