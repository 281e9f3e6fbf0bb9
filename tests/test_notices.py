"""Failure notices in the notebook (monarch_nb.notebook.notices), fed events by hand: one per
failed rank, the fault first and the action after it, and never one for our own teardowns."""

from __future__ import annotations

from monarch_nb.notebook.html import failure_html
from monarch_nb.notebook.notices import FailureNotices, failure_text
from monarch_nb.telemetry.events import WorkerExitReported, WorkerFailed

FAULT = WorkerFailed(mesh="replica1", rank=0, reason="RuntimeError: injected exception at step 7",
                     action="its group is torn down and replaced")


def test_a_notice_names_the_fault_then_what_the_controller_does():
    text = failure_text(FAULT)
    assert text.index("injected exception") < text.index("torn down and replaced") < text.index("%monarch logs")
    html = failure_html(FAULT.mesh, FAULT.rank, FAULT.reason, FAULT.action)
    assert "injected exception" in html and "torn down and replaced" in html and "%monarch replace" not in html
    # a mesh nobody replaces: the notice says how to
    assert "%monarch replace main" in failure_html("main", 2, "Killed(sig=9)")


def test_accounts_of_our_own_teardowns_are_never_shown_and_failures_between_cells_wait_for_the_next():
    shown = []
    notices = FailureNotices(show=shown.append)
    notices.notify(FAULT)  # no cell is running: held for the next one
    notices.notify(WorkerExitReported(mesh="replica1", rank=0, reason="Killed(sig=9)"))
    notices.notify(WorkerFailed(mesh="replica1", rank=0, reason="Killed(sig=9)", late=True))  # an old log's kind
    assert shown == []
    notices.pre_run_cell()
    assert shown == [FAULT]
    notices.notify(WorkerExitReported(mesh="spare3", rank=0, reason="Stopped(exit=0)"))
    assert shown == [FAULT]


def test_failures_while_no_cell_runs_are_held_up_to_a_bound_and_the_rest_counted(monkeypatch):
    from monarch_nb.notebook import notices as notices_mod

    more = []
    monkeypatch.setattr(notices_mod, "show_more", more.append)
    shown = []
    notices = FailureNotices(show=shown.append)
    failures = [WorkerFailed(mesh=f"replica{i % 3}", rank=0, reason=f"fault {i}") for i in range(notices_mod.HELD + 7)]
    for f in failures:
        notices.notify(f)
    notices.pre_run_cell()
    assert more == [7] and shown == failures[7:]
    notices.post_run_cell()
    notices.pre_run_cell()
    assert more == [7] and shown == failures[7:]  # shown once
