"""Worker telemetry -> typed events, without any process: what the trainers report when
polled, and what the run records from it."""

from __future__ import annotations

from monarch_nb.ft.record.ingest import EventIngest, HashReport
from monarch_nb.telemetry.events import Healed, Quorum, Rejoined, Step


def step(t, n, committed=True, **extra):
    return {"kind": "step", "t": t, "step": n, "loss": 2.0, "committed": committed, "tokens_per_s": 10.0,
            "quorum_id": 1, "participants": 2, **extra}


def test_rank_zero_speaks_for_the_groups_steps_and_quorums():
    ingest = EventIngest(group_size=2)
    out = ingest.translate(1, {0: {"events": [step(1.0, 5), {"kind": "quorum", "t": 0.9, "quorum_id": 3,
                                                                 "participants": [0, 1]}]},
                               1: {"events": [step(1.0, 5)]}})
    assert [type(e) for e in out] == [Quorum, Step]
    assert out[1].replica == 1 and out[1].step == 5


def test_a_quorum_is_recorded_once_however_many_groups_report_it():
    ingest = EventIngest(group_size=1)
    q = {"kind": "quorum", "t": 1.0, "quorum_id": 7, "participants": [0, 1]}
    assert len(ingest.translate(0, {0: {"events": [q]}})) == 1
    assert ingest.translate(1, {0: {"events": [q]}}) == []


def test_a_quorum_names_the_group_whose_store_it_connects_through():
    ingest = EventIngest(group_size=1)
    q = {"kind": "quorum", "t": 1.0, "participants": [0, 1, 2], "store": "10.0.0.5:4001"}
    ingest.translate(0, {0: {"events": [{**q, "quorum_id": 1, "own_store": "10.0.0.5:4001"}]}})
    ingest.translate(2, {0: {"events": [{**q, "quorum_id": 1, "own_store": "10.0.0.6:4003"}]}})
    (later,) = ingest.translate(2, {0: {"events": [{**q, "quorum_id": 2, "own_store": "10.0.0.6:4003"}]}})
    assert later.store_replica == 0  # replica 0's store, though replica 2 reported the quorum first
    (unknown,) = ingest.translate(1, {0: {"events": [{**q, "quorum_id": 3, "store": "10.0.0.9:1"}]}})
    assert unknown.store_replica is None


def test_a_heal_is_recorded_once_the_last_rank_healed_with_the_bytes_summed():
    ingest = EventIngest(group_size=2)
    healed = {"kind": "healed", "step": 9, "source_replica": 0}
    assert ingest.translate(2, {0: {"events": [{**healed, "t": 5.0, "bytes": 100, "seconds": 0.1}]}}) == []
    (event,) = ingest.translate(2, {1: {"events": [{**healed, "t": 5.2, "bytes": 50, "seconds": 0.3}]}})
    assert isinstance(event, Healed)
    assert (event.bytes, event.seconds, event.t, event.source_replica) == (150, 0.3, 5.2, 0)


def test_the_first_committed_step_after_a_failure_is_the_rejoin():
    ingest = EventIngest(group_size=1)
    ingest.expect_rejoin(1, failed_at=100.0)
    assert [type(e) for e in ingest.translate(1, {0: {"events": [step(104.0, 20, committed=False)]}})] == [Step]
    out = ingest.translate(1, {0: {"events": [step(105.5, 21)]}})
    assert [type(e) for e in out] == [Step, Rejoined]
    assert out[1].step == 21 and out[1].seconds_since_failure == 5.5
    assert not ingest.awaiting_rejoin(1)
    assert [type(e) for e in ingest.translate(1, {0: {"events": [step(106.0, 22)]}})] == [Step]


def test_events_of_all_ranks_come_out_in_time_order_and_digests_as_hash_reports():
    ingest = EventIngest(group_size=2)
    digest = {"kind": "hashes", "step": 4, "params": "p", "optim": "o"}
    out = ingest.translate(0, {0: {"events": [step(2.0, 4), {**digest, "t": 2.1}]},
                               1: {"events": [{**digest, "t": 1.5}]}})
    assert [type(e) for e in out] == [HashReport, Step, HashReport]
    assert [(h.rank, h.step) for h in out if isinstance(h, HashReport)] == [(1, 4), (0, 4)]


def test_a_heal_says_why_a_recovery_a_new_group_or_a_group_left_out_of_quorums_with_no_fault():
    """A busy host made groups nobody failed heal from a peer (153 heals for 2 faults at R = 32);
    the event and the dashboard say so, with how far behind and how long unheard it was."""
    ingest = EventIngest(group_size=1)
    healed = {"kind": "healed", "t": 5.0, "bytes": 100, "seconds": 0.1, "source_replica": 0}
    (alive,) = ingest.translate(1, {0: {"events": [{**healed, "step": 40, "from_step": 36, "unheard_s": 2.345}]}})
    assert alive.needless and (alive.from_step, alive.unheard_s) == (36, 2.345)
    assert alive.cause == "left out of the quorum with no fault: steps 37-40 committed without it, 2.3 s after its last commit"
    ingest.expect_rejoin(2, failed_at=1.0)
    (back,) = ingest.translate(2, {0: {"events": [{**healed, "step": 40, "from_step": 12, "unheard_s": 4.0}]}})
    assert back.cause == "recovery" and not back.needless
    (new,) = ingest.translate(3, {0: {"events": [{**healed, "step": 40, "from_step": None, "unheard_s": None}]}})
    assert new.cause == "joining" and not new.needless


def test_events_a_late_poll_answer_carried_come_again_and_count_once():
    """A poll answered after the controller stopped waiting (32 groups on two cores) took its
    events with it: heals and digests went missing. Events are now sent until acknowledged;
    the controller keeps only those it does not hold yet."""
    from monarch_nb.ft.record.ingest import unseen

    first = {"events": [{"kind": "a"}, {"kind": "b"}], "first_seq": 1}
    # that answer came too late: nothing held, nothing acknowledged; the next poll re-sends 1-2 and adds 3
    again = {"events": [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}], "first_seq": 1}
    events, seen = unseen(again, 0)
    assert [e["kind"] for e in events] == ["a", "b", "c"] and seen == 3
    # the late answer arriving now (two polls in flight) adds nothing
    assert unseen(first, seen) == ([], 3)
    # acknowledged up to 3: the worker sends from 4 on
    assert unseen({"events": [{"kind": "d"}], "first_seq": 4}, 3) == ([{"kind": "d"}], 4)
    assert unseen({"events": [], "first_seq": None}, 4) == ([], 4)
