"""Which torchft checkpoint transport a heal moves state through, and what each heal records.

torchft's Manager decides who heals, when and from which peer; a ``CheckpointTransport`` moves
the bytes. ``heal_transport`` picks one of three, each its own class: "striped" (ours,
``heal_transport.py``: every quorum member serves a verified stripe), "http" (torchft's: a
checkpoint server per rank, here advertising a reachable address) or "pg" (torchft's: over the
cross-replica process group the quorum just configured). Whichever it is, :class:`HealLog`
wraps its send and receive to mark the heal's phases (where faults aimed at a heal fire) and to
record what a received heal moved, which the ``healed`` event reports.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

from ... import seam
from ..settings.config import is_loopback
from .checkpointer import tensor_bytes

if TYPE_CHECKING:
    import torch
    from .heal_transport import HealRecord, QuorumPeers
    from torchft.checkpointing.transport import CheckpointTransport
    from torchft.process_group import ProcessGroup


def choose_transport(kind: str, host: str, pg: ProcessGroup, timeout: timedelta, *, device: torch.device,
                     serve: Callable[[], Any], peers: QuorumPeers, replica: int,
                     streams: int) -> CheckpointTransport[Any]:
    """The transport named ``kind`` ("striped", "pg", else "http"), serving on ``host``.

    Args:
        pg: the cross-replica process group ("pg" sends over it).
        timeout: of a heal's transfers.
        device: where received tensors go ("pg").
        serve: the state a striped donor serves, read when a peer asks.
        peers: the quorum's other members' heal addresses ("striped" publishes its own there).
        replica: this rank's group ("striped" names itself in its heal records).
        streams: connections per donor ("striped").
    """
    if kind == "pg":
        from torchft.checkpointing.pg_transport import PGTransport

        return PGTransport(pg, timeout=timeout, device=device)
    if kind == "striped":
        from .heal_transport import StripedTransport

        striped = StripedTransport(host, timeout, target=serve, peers=peers.addresses, replica=replica,
                                   streams_per_donor=streams)
        peers.mine = striped.metadata()
        return striped
    from torchft.checkpointing.http_transport import HTTPTransport

    class PeerTransport(HTTPTransport):
        def address(self) -> str:  # the node's reachable address, not its hostname
            return f"http://{host}:{seam.http_transport_port(self)}/checkpoint/"

    transport = PeerTransport(timeout=timeout, num_chunks=0)
    if is_loopback(host):  # peers are on this machine: nothing else may fetch our state
        seam.rebind_http_transport(transport, host)
    return transport


def _striped_info(record: HealRecord | None) -> dict[str, Any]:
    """What a striped heal adds to the ``healed`` event: its donors and where its time went."""
    if record is None:
        return {}
    return {"donors": record.donors, "transfer_s": record.seconds, "manifest_s": record.manifest_s,
            "fetch_s": record.fetch_s, "corrupt": len(record.corrupt), "passed_over": record.dropped}


class HealLog:
    """Wraps ``transport`` in place: its receive marks phase ``heal_recv``, reports each corrupt
    piece (``heal_corrupt``) and records what arrived; its send marks ``heal_send`` (a peer heals
    from us). ``phase`` is called with each phase's name; ``emit`` takes events."""

    def __init__(self, transport: CheckpointTransport[Any], phase: Callable[[str], None],
                 emit: Callable[[dict[str, Any]], None], replica: int, rank: int) -> None:
        self.transport, self._phase, self._emit = transport, phase, emit
        self.replica, self.rank = replica, rank
        self._received: dict[str, Any] | None = None
        recv, send = transport.recv_checkpoint, transport.send_checkpoint

        def recv_checkpoint(src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
            self._phase("heal_recv")
            t = time.time()
            try:
                state = recv(src_rank, metadata, step, timeout)
            finally:
                self._report_corrupt(self._striped_record(), step)
            self._received = {"seconds": time.time() - t, "bytes": tensor_bytes(state), "src_rank": src_rank,
                              "step": step, "striped": _striped_info(self._striped_record())}
            return state

        def send_checkpoint(*args: Any, **kwargs: Any) -> Any:  # we are a donor: a peer heals from us
            self._phase("heal_send")
            return send(*args, **kwargs)

        transport.recv_checkpoint = recv_checkpoint  # type: ignore[method-assign]
        transport.send_checkpoint = send_checkpoint  # type: ignore[method-assign]

    def _striped_record(self) -> HealRecord | None:
        return getattr(self.transport, "last", None)  # only a striped heal keeps one

    def take(self) -> dict[str, Any] | None:
        """What the last heal received (seconds, bytes, src_rank, step, striped); None: nothing."""
        received, self._received = self._received, None
        return received

    def _report_corrupt(self, record: HealRecord | None, step: int) -> None:
        """One ``heal_corrupt`` event per piece of a heal that arrived different from its donor's
        digest (it was refetched from another donor, or the heal failed)."""
        for bad in getattr(record, "corrupt", None) or []:
            self._emit({"kind": "heal_corrupt", "replica": self.replica, "rank": self.rank, "step": step,
                        "tensor": bad["tensor"], "offset": bad["offset"], "donor": bad["donor"],
                        "refetched_from": bad["refetched_from"], "t": time.time()})
