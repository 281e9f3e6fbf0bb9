"""A controller that runs for days stays flat: what the kernel keeps per step, per fault and per
mesh is bounded, and every answer about the whole run is still complete (read from the log).

The dashboard model is fed a long synthetic run (events on purpose: they would take hours of real
training), with its windows made ten times smaller so that the run need only be a tenth as long;
the event store's window and Monarch's mesh references are checked on the real thing, and so is
the native memory a call to one actor leaves in the controller."""

from __future__ import annotations

import ctypes
import gc
import math
import tracemalloc

import psutil
import pytest
from helpers.bench_scripts import load_bench
from monarch.actor import Actor, endpoint, send

from monarch_nb import seam
from monarch_nb.notebook import dashboard_model as dm
from monarch_nb.notebook.dashboard_render import recoveries_html
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.events import FailureDetected, MeshUp, Rejoined, ReplicaState, Step

T0 = 1_700_000_000.0


@pytest.fixture
def small_windows(monkeypatch):
    for name in ("POINTS_KEPT", "LOSS_KEPT", "MARKERS_KEPT", "LIVE_SERIES_KEPT", "RECOVERIES_KEPT",
                 "GLOBAL_SETTLE_STEPS"):
        monkeypatch.setattr(dm, name, getattr(dm, name) // 10)


def _long_run(steps: int, replicas: int = 3, fail_every: int = 20):
    """Steps of ``replicas`` groups; every ``fail_every`` steps one group fails for 3 steps."""
    for s in range(steps):
        t = T0 + s
        victim = (s // fail_every) % replicas if s % fail_every == 0 and s else None
        if victim is not None:
            yield FailureDetected(t=t, replica=victim, rank=0, reason="Killed(sig=9)", source="pid")
            yield ReplicaState(t=t, replica=victim, state="failed", detail="Killed(sig=9)")
        down = (s // fail_every) % replicas if s % fail_every < 3 and s >= fail_every else None
        for r in range(replicas):
            if r == down:
                continue
            yield Step(t=t, replica=r, step=s, loss=5.0 / (1 + s / 1000) + 0.01 * r, tokens_per_s=1.0,
                       committed=True)
        if s % fail_every == 3 and s > fail_every:
            back = (s // fail_every) % replicas
            yield ReplicaState(t=t, replica=back, state="training")
            yield Rejoined(t=t, replica=back, step=s, seconds_since_failure=3.0)


def _fold(steps: int) -> dm.DashboardModel:
    m = dm.DashboardModel()
    m.apply_all(_long_run(steps))
    return m


def test_the_dashboard_model_holds_a_bounded_window_however_long_the_run(small_windows):
    m = _fold(6_000)
    assert m.steps_committed > 17_000 and m.global_step == 5_999
    for r in range(3):
        assert len(m.loss[r]) == dm.LOSS_KEPT
        curve = m.committed[r]
        assert len(curve.points) <= 2 * dm.POINTS_KEPT + 2 * len(curve.gaps)
    assert len(m.global_loss()) <= 5 * dm.POINTS_KEPT
    assert len(m.markers) <= dm.MARKERS_KEPT and len(m.live_series) <= dm.LIVE_SERIES_KEPT
    assert len(m.recoveries) <= dm.RECOVERIES_KEPT and m.tracker.dropped == 299 - len(m.recoveries)
    # the thinned curves still span the whole run, and every gap still breaks its line
    glob = m.global_loss()
    steps = [s for s, _ in glob]
    assert steps[0] == 0 and steps[-1] == 5_999 and steps == sorted(steps)
    assert max(b - a for a, b in zip(steps, steps[1:])) <= 64  # uniformly thinned, no hole
    assert all(abs(v - 5.0 / (1 + s / 1000) - 0.01) < 0.01 for s, v in glob)
    drawn = m.plot_data().committed[0]
    gaps = m.committed[0].gaps
    assert sum(1 for x, _ in drawn if math.isnan(x)) == len(gaps) and 0 < len(gaps) <= dm.POINTS_KEPT // 2


def test_the_dashboard_models_memory_stops_growing_once_its_windows_are_full(small_windows):
    """Traced memory every 500 steps: the second half of the run never holds more than the first
    half's peak (the windows fill within the first 1,500 steps)."""
    m = dm.DashboardModel()
    held = []
    tracemalloc.start()
    try:
        for n, e in enumerate(_long_run(24_000)):
            m.apply(e)
            if n % 1500 == 0:
                held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert m.global_step == 23_999 and len(held) > 40
    first, second = held[len(held) // 4: len(held) // 2], held[len(held) // 2:]
    # without the windows: 36,000 more committed points and 600 more failures, ~6 MB more
    assert max(second) - max(first) < 20_000, (max(first), max(second))


def test_the_recovery_table_counts_the_recoveries_the_model_let_go(small_windows):
    m = _fold(6_000)
    html = recoveries_html(m.recoveries, T0, last=10, dropped=m.tracker.dropped)
    assert "data-count='299'" in html and "289 earlier recoveries" in html
    assert "run.history().recoveries()" in html


def test_a_store_with_a_file_keeps_a_window_in_memory_and_answers_from_the_file(tmp_path):
    store = EventStore(tmp_path / "events.jsonl", memory_events=50)
    every = list(_long_run(400))
    for e in every[:300]:
        store.append(e)
    assert store.held == 50 and len(store) == 300
    assert store.events() == every[:300]  # read back from the file: the same events
    assert store.events(Step) == [e for e in every[:300] if isinstance(e, Step)]
    replayed: list = []
    store.subscribe(replayed.append, replay=True)
    for e in every[300:]:
        store.append(e)
    assert replayed == every and store.held == 50
    # a wait since a recent time is answered from memory; one since the start from the file
    store.append(MeshUp(t=T0 + 1, mesh="m", shape={}, seconds=0.1))
    assert store.wait_for(lambda e: e.kind == "mesh_up", 1).mesh == "m"
    assert store.wait_for(lambda e: e.kind == "step" and e.step == 0, 1, since=T0).step == 0
    assert store.tail(2).startswith(f"last 2 of {len(every) + 1} events")
    reopened = EventStore.open(tmp_path, follow=True)
    assert reopened.events() == [*every, store.last()] and reopened.held == len(reopened)
    # a stopped run's store is closed; a question about its whole history still reads the file
    # (bench_goodput's history of a 3,000-step arm after stop() hit an assertion here)
    store.close()
    assert store.events() == [*every, store.last()] and store.events(MeshUp) == [store.last()]


def test_a_store_without_a_file_keeps_everything(tmp_path):
    store = EventStore(memory_events=10)
    for e in list(_long_run(30)):
        store.append(e)
    assert store.held == len(store) > 10


class _Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def _kept_mb() -> float:
    """The controller's RSS once freed heap is handed back: what it keeps."""
    ctypes.CDLL(None).malloc_trim(0)
    return psutil.Process().memory_info().rss / 2**20


def _open_port_call(actor) -> int:
    """A call through a port opened for several replies (what every call used before)."""
    port, replies = seam.open_outcome_channel()
    send(actor.ping, (1,), {}, port=port)
    return replies.recv().get(timeout=10.0)[2]


def test_a_call_to_one_actor_keeps_no_port_in_the_controller(session):
    """The supervisor polls every group ~4 times a second. A port opened for several replies
    stays in the controller's mailbox for good (~1 KB of native memory per call); a call to one
    actor takes a once port, which Monarch frees when the reply arrives. The two take turns, so
    the box's noise falls on both alike."""
    session.up("calls", procs=1)
    actor = session.spawn("echo", _Echo, mesh="calls")
    paths = {"session": lambda: session.deadline(actor, 10.0).ping.call_one(1),
             "open_port": lambda: _open_port_call(actor)}
    for call in paths.values():  # warm-up: first-use allocations are not growth
        for _ in range(300):
            assert call() == 1
    added = dict.fromkeys(paths, 0.0)
    for _ in range(4):
        for name, call in paths.items():
            before = _kept_mb()
            for _ in range(1500):
                call()
            added[name] += _kept_mb() - before
    if added["open_port"] < 2.0:
        pytest.skip(f"Monarch no longer keeps a port per call ({added['open_port']:.1f} MB in 6,000 calls)")
    assert added["session"] < added["open_port"] / 3, added


def test_a_live_loss_frame_lays_out_no_new_text_as_the_run_goes_on():
    """matplotlib keeps the size of every string it lays out (4,096 per renderer): a live frame
    whose image carried the point count and global step filled that cache for hours of frames."""
    bench = load_bench("dashboard_memory")  # it watches matplotlib's cache (a bench may; seam.py is for the product)
    frames = 120
    live = bench.strings_laid_out(frames, legend=False)
    assert len(live) < frames / 4, f"{len(live)} strings laid out in {frames} frames: {sorted(live)[:12]}"
    static = bench.strings_laid_out(frames, legend=True)  # the static image still says where the run is
    assert f"loss: {300 + 3 * (frames - 1)} points, global step {frames + 98}" in static
