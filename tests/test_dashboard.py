"""The dashboard's model and widgets, without a kernel: feed telemetry events, read what shows.

Event sequences here are synthetic on purpose: they specify what the dashboard must show for a
given history, independent of how a run produced it.
"""

from __future__ import annotations

import threading
import time

import pytest

from monarch_nb.ft.control.groups import GROUP_STATES
from monarch_nb.notebook.dashboard import Dashboard
from monarch_nb.notebook.dashboard_model import DashboardModel
from monarch_nb.notebook.dashboard_render import health_html, recoveries_html
from monarch_nb.notebook.palette import STATE_STYLES
from helpers.proc_checks import wait_for
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.events import (
    FailureDetected,
    FaultInjected,
    GaveUp,
    HealCorrupt,
    Healed,
    Quorum,
    Rejoined,
    ReplicasIdentical,
    ReplicaState,
    Respawned,
    RunStarted,
    RunStopped,
    Step,
    Validated,
)

T0 = 1_700_000_000.0


def healthy_run(replicas: int = 3, group_size: int = 2, steps: int = 10) -> list:
    evs = [RunStarted(t=T0, run_id="r", config={"replicas": replicas, "group_size": group_size})]
    evs += [ReplicaState(t=T0 + 0.1, replica=r, state="training") for r in range(replicas)]
    evs.append(Quorum(t=T0 + 0.2, quorum_id=1, participants=list(range(replicas))))
    for s in range(steps):
        for r in range(replicas):
            evs.append(Step(t=T0 + 1 + s, replica=r, step=s, loss=3.0 - 0.1 * s + 0.01 * r,
                            tokens_per_s=1000.0, committed=True, quorum_id=1, participants=replicas))
    return evs


def kill_and_recover(replica: int = 1, at: float = T0 + 20) -> list:
    return [
        FaultInjected(t=at, fault="kill", replica=replica, rank=1, step=10),
        FailureDetected(t=at + 0.5, replica=replica, rank=1, reason="SIGKILL", detection_s=0.5),
        ReplicaState(t=at + 0.5, replica=replica, state="failed", detail="SIGKILL"),
        Quorum(t=at + 1.0, quorum_id=2, participants=[r for r in range(3) if r != replica]),
        ReplicaState(t=at + 0.6, replica=replica, state="respawning"),
        Respawned(t=at + 3.0, replica=replica, attempt=1, seconds=2.4),
        ReplicaState(t=at + 3.0, replica=replica, state="healing"),
        Healed(t=at + 3.1, replica=replica, step=12, bytes=2_000_000, seconds=0.05, source_replica=0),
        Rejoined(t=at + 3.6, replica=replica, step=13, seconds_since_failure=3.6),
        ReplicaState(t=at + 3.6, replica=replica, state="training"),
        Quorum(t=at + 3.7, quorum_id=3, participants=[0, 1, 2]),
    ]


def model_of(events) -> DashboardModel:
    m = DashboardModel()
    m.apply_all(events)
    return m


def cells_of(m: DashboardModel, replica: int, now: float = T0 + 100):
    return [c for c in m.health_cells(now) if c.replica == replica]


# ---- the model ----------------------------------------------------------------------------


def test_grid_has_one_cell_per_process_of_every_configured_group():
    m = model_of(healthy_run(replicas=3, group_size=2))
    cells = m.health_cells(T0 + 11)
    assert [(c.replica, c.rank) for c in cells] == [(r, k) for r in range(3) for k in range(2)]
    assert {c.state for c in cells} == {"training"}
    assert {c.last_committed_step for c in cells} == {9}
    assert cells[0].heartbeat_age_s == pytest.approx(1.0)


def test_failure_turns_the_groups_cells_red_and_names_the_dead_rank():
    m = model_of(healthy_run() + kill_and_recover()[:3])
    failed = cells_of(m, 1)
    assert {c.state for c in failed} == {"failed"}
    assert {c.style.background for c in failed} == {STATE_STYLES["failed"].background}
    assert failed[1].style.background.lower() == "#d32f2f"  # red
    assert "FAILED" in failed[1].text and "rank 1 died: SIGKILL" in failed[1].text
    assert "rank 1 died" in failed[0].detail  # the survivor rank of the group says why it is down
    # other groups are untouched
    assert {c.state for c in cells_of(m, 0)} == {"training"}
    html = health_html(m.health_cells(T0 + 100))
    assert "data-replica='1' data-rank='1' data-state='failed'" in html
    assert "\u2717 FAILED" in html  # glyph + word, not colour alone


def test_every_group_state_has_a_distinct_colour_glyph_and_word():
    styles = [STATE_STYLES[s] for s in GROUP_STATES]
    assert len({s.background for s in styles}) == len(GROUP_STATES)
    assert len({s.glyph for s in styles}) == len(GROUP_STATES)
    assert len({s.label.lower() for s in styles}) == len(GROUP_STATES)


def test_heal_adds_a_marker_and_the_group_is_training_again():
    before = model_of(healthy_run() + kill_and_recover()[:6])
    assert [m.kind for m in before.markers] == ["fault"]
    after = model_of(healthy_run() + kill_and_recover())
    kinds = [(m.kind, m.replica, m.step) for m in after.markers]
    assert kinds == [("fault", 1, 10), ("heal", 1, 12)]
    assert {c.state for c in cells_of(after, 1)} == {"training"}


def test_a_heal_with_no_fault_says_why_in_the_log():
    """A group nobody failed healed from a peer on a busy box: the dashboard says it was left out
    of the quorum, how far behind and for how long, instead of a bare "healed"."""
    needless = Healed(t=T0 + 20, replica=2, step=40, bytes=1000, seconds=0.1, source_replica=0,
                      cause="left out of the quorum with no fault: steps 37-40 committed without it, "
                            "2.3 s after its last commit", from_step=36, unheard_s=2.3)
    m = model_of(healthy_run() + [needless])
    (line,) = [entry.text for entry in m.log if "healed" in entry.text]
    assert "group 2 healed from group 0 at step 40" in line and "left out of the quorum with no fault" in line
    ordinary = model_of(healthy_run() + kill_and_recover())
    assert not [e for e in ordinary.log if "left out" in e.text]


def test_recovery_lists_each_phase_with_its_duration():
    m = model_of(healthy_run() + kill_and_recover())
    (rec,) = m.recoveries
    assert rec.status == "recovered" and rec.fault == "kill" and rec.rank == 1
    durations = rec.durations()
    # each phase from the previous one's end, so they add up to the total; this log has no
    # teardown or acquire events, so the build phase runs from the detection
    assert durations["teardown"] is None and durations["acquire"] is None
    known = {k: v for k, v in durations.items() if v is not None}
    assert known == pytest.approx({"detect": 0.5, "build": 2.5, "heal": 0.1, "rejoin": 0.5})
    assert sum(known.values()) == pytest.approx(rec.total_s) and rec.total_s == pytest.approx(3.6)
    # what the events measured themselves (the transfer alone) is kept too
    assert {p.name: p.reported_s for p in rec.phases()}["heal"] == pytest.approx(0.05)
    html = recoveries_html(m.recoveries, m.started_t)
    assert "data-phase='build' data-seconds='2.500'" in html and "recovered" in html
    assert "transfer 0.05 s" in html


def test_a_striped_heal_shows_its_donors_bandwidth_and_refetched_pieces():
    events = healthy_run() + kill_and_recover()
    i = next(i for i, e in enumerate(events) if isinstance(e, Healed))
    h = events[i]
    events[i] = Healed(t=h.t, replica=h.replica, step=h.step, bytes=h.bytes, seconds=h.seconds, source_replica=0,
                       donors=[0, 2], gbps=2.5, corrupt=1)
    events.insert(i, HealCorrupt(t=h.t - 0.01, replica=h.replica, rank=0, step=h.step, tensor="user/default/model/w",
                                 offset=0, donor=2, refetched_from=0))
    m = model_of(events)
    html = recoveries_html(m.recoveries, m.started_t)
    assert "1.9 MB from 0, 2 at 2.50 GB/s, 1 corrupt refetched" in html, html  # fmt_bytes: MiB
    lines = [line.text for line in m.log]
    assert "group 1 rank 0: a piece of user/default/model/w from group 2 failed its digest check; refetched from " \
           "group 0" in lines
    assert any(t.startswith("group 1 healed from groups 0, 2 at step 12") and "(2.50 GB/s)" in t for t in lines), lines


def test_recovery_in_progress_reports_the_phase_it_waits_for():
    evs = healthy_run() + kill_and_recover()
    m = model_of(evs[:-5])  # up to Respawned
    assert m.recoveries[0].status == "healing"
    durations = m.recoveries[0].durations()
    assert durations["build"] == pytest.approx(2.5) and durations["heal"] is None and durations["rejoin"] is None


def test_duplicate_failure_reports_are_one_failure():
    evs = healthy_run() + kill_and_recover()[:2]
    evs.append(FailureDetected(t=T0 + 20.6, replica=1, rank=1, reason="SIGKILL (logger mesh)"))
    m = model_of(evs)
    assert len(m.recoveries) == 1 and m.recoveries[0].reason == "SIGKILL"


def test_unplanned_failure_gets_its_own_recovery_and_marker():
    evs = healthy_run() + [FailureDetected(t=T0 + 30, replica=2, rank=None, reason="segfault")]
    m = model_of(evs)
    assert m.recoveries[0].fault is None and m.recoveries[0].status == "respawning"
    assert [mk.kind for mk in m.markers] == ["failure"]


def test_semi_synchronous_meetings_are_marked_once_each_on_the_loss_plot():
    """LocalSGD / DiLoCo: every group reports the meeting step; the plot marks each meeting once,
    and a failed meeting (synced False) not at all."""
    evs = healthy_run()
    for step, synced in ((20, True), (40, False), (60, True)):
        evs += [Step(t=T0 + 40 + step / 10 + r / 100, replica=r, step=step, loss=3.0, tokens_per_s=1.0,
                     committed=True, synced=synced) for r in range(3)]
    m = model_of(evs)
    assert [(mk.kind, mk.step) for mk in m.markers if mk.kind == "meeting"] == [("meeting", 20), ("meeting", 60)]
    from monarch_nb.notebook.dashboard_render import plot_legend_html

    assert "groups met" in plot_legend_html(m.plot_data())


def test_gave_up_keeps_the_group_failed_after_the_run_stops():
    evs = healthy_run() + kill_and_recover()[:3] + [GaveUp(t=T0 + 40, replica=1, attempts=3),
                                                   RunStopped(t=T0 + 41, run_id="r")]
    m = model_of(evs)
    assert m.recoveries[0].status == "gave up"
    assert {c.state for c in cells_of(m, 1)} == {"failed"}
    assert {c.state for c in cells_of(m, 0)} == {"stopped"}
    # heartbeat ages of a stopped run are measured to the stop, not to the wall clock
    assert cells_of(m, 0, now=T0 + 10_000)[0].heartbeat_age_s == pytest.approx(31.0)


def test_quorum_summary_counts_participants_and_committed_steps():
    evs = healthy_run(steps=4) + kill_and_recover()[:4]
    evs.append(Step(t=T0 + 22, replica=0, step=4, loss=2.5, tokens_per_s=1.0, committed=False,
                    quorum_id=2, participants=2))
    q = model_of(evs).quorum_summary()
    assert (q.quorum_id, q.participants, q.total_groups) == (2, 2, 3)
    assert (q.steps_committed, q.steps_attempted) == (12, 13)
    assert "2/3 groups" in q.text and "committed 12/13" in q.text


def test_global_loss_is_the_mean_of_committed_losses_per_step():
    evs = healthy_run(replicas=2, steps=2)
    evs.append(Step(t=T0 + 5, replica=0, step=2, loss=9.0, tokens_per_s=1.0, committed=False))
    m = model_of(evs)
    steps, losses = zip(*m.global_loss())
    assert steps == (0, 1) and losses == pytest.approx([3.005, 2.905])
    assert len(m.loss_series()[0]) == 3  # the dropped step is kept per group, not in the global line


def test_a_drained_groups_last_step_is_not_drawn_as_a_dropped_step():
    from monarch_nb.notebook.dashboard_curves import LossCurves

    curves = LossCurves()
    curves.add(Step(t=T0, replica=1, step=7, loss=2.0, tokens_per_s=1.0, committed=False, left=True))
    curves.add(Step(t=T0, replica=2, step=7, loss=2.0, tokens_per_s=1.0, committed=False))
    assert 1 not in curves.dropped and list(curves.dropped[2]) == [(7, 2.0)]


def test_replicas_identical_shows_in_the_event_log():
    m = model_of(healthy_run() + [ReplicasIdentical(t=T0 + 50, step=9, identical=True, hashes={"0": "a"})])
    assert "bit-identical" in m.event_log()[-1].text


# ---- the widgets --------------------------------------------------------------------------


class FakeRun:
    def __init__(self):
        self.calls = []
        self.called = threading.Event()

    def inject(self, kind, replica):
        self.calls.append(("inject", kind, replica))
        self.called.set()

    def stop(self):
        self.calls.append(("stop",))
        self.called.set()


def store_of(events) -> EventStore:
    s = EventStore()
    for e in events:
        s.append(e)
    return s


def test_dashboard_replays_history_before_it_is_displayed():
    d = Dashboard(store_of(healthy_run() + kill_and_recover()[:4]))
    try:
        assert "data-replica='1' data-rank='1' data-state='failed'" in d.health.value
        assert "data-participants='2'" in d.quorum.value
        assert bytes(d.plot.value).startswith(b"\x89PNG")
        assert "data-points='30'" in d.plot_caption.value
        assert "data-status='respawning'" in d.timeline.value
        bundle = d._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
    finally:
        d.close()


def test_live_events_reach_the_widgets_from_a_writer_thread():
    store = store_of(healthy_run())
    d = Dashboard(store, max_hz=50)
    seen = threading.Event()
    d.health.observe(lambda ch: "data-state='failed'" in ch["new"] and seen.set(), "value")
    try:
        writer = threading.Thread(target=lambda: [store.append(e) for e in kill_and_recover()[:3]])
        writer.start()
        writer.join()
        assert seen.wait(5), "the failed cell never reached the health widget"
        healed = threading.Event()
        d.plot_caption.observe(lambda ch: "data-markers='2'" in ch["new"] and healed.set(), "value")
        threading.Thread(target=lambda: [store.append(e) for e in kill_and_recover()[3:]]).start()
        assert healed.wait(10), "the heal marker never reached the plot"
    finally:
        d.close()


def test_a_burst_of_events_is_throttled_per_widget():
    store = store_of(healthy_run(steps=1))
    d = Dashboard(store, max_hz=10, heartbeat_interval_s=0)
    counts = {"health": 0, "quorum": 0}
    d.health.observe(lambda ch: counts.__setitem__("health", counts["health"] + 1), "value")
    d.quorum.observe(lambda ch: counts.__setitem__("quorum", counts["quorum"] + 1), "value")
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < 0.6:  # as fast as the writer can go
            for r in range(3):
                store.append(Step(replica=r, step=n + 1, loss=2.0, tokens_per_s=1.0, committed=True,
                                  quorum_id=1, participants=3))
            n += 1
        elapsed = time.monotonic() - start
    finally:
        d.close(final_flush=False)
    assert n > 100  # thousands of events in practice
    allowed = elapsed * 10 + 2  # <= max_hz per widget (+1 for the first, +1 for rounding)
    assert 1 <= counts["health"] <= allowed and 1 <= counts["quorum"] <= allowed, (counts, n, elapsed)


def test_close_stops_updates():
    store = store_of(healthy_run())
    closed, open_ = Dashboard(store), Dashboard(store)
    try:
        closed.close()
        before, seen = closed.health.value, closed.model.events_seen
        store.append(FailureDetected(replica=0, rank=0, reason="late"))
        # The same event reaches a dashboard that is still open...
        wait_for(lambda: "data-replica='0' data-rank='0' data-state='failed'" in open_.health.value, 5,
                 "the open dashboard to draw the failure")
        # ...but not the closed one: its model never saw it and its widgets kept their values.
        assert closed.model.events_seen == seen and closed.health.value == before
        assert closed.closed and (closed.frames.flusher is None or not closed.frames.flusher.is_alive())
    finally:
        open_.close()


@pytest.mark.parametrize("job, offered, not_offered", [
    (None, {"kill", "comms", "slow"}, {"preempt", "pod_delete", "evict", "node_notready"}),
    ("local", {"kill", "hang"}, {"preempt", "node_down", "pod_delete"}),
    ("slurm", {"kill", "preempt", "node_down"}, {"pod_delete", "evict"}),
    ("kubernetes", {"kill", "pod_delete", "evict", "node_notready"}, {"preempt", "node_down"}),
])
def test_the_fault_menu_offers_only_what_the_runs_job_can_deliver(job, offered, not_offered):
    """Notebook 06 at 16 groups in JupyterLab offered preempt, pod_delete and the other cluster
    kinds on a local run, each refused when clicked; the menu now follows the run's job."""
    import types

    run = FakeRun()
    if job is not None:
        run.config = types.SimpleNamespace(job=job)
    d = Dashboard(store_of(healthy_run()), controls=run)
    try:
        kinds = set(d.fault_kind.options)
        assert offered <= kinds and not (not_offered & kinds), kinds
    finally:
        d.close()


def test_controls_call_the_run_off_the_message_loop():
    run = FakeRun()
    d = Dashboard(store_of(healthy_run()), controls=run)
    try:
        assert d.controls_box.layout.display != "none"
        assert [v for _, v in d.replica_choice.options] == [0, 1, 2]
        d.fault_kind.value = "segfault"
        d.replica_choice.value = 2
        click(d.inject_button)
        assert run.called.wait(5)
        assert run.calls == [("inject", "segfault", 2)]
        run.called.clear()
        click(d.stop_button)
        assert run.called.wait(5) and run.calls[-1] == ("stop",)
    finally:
        d.close()


def test_controls_are_hidden_and_disabled_for_a_reopened_run():
    d = Dashboard(store_of(healthy_run()), controls=None)
    try:
        assert d.controls_box.layout.display == "none"
        assert d.inject_button.disabled and d.stop_button.disabled
    finally:
        d.close()


def test_a_disabled_button_does_nothing_even_if_its_click_event_arrives():
    run = FakeRun()
    d = Dashboard(store_of(healthy_run() + [RunStopped(t=T0 + 60, run_id="r")]), controls=run)
    try:
        assert d.inject_button.disabled and d.stop_button.disabled  # a stopped run takes no faults
        d.inject_button.click()  # what a stale frontend could still send
        d.stop_button.click()
        assert not run.called.wait(0.5) and run.calls == []
    finally:
        d.close()


def click(button) -> None:
    """Click as a person can: only an enabled button (ipywidgets' click() ignores ``disabled``)."""
    assert not button.disabled, f"button {button.description!r} is disabled"
    button.click()


def test_a_finished_run_redraws_from_its_event_log(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    live = EventStore(path)
    for e in healthy_run() + kill_and_recover() + [RunStopped(t=T0 + 60, run_id="r")]:
        live.append(e)
    live.close()
    d = Dashboard.open(path.parent)
    try:
        d.frames.flusher is None or d.frames.flusher.join(timeout=5)
        assert d.frames.flusher is None  # a finished run holds no flusher thread
        assert "data-state='stopped'" in d.health.value and "data-state='failed'" not in d.health.value
        assert "data-status='recovered'" in d.timeline.value
        assert "data-markers='2'" in d.plot_caption.value
        assert "stopped" in d.header.value
    finally:
        d.close()


def test_static_fallback_has_the_plot_and_the_tables():
    d = Dashboard(store_of(healthy_run() + kill_and_recover()[:3]))
    try:
        html = d.static_html()
        assert "data:image/png;base64," in html
        assert "<table class='mnb-health-table'" in html and "data-state='failed'" in html
        assert "mnb-recovery" in html and "<script" not in html
        assert "data:image/png" not in d.static_html(include_plot=False)
    finally:
        d.close()


def test_dashboard_follows_a_synthetic_run_through_an_injected_fault():
    from monarch_nb.notebook.synthetic_run import SyntheticRun

    run = SyntheticRun(replicas=2, step_hz=50, phase_s=0.2)
    d = Dashboard(run.events, controls=run, max_hz=50)
    states: list[str] = []
    recovered = threading.Event()

    def watch(ch):
        cell = ch["new"].split("data-replica='1' data-rank='0' data-state='")
        if len(cell) > 1:
            states.append(cell[1].split("'")[0])
            if "failed" in states and states[-1] == "training":
                recovered.set()

    d.health.observe(watch, "value")
    try:
        run.start()
        assert run.wait_for_step(5)
        wait_for(lambda: not d.inject_button.disabled, 5, "the controls to be enabled for the live run")
        d.replica_choice.value = 1
        click(d.inject_button)
        assert recovered.wait(10), states
        assert run.wait_for_step(run.step + 3)
    finally:
        run.stop()
        d.close()
    assert d.model.recoveries[0].status == "recovered"
    assert "data-state='stopped'" in d.health.value


def test_a_failure_is_drawn_at_least_once_even_if_respawn_started_before_the_redraw():
    m = model_of(healthy_run() + kill_and_recover()[:5])  # failed, then respawning at once
    assert m.replicas[1].state == "respawning"
    assert {c.state for c in cells_of(m, 1)} == {"failed"}  # the frame after the failure
    assert m.mark_drawn() is True  # that frame is stale: draw again
    cells = cells_of(m, 1)
    assert {c.state for c in cells} == {"respawning"}
    assert "after failure: SIGKILL" in cells[0].detail  # still says why the group is down
    assert m.mark_drawn() is False


def test_plot_breaks_a_groups_line_while_it_was_down_and_puts_markers_on_its_curve():
    from monarch_nb.notebook.dashboard_render import LossPlot

    evs = healthy_run(steps=10) + kill_and_recover()
    evs += [Step(t=T0 + 30 + s, replica=r, step=s, loss=1.0 + 0.01 * r, tokens_per_s=1.0, committed=True)
            for s in (12, 13, 14) for r in range(3)]
    plot = LossPlot()
    png = plot.render(model_of(evs).plot_data())
    assert png.startswith(b"\x89PNG")
    xs = list(plot._lines[1].get_xdata())
    assert xs[:10] == list(range(10)) and xs[10] != xs[10] and xs[11:] == [12, 13, 14]  # NaN = break
    (fault,) = plot._marks["fault"].get_offsets().tolist()
    (heal,) = plot._marks["heal"].get_offsets().tolist()
    assert fault == pytest.approx([10, 3.0 - 0.9 + 0.01])  # last point of group 1 before the kill
    assert heal == pytest.approx([12, 1.01])  # first point of group 1 after it healed


def test_a_validators_held_out_loss_is_its_own_line_the_groups_mean_per_step():
    from monarch_nb.notebook.dashboard_render import LossPlot

    evs = healthy_run(steps=10) + [Validated(t=T0 + 20, replica=r, step=s, loss=2.0 + r - 0.1 * s, batches=4,
                                             seconds=0.1) for s in (5, 10) for r in range(3)]
    m = model_of(evs)
    assert m.plot_data().held_out == ((5, pytest.approx(2.5)), (10, pytest.approx(2.0)))
    plot = LossPlot()
    plot.render(m.plot_data())
    assert list(plot._held_out.get_xdata()) == [5, 10]
    assert "held-out (validator)" in [t.get_text() for t in plot.ax.get_legend().get_texts()]
    assert model_of(healthy_run(steps=10)).plot_data().held_out == ()  # no validator: no line


def test_plot_data_stays_small_for_a_long_run_and_keeps_the_gap():
    m = DashboardModel()
    m.apply(RunStarted(t=T0, run_id="r", config={"replicas": 1}))
    for s in list(range(0, 50_000)) + list(range(50_100, 100_000)):
        m.apply(Step(t=T0, replica=0, step=s, loss=1.0, tokens_per_s=1.0, committed=True))
    data = m.plot_data(limit=500)
    line = data.committed[0]
    assert len(line) <= 505 and len(data.global_loss) <= 501
    xs = [x for x, _ in line]
    gap = next(i for i, x in enumerate(xs) if x != x)
    assert xs[gap - 1] == 49_999 and xs[gap + 1] == 50_100  # the line stops and restarts exactly there
    assert xs[-1] == 99_999 and data.point_count == 99_900


# ---- a reopened run whose controller died -----------------------------------------------


def write_log(path, events) -> None:
    live = EventStore(path)
    for e in events:
        live.append(e)
    live.close()


def test_a_reopened_run_without_run_stopped_is_interrupted_at_its_last_event_not_running(tmp_path):
    from monarch_nb.ft import open_run

    path = tmp_path / "run" / "events.jsonl"
    write_log(path, healthy_run() + kill_and_recover()[:6])  # the controller died mid-recovery
    last = T0 + 23.0  # the last event: Respawned
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last))
    d = Dashboard.open(path.parent)
    try:
        d.frames.flusher is None or d.frames.flusher.join(timeout=5)
        assert d.frames.flusher is None  # nothing will move: no flusher thread
        assert "data-status='interrupted'" in d.header.value
        assert f"interrupted (no run_stopped; last event at {when})" in d.header.value
        assert "running" not in d.header.value and " 23 s" in d.header.value  # ran until its last event
        cells = d.model.health_cells(time.time())
        # no group claims to be doing anything now; what each was doing is kept as words
        assert {c.state for c in cells} == {"unknown"}
        assert cells[0].detail == "was training when the log ended (run interrupted)"
        assert cells_of(d.model, 1)[0].detail == "was healing when the log ended (run interrupted)"
        assert [c.heartbeat_age_s for c in cells if c.replica == 0] == pytest.approx([13.0, 13.0])  # to the last event
        assert "data-state='training'" not in d.health.value
        assert "interrupted" in d._repr_mimebundle_()["text/plain"]
    finally:
        d.close()
    died_down = DashboardModel(reopened=True)  # a failure is a fact of the past: it stays
    died_down.apply_all(healthy_run() + kill_and_recover()[:3])
    assert {c.state for c in cells_of(died_down, 1)} == {"failed"}
    assert {c.state for c in cells_of(died_down, 0)} == {"unknown"}
    history = open_run(path.parent)
    s = history.summary()
    assert s["state"] == "interrupted" and s["last_event_t"] == last
    assert f"interrupted (no run_stopped; last event at {when})" in repr(history)
    dash = history.dashboard()
    try:
        assert "data-status='interrupted'" in dash.header.value
    finally:
        dash.close()


def test_a_stopped_run_and_a_live_one_are_never_called_interrupted(tmp_path):
    from monarch_nb.ft import open_run
    from monarch_nb.ft.record.history import RunHistory

    path = tmp_path / "events.jsonl"
    write_log(path, healthy_run() + [RunStopped(t=T0 + 30, run_id="r")])
    assert open_run(path).summary()["state"] == "stopped"
    live = store_of(healthy_run())  # being written: a live run, with or without controls
    assert RunHistory(live).summary()["state"] == "running"
    d = Dashboard(live)
    try:
        assert "data-status='running'" in d.header.value
        live.append(RunStopped(t=T0 + 30, run_id="r"))
        wait_for(lambda: "data-status='stopped'" in d.header.value, 5, "the header to say stopped")
    finally:
        d.close()
    assert RunHistory(live).summary()["state"] == "stopped"
    # a reopened log that never had a run (a session's meshes only) waits for nothing
    from monarch_nb.telemetry.events import MeshUp

    meshes = tmp_path / "session" / "events.jsonl"
    write_log(meshes, [MeshUp(t=T0, mesh="main", shape={"gpus": 2}, seconds=1.0)])
    assert open_run(meshes).summary()["state"] == "not started"
    d = Dashboard.open(meshes)
    try:
        assert "data-status='not-started'" in d.header.value and "waiting" not in d.header.value
    finally:
        d.close()


def test_a_hang_s_stack_is_shown_under_its_recovery_and_the_header_links_the_lighthouse():
    from monarch_nb.notebook.dashboard_render import header_html
    from monarch_nb.telemetry.events import LighthouseStarted

    stack = 'Thread 7 (idle): "train-r1"\n    hold_gil (monarch_nb/ft/worker/fault_firing.py:30)'
    evs = healthy_run() + [LighthouseStarted(t=T0 + 0.05, address="http://127.0.0.1:29510", pid=42),
                           FaultInjected(t=T0 + 20, fault="hang", replica=1, rank=0, step=10),
                           FailureDetected(t=T0 + 23, replica=1, rank=0, reason="hang: no answer", detection_s=3.0,
                                           source="hang", stack=stack)]
    m = model_of(evs)
    assert m.recoveries[0].stack == stack
    html = recoveries_html(m.recoveries, m.started_t)
    assert "class='mnb-recovery-stack'" in html and "hold_gil (monarch_nb/ft/worker/fault_firing.py:30)" in html
    assert "stack of group 1 rank 0 when the hang was detected" in html
    assert "href='http://127.0.0.1:29510'" in header_html(m, T0 + 30)


def test_the_log_panel_folds_the_workers_lines_and_reads_only_what_was_appended(tmp_path):
    from monarch_nb import worker_logs

    store = EventStore(tmp_path / "events.jsonl")
    for e in healthy_run(replicas=2, group_size=1):
        store.append(e)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for r in range(2):
        path = worker_logs.log_path(tmp_path / "logs", f"replica{r}", 0)
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{stamp}.100 [replica{r} rank 0] loading tokenizer.json\n")
    dash = Dashboard(store, max_hz=50)
    try:
        assert "[replica0 rank 0, replica1 rank 0] loading tokenizer.json" in dash.logs.value
        assert "data-count='2'" in dash.logs.value and str(tmp_path / "logs") in dash.logs.value
        with open(worker_logs.log_path(tmp_path / "logs", "replica1", 0), "a") as f:
            f.write(f"{stamp}.900 [replica1 rank 0] step 9 done\n")
        dash.flush()
        assert "step 9 done" in dash.logs.value
        assert "worker logs" in dash.static_html(include_plot=False)
    finally:
        dash.close()
        store.close()


# ---- many groups ----------------------------------------------------------------------------


def test_a_step_of_32_groups_redraws_only_the_panels_it_changed_once_a_frame():
    from monarch_nb.notebook.dashboard_model import CONTROLS, HEADER, HEALTH, LOGS, PLOT, QUORUM, TIMELINE

    store = store_of(healthy_run(replicas=32, group_size=1))
    d = Dashboard(store, heartbeat_interval_s=0)  # no run attached: nothing ticks on its own

    def settled() -> dict:
        wait_for(lambda: not d.frames.dirty, 10, "the flusher to take every dirty panel")
        with d.frames.render_lock:  # a frame in progress ends first
            assert not d.frames.dirty
            return dict(d.stats.renders)

    try:
        before = settled()
        with d.frames.render_lock:  # the flusher cannot draw until the whole step (32 events) is in
            for r in range(32):
                store.append(Step(t=T0 + 20, replica=r, step=10, loss=2.0, tokens_per_s=1.0, committed=True,
                                  quorum_id=1, participants=32))
        after = settled()
        drawn = {p: after[p] - before[p] for p in after}
        # One frame with the step, at most one more for events that came while it was drawn;
        # never one per event, and none for panels a step cannot change.
        assert all(1 <= drawn[p] <= 2 for p in (HEALTH, QUORUM, PLOT)), drawn
        assert all(drawn[p] == 0 for p in (HEADER, TIMELINE, CONTROLS, LOGS)), drawn
        assert d.health.value.count("class='mnb-cell ") == 32 and "data-step='10'" in d.health.value

        store.append(FailureDetected(t=T0 + 21, replica=5, rank=0, reason="SIGKILL"))
        store.append(ReplicaState(t=T0 + 21, replica=5, state="failed", detail="SIGKILL"))
        again = settled()
        drawn = {p: again[p] - after[p] for p in again}
        assert drawn[HEALTH] >= 1 and drawn[TIMELINE] >= 1 and drawn[QUORUM] == drawn[HEADER] == 0, drawn
        assert "data-replica='5' data-rank='0' data-state='failed'" in d.health.value
    finally:
        d.close(final_flush=False)


def test_32_groups_are_a_compact_grid_that_lists_the_groups_not_training_in_words():
    evs = healthy_run(replicas=32, group_size=1) + kill_and_recover(replica=7)
    evs += [FaultInjected(t=T0 + 30, fault="kill", replica=5, rank=0, step=12),
            FailureDetected(t=T0 + 30.5, replica=5, rank=0, reason="SIGKILL", detection_s=0.5),
            ReplicaState(t=T0 + 30.5, replica=5, state="failed", detail="SIGKILL"),
            GaveUp(t=T0 + 31, replica=5, attempts=3)]
    m = model_of(evs)
    assert m.training == 31 and m.live_series[-1][1] == 31
    html = health_html(m.health_cells(T0 + 40))
    assert "data-compact='true'" in html and html.count("class='mnb-cell ") == 32
    assert "data-replica='5' data-rank='0' data-state='failed'" in html
    assert "data-replica='7' data-rank='0' data-state='training'" in html
    (down,) = html.split("class='mnb-down' ")[1:]  # only the group that is down is named
    assert "data-replica='5'" in down and "FAILED" in down and "gave up after 3 attempts" in down
    assert "31 training" in html and "1 FAILED" in html
    # a few groups keep the big cells (step and heartbeat age written in each)
    small = model_of(healthy_run(replicas=3, group_size=2))
    assert "data-compact='false'" in health_html(small.health_cells(T0 + 40))


def test_32_groups_share_one_plot_legend_entry_and_the_timeline_shows_the_last_recoveries():
    from monarch_nb.notebook.dashboard_render import LossPlot, plot_legend_html, timeline_html

    evs = healthy_run(replicas=32, group_size=1)
    evs += [FaultInjected(t=T0 + 15, fault="kill", replica=31, rank=0, step=10)]  # the first, never over
    for i in range(14):  # then 14 recoveries, one after the other
        evs += kill_and_recover(replica=i, at=T0 + 20 + 10 * i)
    m = model_of(evs)
    caption = plot_legend_html(m.plot_data())
    assert "each of 32 groups" in caption and "group 17" not in caption
    plot = LossPlot()
    assert plot.render(m.plot_data(), legend=False).startswith(b"\x89PNG")
    assert len(plot._many.get_xdata()) == 32 * 10 + 31  # every group's points, NaN between groups
    timeline = timeline_html(m, last_recoveries=10)
    # the last 10, and the one still in progress however old
    assert "data-count='15' data-shown='11'" in timeline and "<summary>4 earlier recoveries" in timeline
    assert all(f"<li data-earlier='{i}'>group {i - 1} " in timeline for i in (1, 2, 3, 4))  # one click away
    assert "data-index='0' data-replica='31'" in timeline and "data-index='14' data-replica='13'" in timeline
    assert "data-index='4' " not in timeline and "data-index='5' " in timeline
    assert recoveries_html(m.recoveries, m.started_t, bars=False).count("class='mnb-recovery'") == 15


def test_a_semi_sync_run_shows_its_meeting_period_and_each_groups_place_in_its_inner_loop():
    """LocalSGD / DiLoCo (issue 53): the header names the method and how often the groups meet,
    each training group's cell (and the status table) says how far it is into its inner loop."""
    from monarch_nb.notebook.dashboard_render import header_html
    from monarch_nb.notebook.html import run_status_html
    from monarch_nb.notebook.render_health import health_html

    evs = [RunStarted(t=T0, run_id="r", config={"replicas": 2, "group_size": 1, "sync": "diloco", "sync_every": 10})]
    evs += [ReplicaState(t=T0 + 0.1, replica=r, state="training") for r in range(2)]
    evs += [Step(t=T0 + 1 + s, replica=r, step=s, loss=3.0, tokens_per_s=1.0, committed=True, synced=s % 10 == 0)
            for s in range(1, 24) for r in range(2) if r == 0 or s <= 17]
    m = model_of(evs)
    assert "DiLoCo: the groups meet every 10 steps" in header_html(m, T0 + 30)
    cells = {c.replica: c for c in m.health_cells(T0 + 30)}
    assert cells[0].inner == "inner step 3 of 10" and cells[1].inner == "inner step 7 of 10", cells
    assert "inner step 3 of 10" in cells[0].text and "inner step 3 of 10" in health_html(list(cells.values()))
    streaming = model_of([RunStarted(t=T0, run_id="s", config={"replicas": 2, "sync": "diloco", "sync_every": 12,
                                                                "fragments": 3})])
    assert "meet every 4 steps" in header_html(streaming, T0)  # one fragment at a time
    plain = model_of(healthy_run())
    assert "meet every" not in header_html(plain, T0 + 30)
    assert all(c.inner == "" for c in plain.health_cells(T0 + 30))
    table = run_status_html("r", {0: {"state": "training", "step": 23, "inner": "3/10", "pids": [1]}})
    assert ">inner loop</th>" in table and ">3/10<" in table
    assert ">inner loop</th>" not in run_status_html("r", {0: {"state": "training", "step": 23, "pids": [1]}})


def test_a_drain_shows_draining_on_the_group_then_moved_with_its_time():
    from monarch_nb.notebook.dashboard_render import timeline_html
    from monarch_nb.telemetry.events import Drained, Draining

    evs = healthy_run(replicas=2, group_size=1) + [Draining(t=T0 + 20, replica=1, replacement=2, reason="node drain")]
    m = model_of(evs)
    cells = {c.replica: c for c in m.health_cells(T0 + 21)}
    assert cells[1].state == "training" and "draining: moving to group 2" in cells[1].text
    m.apply(Drained(t=T0 + 24.5, replica=1, replacement=2, seconds=4.5, from_spare=True))
    text = timeline_html(m)
    assert "group 1 draining: group 2 heals from live peers" in text, text
    assert "group 1 moved to group 2 (a warm spare) in 4.5 s" in text, text


def test_the_operators_view_at_many_groups_says_what_it_shows():
    """Issue 54 item 7, as notebook 06 showed it at 16 groups: phases that added up to more than
    their total (the controller saw the failure after the group was back), a long timeline bar with
    nothing saying why, a wave's fault markers on one step with no way to tell the groups apart,
    and late-answer events at start-up that read like failures."""
    from monarch_nb.ft.record.recovery import Recovery
    from monarch_nb.notebook.dashboard_render import timeline_html
    from monarch_nb.notebook.render_plot import plot_legend_html
    from monarch_nb.telemetry.events import CallTimedOut

    late = Recovery(replica=3, fault="comms", injected_t=T0, detected_t=T0 + 0.79, detection_s=0.79,
                    rungs=["communicator"], repaired_t=T0 + 0.2, repair_s=0.2, rejoined_t=T0 + 0.71)
    spent = sum(d for d in late.durations().values() if d is not None)
    assert abs(spent - late.total_s) < 1e-9 and late.durations()["detect"] == pytest.approx(0.71), late.durations()
    row = recoveries_html([late], T0)
    assert "noticed after 0.79 s" in row  # what the controller measured stays in view
    assert "class='mnb-bar-most' style='font-size:10px'>detect 0.71 s" in row  # the bar says what it is

    wave = healthy_run(replicas=8, group_size=1, steps=12)
    wave += [FaultInjected(t=T0 + 12.5, fault="comms", replica=r, rank=0, step=11) for r in (1, 4, 6)]
    wave += [CallTimedOut(t=T0 + 0.5, mesh="replica2", endpoint="trainer0.poll", missing_ranks=[0], timeout_s=10.0)]
    m = model_of(wave)
    assert "faults at step 11: groups 1, 4, 6" in plot_legend_html(m.plot_data())
    text = timeline_html(m)
    assert "replica2: trainer0.poll answered late" in text and "not a failure unless one is reported" in text
    assert "timed out" not in text


def test_the_quorum_panel_says_in_one_figure_what_the_faults_cost():
    """Seconds the global step stood still past the run's own pace (waits over 3 median steps),
    and that in steps: a fault-free run's jitter costs nothing."""
    from monarch_nb.notebook.dashboard_render import quorum_html

    evs = [RunStarted(t=T0, run_id="r", config={"replicas": 2, "group_size": 1})]
    t = T0 + 1
    for s in range(1, 80):
        t += 0.1 * (1.0 + 0.3 * ((s * 7) % 5) / 4) + (4.0 if s == 50 else 0.0)  # jitter, and one 4 s stall
        evs += [Step(t=t, replica=r, step=s, loss=1.0, tokens_per_s=1.0, committed=True) for r in range(2)]
    m = model_of(evs)
    q = m.quorum_summary()
    assert 3.9 <= q.stalled_s <= 4.1 and 0.1 <= q.pace_s <= 0.13, q
    assert "<b>faults cost</b> 4.0 s (&asymp; 3" in quorum_html(q)
    steady = model_of(evs[:2 * 49 + 1]).quorum_summary()
    assert steady.stalled_s == 0.0, steady
