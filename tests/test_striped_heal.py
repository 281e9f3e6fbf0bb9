"""The striped, verified heal on real processes: a killed group heals from every surviving
group at once, and a byte flipped in transit by one donor (the ``corrupt`` fault) is caught by
the digest check and refetched from the other, leaving the healed group bit-identical."""

from __future__ import annotations

import time

import pytest

from monarch_nb.ft import FTRun, RunConfig
from monarch_nb.telemetry.events import FaultInjected, HealCorrupt, Healed, Rejoined, ReplicasIdentical

pytestmark = pytest.mark.slow


def _recover(run: FTRun, victim: int, since: float) -> tuple[Healed, ReplicasIdentical]:
    healed = run.wait_for(lambda e: isinstance(e, Healed) and e.replica == victim and e.cause == "recovery",
                          timeout=180, since=since)
    rejoined = run.wait_for(lambda e: isinstance(e, Rejoined) and e.replica == victim, timeout=120, since=since)
    same = run.wait_for(lambda e: isinstance(e, ReplicasIdentical) and e.t >= rejoined.t, timeout=120)
    return healed, same


@pytest.fixture(scope="module")
def striped(tmp_path_factory):
    run = FTRun(RunConfig(replicas=3, runs_root=str(tmp_path_factory.mktemp("striped")), run_name="striped"))
    out = {}
    try:
        run.start()
        run.wait_for_step(4, timeout=180)
        t = time.time()
        run.inject("kill", replica=1)
        out["kill"] = _recover(run, 1, t)
        t = time.time()
        run.inject("corrupt", replica=0)  # replica 0 flips a byte of the next heal it serves
        armed = run.wait_for(lambda e: isinstance(e, FaultInjected) and e.fault == "corrupt", timeout=30, since=t)
        run.wait_for_step(armed.step + 1, replicas=[0], timeout=120)  # it fired: the next heal it serves is bad
        run.inject("kill", replica=2)
        out["corrupt"] = _recover(run, 2, t)
        out["bad"] = [e for e in run.events.events(HealCorrupt) if e.t >= t]
    finally:
        run.stop()
    return run, out


def test_a_heal_fetches_from_every_surviving_group(striped):
    healed, same = striped[1]["kill"]
    assert healed.donors == [0, 2], healed
    assert healed.bytes > 0 and healed.gbps and healed.gbps > 0 and healed.corrupt == 0
    assert same.identical


def test_a_byte_flipped_in_transit_is_refetched_from_the_other_donor(striped):
    healed, same = striped[1]["corrupt"]
    bad = striped[1]["bad"]
    assert len(bad) >= 1 and healed.corrupt == len(bad)
    assert {(e.replica, e.donor, e.refetched_from) for e in bad} == {(2, 0, 1)}
    assert all(e.tensor.startswith("user/") for e in bad)
    assert same.identical  # no heal is accepted with a mismatch: the healed group equals its peers
