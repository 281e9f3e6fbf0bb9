import json

import pytest

from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.decode import event_from_dict
from monarch_nb.telemetry.events import Healed, Step, UnknownEvent, WorkerFailed


def test_events_round_trip_through_jsonl(tmp_path):
    store = EventStore(tmp_path / "run" / "events.jsonl")
    store.append(Step(replica=0, step=1, loss=2.5, tokens_per_s=100.0, committed=True))
    store.append(Healed(replica=1, step=4, bytes=1024, seconds=0.03, source_replica=0))
    store.close()
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["step", "healed"]
    assert all("t" in json.loads(line) for line in lines)
    reopened = EventStore.open(tmp_path / "run")
    assert reopened.events() == store.events()
    assert reopened.events("healed")[0].source_replica == 0


def test_each_event_is_on_disk_before_append_returns(tmp_path):
    store = EventStore(tmp_path / "events.jsonl")
    store.append(WorkerFailed(mesh="main", rank=2, reason="Killed(sig=9)"))
    # read with a fresh handle while the store is still open: nothing may sit in a buffer
    assert "worker_failed" in (tmp_path / "events.jsonl").read_text()
    store.close()


def test_reopen_skips_a_torn_last_line_and_keeps_unknown_kinds(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(
        json.dumps({"t": 1.0, "kind": "step", "replica": 0, "step": 0, "loss": 3.0,
                    "tokens_per_s": 1.0, "committed": True}) + "\n"
        + json.dumps({"t": 2.0, "kind": "from_the_future", "x": 1}) + "\n"
        + '{"t": 3.0, "kind": "st'
    )
    store = EventStore.open(path)
    events = store.events()
    assert isinstance(events[1], UnknownEvent) and events[1].to_dict()["kind"] == "from_the_future"
    assert len(events) == 2
    assert store.skipped_lines == 1 and store.skipped[0][0] == 3  # skipped, but counted


def test_a_failing_observer_never_stops_telemetry(tmp_path):
    store = EventStore()
    seen = []

    def broken(event):
        raise RuntimeError("widget bug")

    store.subscribe(broken)
    store.subscribe(seen.append)
    store.append(Step(replica=0, step=1, loss=1.0, tokens_per_s=1.0, committed=True))
    assert len(seen) == 1 and store.observer_errors == 1


def test_unknown_fields_are_ignored_when_loading():
    event = event_from_dict({"t": 5.0, "kind": "worker_failed", "mesh": "m", "rank": 1,
                             "reason": "x", "added_later": True})
    assert isinstance(event, WorkerFailed) and event.rank == 1 and event.t == 5.0


def test_a_timed_out_wait_names_what_it_waited_for_and_shows_the_last_events():
    store = EventStore()
    for step in range(25):
        store.append(Step(replica=0, step=step, loss=1.0, tokens_per_s=1.0, committed=True))
    with pytest.raises(TimeoutError) as raised:
        store.wait_for(lambda e: e.kind == "healed" and e.replica == 1, timeout=0.05)
    message = str(raised.value)
    assert 'lambda e: e.kind == "healed" and e.replica == 1' in message
    assert "last 20 of 25 events:" in message
    lines = message.splitlines()
    assert len(lines) == 22 and all(" step replica=0 step=" in ln for ln in lines[2:])
    assert lines[2].endswith("step=5 loss=1.0 tokens_per_s=1.0 committed=True")
    assert lines[-1].split(" step=")[1].startswith("24 ")

    with pytest.raises(TimeoutError, match="matching replica 1 healed\nno events recorded"):
        EventStore().wait_for(lambda e: False, timeout=0.01, what="replica 1 healed")
