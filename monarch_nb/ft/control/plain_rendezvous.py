"""on_failure="plain_restart": the job's store, served by the controller (where torchrun's c10d
rendezvous would be). Every start of the job is a generation whose process groups use their
own keys in the same store (:mod:`..spec.plain_address`)."""

from __future__ import annotations

from datetime import timedelta

from ..settings.plain_address import PlainAddress


class PlainRendezvous:
    """The job's TCPStore, served by the controller; workers connect as clients."""

    def __init__(self, host: str) -> None:
        from torch.distributed import TCPStore

        self.host = host
        self._store = TCPStore(host, 0, world_size=None, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        self.port = int(self._store.port)

    def address(self, generation: int) -> str:
        return str(PlainAddress(self.host, self.port, generation))

    def stop(self) -> None:
        self._store = None  # the listener closes with the store
