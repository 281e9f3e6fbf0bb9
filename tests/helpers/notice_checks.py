"""Helpers for tests: the failure notices a notebook would show for a run, counted per fault.

The notices are the kernel's own (``FailureNotices``), watching the run's session as the
extension does; only the drawing is replaced by a list, so a test can count what was shown."""

from __future__ import annotations

from typing import Any

from monarch_nb.notebook.notices import FailureNotices, failure_text
from monarch_nb.telemetry.events import WorkerFailed


def watch_notices(run: Any) -> list[WorkerFailed]:
    """Every notice shown for ``run`` from now on (as if a cell were running the whole time)."""
    shown: list[WorkerFailed] = []
    notices = FailureNotices(show=shown.append)
    notices.watch(run.session)
    notices.pre_run_cell()
    return shown


def assert_one_notice(run: Any, shown: list[WorkerFailed], victim: int, t0: float, t1: float,
                      words: tuple[str, ...]) -> None:
    """One fault of group ``victim`` between ``t0`` and ``t1``: exactly one ``worker_failed`` event
    and one notice, both for that group, naming the fault (one of ``words``), then the action."""
    mesh = f"replica{victim}"
    events = [e for e in run.events.events(WorkerFailed) if t0 <= e.t <= t1 and not e.late]
    notes = [e for e in shown if t0 <= e.t <= t1]
    assert [e.mesh for e in events] == [mesh], [(e.mesh, e.reason) for e in events]
    assert [e.mesh for e in notes] == [mesh], [failure_text(e) for e in notes]
    text = failure_text(notes[0]).lower()
    assert any(w in text for w in words), text
    # the fault first, what the controller did after it (never only "Killed(sig=9)" of our teardown)
    assert notes[0].action and text.index(notes[0].reason.lower()[:20]) < text.index(notes[0].action.lower()), text
