"""The address of a plain_restart job's store, written by the controller, read by every rank.

on_failure="plain_restart" runs the groups as one torchtitan job without torchft: a plain
``torch.distributed`` process group over every rank, built through one store the controller
serves (:mod:`..control.plain_rendezvous`), joined by each rank (:mod:`..worker.plain_replication`).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEME = "plain://"


@dataclass(frozen=True)
class PlainAddress:
    """Where the job's store is and which start of the job this is: every restart of the job
    is a new generation, whose process groups use their own keys in the same store."""

    host: str
    port: int
    generation: int

    def __str__(self) -> str:
        return f"{SCHEME}{self.host}:{self.port}/{self.generation}"

    @staticmethod
    def parse(text: str) -> "PlainAddress":
        if not text.startswith(SCHEME):
            raise ValueError(f"not a plain_restart address: {text!r} (expected {SCHEME}HOST:PORT/GENERATION)")
        hostport, _, generation = text[len(SCHEME):].partition("/")
        host, _, port = hostport.rpartition(":")
        return PlainAddress(host, int(port), int(generation or 0))


def is_plain(address: str | None) -> bool:
    return bool(address) and str(address).startswith(SCHEME)
