"""The cross-group communicator in a subprocess (``pg_subprocess``): torchft's ProcessGroupBabyGloo /
BabyNCCL, with three differences that let the ladder's communicator rung drive it like the others.

* Its futures are complete when handed out. torchft 0.2.0's ``_ManagedWork._set_future_callback``
  chains callbacks in a loop whose closure reads the loop variable: a future that completes after
  the loop moved on (a Baby group's completes on its future thread) runs the tail's callback, which
  is None, and every allreduce fails with an empty AssertionError. A done future runs its callback
  inside ``then``, before the loop moves.
* ``abort`` kills the subprocess (the Baby groups' own is the base class's no-op; their
  ``shutdown`` kills) and reaps it; the next reconfigure starts a new one.
* ``_pg`` is None while no subprocess runs: what ``seam.process_group_is_down`` reads of a
  torchft group whose inner group is gone.

Module level: the subprocess unpickles the class by its name.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupBabyNCCL


class _InPlaceRung:
    _p: Any

    def _get_future(self, op_id: int, stream: Any) -> Any:
        pending = super()._get_future(op_id, stream)  # type: ignore[misc]
        done: Any = torch.futures.Future()
        try:
            done.set_result(pending.wait())
        except Exception as exc:  # noqa: BLE001 - the collective's own error, handed on
            done.set_exception(exc)
        return done

    def abort(self, errored: bool = True) -> None:
        self.shutdown()  # type: ignore[attr-defined]
        if self._p is not None:
            self._p.join(timeout=5.0)

    @property
    def _pg(self) -> Any:
        return self._p if self._p is not None and self._p.is_alive() else None


class BabyGloo(_InPlaceRung, ProcessGroupBabyGloo):
    pass


class BabyNCCL(_InPlaceRung, ProcessGroupBabyNCCL):
    pass


def subprocess_process_group(nccl: bool, timeout: timedelta) -> Any:
    return (BabyNCCL if nccl else BabyGloo)(timeout=timeout)
