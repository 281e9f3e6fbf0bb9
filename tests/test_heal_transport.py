"""The striped, verified heal transport on real sockets between transports in this process:
donors serve live tensors, the receiver writes into its own, pieces are checked, striped, and
refetched from another donor when one arrives corrupt or a donor goes away."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from monarch_nb.ft.worker.heal_transport import HealCorrupt, StripedTransport, cut, stripes

TIMEOUT = timedelta(seconds=10)
PIECE = 1 << 16  # small pieces, so a small state has many


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"user": {"default": {"model": {"w": torch.randn(300, 200, generator=g), "b": torch.randn(7, generator=g),
                                           "strided": torch.randn(40, 30, generator=g).t()},
                                 "optim": {"step": torch.tensor(float(seed)), "bf": torch.randn(64, generator=g).bfloat16()},
                                 "lr": [0.1 * seed]}},
            "torchft": {"step": seed, "batches_committed": 3 * seed}}


class Cluster:
    """Donor transports serving ``state(7)`` at step 5, and a receiver holding ``state(1)``."""

    def __init__(self, donors: int) -> None:
        self.donor_states = [state(7) for _ in range(donors)]
        self.mine = state(1)
        self.donors = [StripedTransport("127.0.0.1", TIMEOUT, target=lambda: None, peers=list, replica=i,
                                        piece_bytes=PIECE) for i in range(donors)]
        for t, s in zip(self.donors, self.donor_states):
            t.offer(5, lambda s=s: s)  # as the trainer offers it: read only when a peer asks
        addresses = [t.metadata() for t in self.donors]
        self.receiver = StripedTransport("127.0.0.1", TIMEOUT, target=lambda: self.mine, peers=lambda: addresses,
                                         replica=9, piece_bytes=PIECE)

    def heal(self) -> dict:
        return self.receiver.recv_checkpoint(0, self.donors[0].metadata(), 5, TIMEOUT)

    def close(self) -> None:
        for t in self.donors + [self.receiver]:
            t.shutdown()


@pytest.fixture
def cluster_of():
    made = []

    def make(donors: int) -> Cluster:
        made.append(Cluster(donors))
        return made[-1]

    yield make
    for c in made:
        c.close()


def assert_same(a: dict, b: dict) -> None:
    ua, ub = a["user"]["default"], b["user"]["default"]
    for part in ("model", "optim"):
        for k in ua[part]:
            assert torch.equal(ua[part][k], ub[part][k]), k


def test_stripes_cover_every_piece_once_in_balanced_ranges():
    s = state(3)
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(s)
    pieces, tensors = cut(leaves, spec, 1 << 12)
    assert len(tensors) == 5 and sum(p.nbytes for p in pieces) == sum(v.numel() * v.element_size()
                                                                          for v in leaves if isinstance(v, torch.Tensor))
    parts = stripes(pieces, 4)
    assert [i for r in parts for i in r] == list(range(len(pieces)))
    sizes = [sum(pieces[i].nbytes for i in r) for r in parts]
    assert max(sizes) - min(sizes) <= 2 * (1 << 12)


def test_one_donor_heals_into_the_receivers_own_tensors(cluster_of):
    c = cluster_of(1)
    w = c.mine["user"]["default"]["model"]["w"]
    healed = c.heal()
    assert_same(healed, c.donor_states[0])
    assert healed["user"]["default"]["model"]["w"] is w  # written in place, no new tensor
    assert healed["torchft"] == {"step": 7, "batches_committed": 21} and healed["user"]["default"]["lr"] == [0.1 * 7]
    rec = c.receiver.last
    assert rec.donors == [0] and rec.corrupt == [] and rec.bytes == sum(rec.bytes_per_donor) > 0


def test_a_donor_state_with_parts_the_receiver_lacks_heals_into_new_tensors(cluster_of):
    """DiLoCo's outer optimizer makes its momentum at its first meeting: a group that comes back
    has none yet, so the donor's state has leaves the receiver's lacks. Received whole."""
    c = cluster_of(1)
    c.donor_states[0]["user"]["outer"] = {"momentum": torch.randn(50, 20)}
    healed = c.heal()
    assert_same(healed, c.donor_states[0])
    assert torch.equal(healed["user"]["outer"]["momentum"], c.donor_states[0]["user"]["outer"]["momentum"])
    assert healed["user"]["default"]["model"]["w"] is not c.mine["user"]["default"]["model"]["w"]


def test_three_donors_each_send_a_share(cluster_of):
    c = cluster_of(3)
    assert_same(c.heal(), c.donor_states[0])
    rec = c.receiver.last
    assert sorted(rec.donors) == [0, 1, 2]
    assert all(b > rec.bytes / 6 for b in rec.bytes_per_donor), rec.bytes_per_donor


def test_a_flipped_byte_is_caught_and_the_piece_refetched_from_another_donor(cluster_of):
    c = cluster_of(2)
    c.donors[1].corrupt_next_send()
    assert_same(c.heal(), c.donor_states[0])
    (bad,) = c.receiver.last.corrupt
    assert bad["donor"] == 1 and bad["refetched_from"] == 0 and bad["tensor"].startswith("user/default/")


def test_a_flipped_byte_with_no_other_donor_fails_the_heal(cluster_of):
    c = cluster_of(1)
    c.donors[0].corrupt_next_send()
    with pytest.raises(HealCorrupt, match="did not verify from any donor"):
        c.heal()


def test_a_donor_that_is_gone_loses_only_its_share(cluster_of):
    c = cluster_of(3)
    c.donors[2].shutdown()
    assert_same(c.heal(), c.donor_states[0])
    assert [d["why"] for d in c.receiver.last.dropped] == ["unreachable"]


def test_a_former_process_of_the_healing_group_is_never_a_donor(cluster_of):
    """A pod deleted under a group lives on for a moment after the controller failed it; its
    replacement (the same replica id) must not take any of its state from it."""
    c = cluster_of(3)
    c.receiver.replica = 2  # the receiver replaces replica 2, whose old process still serves
    assert_same(c.heal(), c.donor_states[0])
    assert sorted(c.receiver.last.donors) == [0, 1]
    assert [(d["donor"], d["why"]) for d in c.receiver.last.dropped] == [(2, "a former process of this group")]


def test_a_donor_whose_state_is_laid_out_differently_is_not_used(cluster_of):
    c = cluster_of(2)
    c.donor_states[1]["user"]["default"]["model"]["extra"] = torch.zeros(3)
    assert_same(c.heal(), c.donor_states[0])
    assert c.receiver.last.donors == [0]
    assert c.receiver.last.dropped[0]["why"] == "its state is laid out differently"


def test_a_donor_past_should_commit_serves_nothing_more(cluster_of):
    c = cluster_of(2)
    c.donors[1].disallow_checkpoint()  # it moved on: only the source heals us
    assert_same(c.heal(), c.donor_states[0])
    assert c.receiver.last.donors == [0] and c.receiver.last.dropped[0]["why"] == "not at this step"


def test_a_donor_that_dies_mid_stream_loses_only_the_pieces_it_had_not_sent(cluster_of):
    c = cluster_of(2)

    def one_piece_then_gone(serving, first, stop, out):  # the donor's process dies mid-stream
        StripedTransport.write_pieces(c.donors[1], serving, first, first + 1, out)
        raise ConnectionResetError("donor died")

    c.donors[1].write_pieces = one_piece_then_gone
    assert_same(c.heal(), c.donor_states[0])
    rec = c.receiver.last
    # each of its streams delivered one verified piece; donor 0 sent the rest, nothing twice
    assert rec.corrupt == [] and 0 < rec.bytes_per_donor[1] < rec.bytes / 2
    assert sum(rec.bytes_per_donor) == rec.bytes
