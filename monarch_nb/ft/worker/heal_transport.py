"""A heal that moves a live peer's state at the link's speed, verified, from every up-to-date
peer at once. It is a torchft ``CheckpointTransport``: torchft's Manager still decides who
heals, when, and from which peer; this decides how the bytes move.

Why not torchft's ``HTTPTransport``: it pickles the whole state through one stream and the
receiver builds new tensors that are then copied into the model (two extra passes over the
state, one connection, no check of what arrived). Here:
  * a donor serves raw tensor bytes straight from its live tensors (no copy on CPU; a piece at a
    time through a small staging buffer from an accelerator);
  * the receiver writes them straight into its own tensors, the state it is about to replace;
  * the state is cut into pieces (at most ``PIECE_BYTES`` of one tensor); the donor sends each
    piece followed by its xxh3-128 digest, computed from the donor's memory as it sends it (no
    pass over the whole state before the first byte moves); the receiver checks every piece,
    refetches a bad one from another donor (``corrupt`` in the heal's record) and never
    returns a state with a mismatch;
  * every member of the quorum at the heal's step serves it, and the receiver fetches disjoint
    parts from all of them in parallel (``peers``: their addresses, exchanged through the
    quorum's store). A donor that fails mid-heal only loses its share: the others refetch it.

Why the donors' state cannot move while they serve: a donor offers its state right after its
quorum, and ``should_commit`` (before the optimizer steps) takes the write lock, which waits
for reads in flight and refuses later ones. And it cannot get there earlier: the step's
gradient allreduce includes the healing group, which joins it only once its heal is done.
Donors are the quorum's members at the heal's step, which torchft keeps identical (and the
controller's identity checks prove it); only those whose manifest (the state's structure, its
tensors' shapes and dtypes, its pieces) matches torchft's chosen source's are used.

xxh3-128 (python-xxhash, maintained, ~14 GB/s on this box's cores): the check is against
corruption in transit or in a donor's buffers, not an adversary, so a non-cryptographic hash
with a vanishing collision rate costs ~0.1 s per GB instead of blake2b's ~1 s.
"""

from __future__ import annotations

import http.client
import pickle
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

import torch
import xxhash
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_dumps, treespec_loads
from torchft.checkpointing.transport import CheckpointTransport

PIECE_BYTES = 16 << 20  # the unit of checking, striping and retry
DIGEST_BYTES = 16  # xxh3-128, after each piece on the wire
IO_BLOCK = 4 << 20  # bytes per socket read/write
# How long the receiver waits for a peer other than torchft's chosen source to serve the heal's
# step: peers offer it right after their quorum, so a peer that does not within this is not
# at that step (it is healing too, or gone). The heal waits this long for such a peer before it
# starts, so it stays short: a slow peer only means one donor fewer.
PEER_WAIT_S = 0.5


def interface_address(name: str) -> str:
    """The IPv4 address of this node's interface ``name`` (``RunConfig.heal_interface``): what a
    worker serves and advertises heals on, so they go over that link and not over whatever the
    hostname resolves to (torchft issue #329)."""
    import psutil

    addrs = psutil.net_if_addrs()
    found = [a.address for a in addrs.get(name, []) if a.family == socket.AF_INET]
    if not found:
        have = ", ".join(f"{n} ({a})" for n, a in sorted((n, next((x.address for x in v if x.family == socket.AF_INET),
                                                                 "no IPv4")) for n, v in addrs.items()))
        raise ValueError(f"heal_interface: this node ({socket.gethostname()}) has no IPv4 interface {name!r}; "
                         f"it has {have}")
    return found[0]


class HealCorrupt(RuntimeError):
    """A piece of the state arrived different from every donor's digest of it: the heal fails
    (torchft reports the error, the step does not commit, the group heals again)."""


@dataclass(frozen=True)
class Piece:
    leaf: int  # index among the flattened state's leaves
    offset: int  # byte offset inside that tensor
    nbytes: int
    name: str  # the leaf's path in the state dict, for records


@dataclass
class Manifest:
    """What a donor serves at one step: the state's structure, its non-tensor values, and the
    pieces of its tensors (each sent with its digest)."""

    step: int
    replica: int | None
    spec: str  # the state's structure (torch pytree's treespec_dumps)
    values: list[Any]  # non-tensor leaves; None where a tensor is
    tensors: dict[int, tuple[str, tuple[int, ...]]]  # leaf -> (dtype, shape)
    pieces: list[Piece]

    def same_layout(self, other: "Manifest") -> bool:
        return (self.spec, self.tensors, self.pieces) == (other.spec, other.tensors, other.pieces)


@dataclass
class HealRecord:
    """What one heal moved, from whom, and where its time went (the ``healed`` event carries it)."""

    step: int
    bytes: int = 0
    seconds: float = 0.0
    manifest_s: float = 0.0
    fetch_s: float = 0.0
    donors: list[int | None] = field(default_factory=list)
    bytes_per_donor: list[int] = field(default_factory=list)
    corrupt: list[dict[str, Any]] = field(default_factory=list)  # {"tensor", "offset", "donor", "refetched_from"}
    dropped: list[dict[str, Any]] = field(default_factory=list)  # donors not used, and why


def _names(spec: Any, count: int) -> list[str]:
    """A readable path per leaf ("user/default/model/tok_embeddings.weight")."""
    from torch.utils._pytree import tree_flatten_with_path

    paths, _ = tree_flatten_with_path(tree_unflatten([0] * count, spec))
    return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) for path, _ in paths]


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view: writing it writes the tensor)."""
    return t.detach().reshape(-1).view(torch.uint8)


def _read(t: torch.Tensor, p: "Piece") -> torch.Tensor:
    """Piece ``p`` of tensor ``t`` on the host (a view of a contiguous CPU tensor: no copy)."""
    if not t.is_contiguous():
        t = t.contiguous()  # rare (a strided shard): a copy of this tensor per piece served
    data = _bytes_view(t)[p.offset:p.offset + p.nbytes]
    return data if data.device.type == "cpu" else data.cpu()


def _host_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.numpy()).cast("B")


def cut(values: list[Any], spec: Any, piece_bytes: int = PIECE_BYTES) -> tuple[list[Piece], dict[int, tuple[str, tuple[int, ...]]]]:
    """The pieces of the tensors among ``values`` (the same cut on donor and receiver)."""
    names = _names(spec, len(values))
    pieces, tensors = [], {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            tensors[i] = (str(v.dtype), tuple(v.shape))
            n = v.numel() * v.element_size()
            for off in range(0, n, piece_bytes) if n else ():
                pieces.append(Piece(i, off, min(piece_bytes, n - off), names[i]))
    return pieces, tensors


def stripes(pieces: list[Piece], parts: int) -> list[range]:
    """Split the pieces into ``parts`` contiguous ranges of about equal bytes (some may be empty)."""
    total = sum(p.nbytes for p in pieces)
    bounds, acc, start = [], 0, 0
    for i, p in enumerate(pieces):
        acc += p.nbytes
        if len(bounds) < parts - 1 and acc >= total * (len(bounds) + 1) / parts:
            bounds.append(range(start, i + 1))
            start = i + 1
    bounds.append(range(start, len(pieces)))
    return bounds + [range(len(pieces), len(pieces))] * (parts - len(bounds))


# A served state laid out: its leaves, spec, pieces, and tensors (leaf -> (dtype, shape))
_Layout = tuple[list[Any], Any, list[Piece], dict[int, tuple[str, tuple[int, ...]]]]


class StripedTransport(CheckpointTransport[Any]):
    """Serves this rank's state to healing peers and heals this rank from all of its peers.

    ``target()`` returns this rank's own state dict (torchft's manager state: the tensors a heal
    writes into); ``peers()`` the metadata of the other members of the current quorum;
    ``replica`` names this rank's group in the records."""

    def __init__(self, host: str, timeout: timedelta, target: Callable[[], Any],
                 peers: Callable[[], list[str]], replica: int | None = None, streams_per_donor: int = 4,
                 piece_bytes: int = PIECE_BYTES) -> None:
        self._host, self._timeout, self._target, self._peers = host, timeout, target, peers
        self.replica, self.streams_per_donor, self.piece_bytes = replica, streams_per_donor, piece_bytes
        # what is served while a step's state may be read (else None); readers in flight are
        # counted so that disallow_checkpoint waits for them
        self._cond = threading.Condition()
        self._serving: tuple[int, Any] | None = None  # (step, state dict or a function returning it)
        self._layout: _Layout | None = None  # its leaves, spec, pieces and tensors
        self._readers = 0
        self._manifest: bytes | None = None
        self._corrupt_next = False
        self.last: HealRecord | None = None  # the newest heal this rank received
        self._server = _Server((host, 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="heal-server",
                                        daemon=True)
        self._thread.start()

    # ---- the donor side ------------------------------------------------------------------

    def metadata(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        self.offer(step, state_dict)

    def offer(self, step: int, state_dict: Any) -> None:
        """Serve ``state_dict`` (live tensors, not copied; or a function that returns them, called
        only if a peer asks) as the state at ``step`` until the next ``disallow_checkpoint``."""
        with self._cond:
            if self._serving is not None and self._serving[0] == step:
                return
            self._serving, self._layout, self._manifest = (step, state_dict), None, None
            self._cond.notify_all()

    def _laid_out(self, serving: tuple[int, Any]) -> "_Layout":
        """The served state's leaves, spec, pieces and tensors (once per offer, on first read)."""
        with self._cond:
            if self._layout is not None and self._serving is serving:
                return self._layout
            state = serving[1]() if callable(serving[1]) else serving[1]
            leaves, spec = tree_flatten(state)
            layout = (leaves, spec, *cut(leaves, spec, self.piece_bytes))
            if self._serving is serving:
                self._layout = layout
            return layout

    def disallow_checkpoint(self) -> None:
        """The state is about to change (torchft calls this in ``should_commit``): refuse new
        reads and wait for the ones in flight."""
        with self._cond:
            self._serving, self._layout, self._manifest = None, None, None
            self._cond.wait_for(lambda: self._readers == 0, timeout=self._timeout.total_seconds())

    def corrupt_next_send(self) -> None:
        """Fault injection: flip one byte of the next piece this rank serves (in transit only)."""
        self._corrupt_next = True

    def reading(self, step: int, wait_s: float) -> "_Reading":
        """A context in which the state at ``step`` stays served (waits up to ``wait_s`` for it)."""
        return _Reading(self, step, wait_s)

    def manifest_bytes(self, serving: tuple[int, Any]) -> bytes:
        """The pickled manifest of the state being read (once per step)."""
        with self._cond:
            if self._manifest is not None and self._serving is serving:
                return self._manifest
        step = serving[0]
        leaves, spec, pieces, tensors = self._laid_out(serving)
        values = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        body = pickle.dumps(Manifest(step, self.replica, treespec_dumps(spec), values, tensors, pieces))
        with self._cond:
            if self._serving is serving:
                self._manifest = body
        return body

    def write_pieces(self, serving: tuple[int, Any], first: int, stop: int, out: Any) -> None:
        """Write pieces ``first..stop-1`` of the state being read to ``out``, each followed by
        its digest."""
        leaves, _, pieces, _ = self._laid_out(serving)
        for p in pieces[first:stop]:
            data = _read(leaves[p.leaf], p)
            digest = xxhash.xxh3_128_digest(_host_view(data))
            if self._corrupt_next:  # the fault: after the digest, as a bad link or NIC would
                self._corrupt_next = False
                data = data.clone()
                data[0] ^= 0xFF
            view = _host_view(data)
            for off in range(0, len(view), IO_BLOCK):
                out.write(view[off:off + IO_BLOCK])
            out.write(digest)

    # ---- the receiving side --------------------------------------------------------------

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        t0 = time.perf_counter()
        record = self.last = HealRecord(step=step)  # also when it fails: its corrupt pieces are reported
        addresses = [metadata] + [a for a in self._peers() if a != metadata and a != self.metadata()]
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            waits = [timeout.total_seconds()] + [PEER_WAIT_S] * (len(addresses) - 1)
            fetched = list(pool.map(lambda a, w: _get_manifest(a, step, timeout, w), addresses, waits))
        source = fetched[0]
        if isinstance(source, Exception) or source is None:
            raise RuntimeError(f"heal: the source {metadata} does not serve step {step}: {source}")
        donors: list[tuple[str, Manifest]] = [(metadata, source)]
        for addr, m in zip(addresses[1:], fetched[1:]):
            former_self = isinstance(m, Manifest) and self.replica is not None and m.replica == self.replica
            if isinstance(m, Manifest) and m.same_layout(source) and not former_self:
                donors.append((addr, m))
            else:
                # A peer naming this group is its former process, being replaced (a deleted pod
                # lives on for a moment after the controller failed it): never a donor.
                why = "not at this step" if m is None else ("unreachable" if isinstance(m, Exception) else
                                                            "a former process of this group" if former_self
                                                            else "its state is laid out differently")
                record.dropped.append({"donor": getattr(m, "replica", None), "address": addr, "why": why})
        record.manifest_s = time.perf_counter() - t0

        leaves, spec = tree_flatten(self._target())
        if treespec_dumps(spec) != source.spec:
            # The donor's state holds parts ours does not have yet (DiLoCo's outer optimizer makes
            # its momentum at its first step): receive into new tensors rather than in place.
            spec = treespec_loads(source.spec)
            leaves = [torch.empty(source.tensors[i][1], dtype=getattr(torch, source.tensors[i][0].split(".")[-1]))
                      if i in source.tensors else v for i, v in enumerate(source.values)]
        for i, (dtype, shape) in source.tensors.items():
            mine = leaves[i]
            if not isinstance(mine, torch.Tensor) or (str(mine.dtype), tuple(mine.shape)) != (dtype, shape):
                raise ValueError(f"heal: leaf {i} of the state differs from the donor's ({dtype}, {shape})")
        sink = _Sink(leaves, source.pieces)
        t1 = time.perf_counter()
        self._fetch_all(donors, source, step, timeout, sink, record)
        sink.finish()
        record.fetch_s = time.perf_counter() - t1
        values = [leaves[i] if i in source.tensors else v for i, v in enumerate(source.values)]
        record.seconds = time.perf_counter() - t0
        record.bytes = sum(p.nbytes for p in source.pieces)
        return tree_unflatten(values, spec)

    def _fetch_all(self, donors: list[tuple[str, Manifest]], source: Manifest, step: int, timeout: timedelta,
                   sink: "_Sink", record: HealRecord) -> None:
        """Fetch every piece once, striped over the donors; then refetch the bad or missing ones
        from donors that did not supply them, until each is verified or no donor is left."""
        k, s = len(donors), max(1, self.streams_per_donor)
        parts = stripes(source.pieces, k * s)
        jobs = [(j % k, r) for j, r in enumerate(parts) if len(r)]
        record.donors = [m.replica for _, m in donors]
        record.bytes_per_donor = [0] * k
        failed: dict[int, set[int]] = {}  # piece -> donors that failed it
        unmended: dict[int, list[dict[str, Any]]] = {}  # piece -> its corrupt records, until it verifies
        lock = threading.Lock()

        def run(d: int, pieces: list[int]) -> None:
            for i, ok in _fetch(donors[d][0], step, pieces, source, sink, timeout):
                with lock:
                    if ok:
                        record.bytes_per_donor[d] += source.pieces[i].nbytes
                        for bad in unmended.pop(i, []):
                            bad["refetched_from"] = donors[d][1].replica
                    else:
                        failed.setdefault(i, set()).add(d)
                        if ok is False:
                            bad = {"tensor": source.pieces[i].name, "offset": source.pieces[i].offset,
                                   "donor": donors[d][1].replica, "refetched_from": None}
                            record.corrupt.append(bad)
                            unmended.setdefault(i, []).append(bad)

        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            list(pool.map(lambda job: run(job[0], list(job[1])), jobs))
        while failed:
            retry: dict[int, list[int]] = {}
            for i, bad in failed.items():
                left = [d for d in range(k) if d not in bad]
                if not left:
                    raise HealCorrupt(f"heal: piece {source.pieces[i].name}@{source.pieces[i].offset} did not verify "
                                      f"from any donor ({[donors[d][1].replica for d in bad]})")
                retry.setdefault(left[i % len(left)], []).append(i)
            before = dict(failed)
            failed = {}
            for d, pieces in retry.items():
                run(d, pieces)
            for i in list(failed):
                failed[i] |= before.get(i, set())

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join(timeout=5)


class QuorumPeers:
    """The heal addresses of the other members of this rank's current quorum, exchanged through
    the quorum's store: every member's process group connects to it under a prefix that names
    the quorum and this rank's place in its group, so the keys are the members' replica ranks."""

    def __init__(self, timeout: timedelta) -> None:
        self.mine: str | None = None  # this rank's address; None: nothing to exchange
        self._timeout = timeout
        self._store: Any = None
        self._rank, self._world = 0, 0

    def join(self, store_addr: str, rank: int, world_size: int) -> None:
        """Called once the quorum's process group is configured: publish our address."""
        if self.mine is None:
            return
        from torchft.process_group import create_store_client

        store = create_store_client(f"{store_addr}/heal", timeout=self._timeout)
        store.set(str(rank), self.mine)
        self._store, self._rank, self._world = store, rank, world_size

    def addresses(self) -> list[str]:
        """The other members' addresses (those published within ``PEER_WAIT_S``)."""
        store = self._store
        if store is None:
            return []
        keys = [str(r) for r in range(self._world) if r != self._rank]
        try:
            store.wait(keys, timedelta(seconds=PEER_WAIT_S))
        except Exception:  # noqa: BLE001 - a member that died before publishing is no donor
            pass
        return [store.get(k).decode() for k in keys if store.check([k])]


class _Sink:
    """Where received pieces land: straight in the receiver's tensors (through a staging buffer
    per piece when they live on an accelerator)."""

    def __init__(self, leaves: list[Any], pieces: list[Piece]) -> None:
        self.pieces = pieces
        # a strided destination (rare) receives into a contiguous buffer, copied in at the end
        self._strided = {i: (leaves[i], leaves[i].contiguous()) for i in {p.leaf for p in pieces}
                         if not leaves[i].is_contiguous()}
        self._views = {p.leaf: _bytes_view(self._strided[p.leaf][1] if p.leaf in self._strided else leaves[p.leaf])
                       for p in pieces}

    def buffer(self, i: int) -> tuple[memoryview, Callable[[], None]]:
        p = self.pieces[i]
        dst = self._views[p.leaf][p.offset:p.offset + p.nbytes]
        if dst.device.type == "cpu":
            return _host_view(dst), lambda: None
        staging = torch.empty(p.nbytes, dtype=torch.uint8)
        return _host_view(staging), lambda: dst.copy_(staging)

    def finish(self) -> None:
        with torch.no_grad():
            for dst, buf in self._strided.values():
                dst.copy_(buf)
        if any(v.device.type != "cpu" for v in self._views.values()):
            torch.accelerator.synchronize()


def _connection(address: str, timeout: timedelta) -> http.client.HTTPConnection:
    url = urlsplit(address)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout.total_seconds())


def _get_manifest(address: str, step: int, timeout: timedelta, wait_s: float) -> Manifest | Exception | None:
    """The donor's manifest at ``step``; None if it does not serve that step within ``wait_s``."""
    try:
        conn = _connection(address, timeout)
        conn.request("GET", f"/heal/{step}/manifest?wait={wait_s:g}")
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return pickle.loads(body) if resp.status == 200 else None
    except Exception as e:  # a peer that died or left: it is not a donor
        return e


def _fetch(address: str, step: int, pieces: list[int], source: Manifest, sink: _Sink, timeout: timedelta):
    """Fetch ``pieces`` (contiguous runs, one request each) from one donor into the sink; yields
    (piece, True) when it verified, (piece, False) when its digest did not match, (piece, None)
    when the donor could not deliver it."""
    runs: list[list[int]] = []
    for i in pieces:
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in runs:
        done = 0
        try:
            conn = _connection(address, timeout)
            conn.request("GET", f"/heal/{step}/pieces/{run[0]}/{run[-1] + 1}")
            resp = conn.getresponse()
            if resp.status != 200:
                raise ConnectionError(f"{address} answered {resp.status}")
            for i in run:
                view, land = sink.buffer(i)
                got = 0
                while got < len(view):
                    n = resp.readinto(view[got:got + IO_BLOCK])
                    if not n:
                        raise ConnectionError(f"{address} closed the stream")
                    got += n
                digest = resp.read(DIGEST_BYTES)
                if len(digest) != DIGEST_BYTES:
                    raise ConnectionError(f"{address} closed the stream")
                land()
                done += 1
                yield i, xxhash.xxh3_128_digest(view) == digest
            conn.close()
        except Exception:
            for i in run[done:]:
                yield i, None


class _Reading:
    def __init__(self, transport: StripedTransport, step: int, wait_s: float) -> None:
        self.t, self.wanted, self.wait_s = transport, step, wait_s

    def __enter__(self) -> tuple[int, Any] | None:
        t = self.t
        with t._cond:
            self.ok = t._cond.wait_for(lambda: t._serving is not None and t._serving[0] == self.wanted,
                                       timeout=self.wait_s)
            if self.ok:
                t._readers += 1
            return t._serving if self.ok else None

    def __exit__(self, *exc: Any) -> None:
        if self.ok:
            with self.t._cond:
                self.t._readers -= 1
                self.t._cond.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def _handler(transport: StripedTransport) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = transport._timeout.total_seconds()

        def log_message(self, *args: Any) -> None:  # no line on stderr per request
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            query = dict(kv.split("=", 1) for kv in url.query.split("&") if "=" in kv)
            usage = "expected /heal/STEP/manifest[?wait=S] or /heal/STEP/pieces/FIRST/STOP"
            if len(parts) < 3 or parts[0] != "heal" or not parts[1].isdigit():
                self.send_error(400, usage)
                return
            step, wait_s = int(parts[1]), float(query.get("wait", 0))
            try:
                with transport.reading(step, wait_s) as serving:
                    if not serving:
                        self.send_error(409, f"not serving step {step}")
                    elif parts[2] == "manifest":
                        body = transport.manifest_bytes(serving)
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    elif parts[2] == "pieces" and len(parts) == 5:
                        self.send_response(200)
                        self.end_headers()
                        transport.write_pieces(serving, int(parts[3]), int(parts[4]), self.wfile)
                    else:
                        self.send_error(400, usage)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the receiver went away (it died, or gave this share to another donor)

    return Handler
