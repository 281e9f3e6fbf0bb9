"""RESULTS.md's generated figures and the JSON they come from are what the scripts write: a hand
edit of either fails here; README.md stays a short guide that links to RESULTS.md. Pure Python, no
run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.bench_scripts import load_bench

REPO = Path(__file__).resolve().parent.parent


def test_results_blocks_are_what_readme_tables_writes(capsys):
    rc = load_bench("readme_tables").main(["--check", "--results", str(REPO / "RESULTS.md")])
    assert rc == 0, capsys.readouterr().out
    assert load_bench("readme_tables").main(["--check"]) == 0  # RESULTS.md is the default


def test_results_check_fails_on_a_hand_edit(tmp_path, capsys):
    results = (REPO / "RESULTS.md").read_text()
    edited = tmp_path / "RESULTS.md"
    edited.write_text(results.replace("| 16 nodes x 8 MI300, fault / 180 s | ", "| 16 nodes x 8 MI300, fault / 180 s | 1", 1))
    assert edited.read_text() != results
    assert load_bench("readme_tables").main(["--check", "--results", str(edited)]) == 1
    assert "bench/readme_tables.py --write" in capsys.readouterr().out


def test_readme_is_a_short_guide_that_links_to_the_lab_book():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 600, "README.md is the guide: measurements and their prose go to RESULTS.md"
    assert "](RESULTS.md" in readme
    assert "<!-- /" not in readme, "generated blocks live in RESULTS.md"


def test_seed_clusters_json_is_what_seed_clusters_py_computes_from_the_measured_failures():
    committed = json.loads((REPO / "bench/results/seed_clusters.json").read_text())
    failures = json.loads((REPO / committed["from"]).read_text())["failures"]
    scale_from = committed.get("scale", {}).get("from")
    scale = json.loads((REPO / scale_from).read_text())["records"] if scale_from else None
    parts_from = committed.get("parts", {}).get("from")
    parts = json.loads((REPO / parts_from).read_text()) if parts_from else None
    again = load_bench("seed_clusters").seed_clusters(
        failures, scale, source=committed["from"], scale_source=scale_from or "", parts_json=parts,
        parts_source=parts_from or "", parts_model=committed.get("parts", {}).get("model"))
    assert json.loads(json.dumps(again)) == committed


def test_scale_model_json_clusters_come_from_the_same_code():
    committed = json.loads((REPO / "bench/results/scale_model.json").read_text())
    seed = json.loads((REPO / "bench/results/seed_clusters.json").read_text())
    assert committed["fit"] == seed["fit"]
    again = load_bench("bench_scale_model").summarize(committed["failures"])  # the fit alone, no parts
    assert json.loads(json.dumps(again["clusters"])) == committed["clusters"]


def test_every_field_of_the_soak_json_is_one_soak_py_writes():
    written = set(re.findall(r'"(\w+)"(?::|\] =)', (REPO / "bench/soak.py").read_text()))
    for name in ("soak.json", "soak_kernel.json"):
        path = REPO / "bench/results" / name
        if path.exists():
            fields = set(json.loads(path.read_text()))
            assert fields <= written, f"{name}: not written by bench/soak.py: {sorted(fields - written)}"


def test_the_soak_fits_the_controllers_memory_slope_after_its_warm_up():
    soak = load_bench("soak")
    # 50 MB of warm-up in the first 5 minutes, then 10 MB per hour
    samples = [[t, 400.0 + min(t, 300) / 6 + t * 10 / 3600] for t in range(0, 1800, 20)]
    assert abs(soak.slope_mb_per_hour(samples, 300) - 10) < 1e-6
    assert soak.slope_mb_per_hour(samples, 0) > 20  # the warm-up, if fitted, would dominate
    assert soak.slope_mb_per_hour(samples[:2], 0) is None


def test_the_soak_tells_a_window_filling_from_a_leak_by_its_slope_per_five_minutes():
    soak = load_bench("soak")
    # 30 MB filling over the first 15 minutes, then flat; a leak of 12 MB/h beside it
    fill = [[t, 400.0 + min(t, 900) / 30] for t in range(0, 2400, 20)]
    leak = [[t, 400.0 + t * 12 / 3600] for t in range(0, 2400, 20)]
    fill_slopes = [w[2] for w in soak.window_slopes(fill)]
    assert [w[:2] for w in soak.window_slopes(fill)][:2] == [[0.0, 5.0], [5.0, 10.0]] and len(fill_slopes) == 7
    assert fill_slopes[0] == pytest.approx(120) and fill_slopes[-1] == pytest.approx(0)
    assert all(w[2] == pytest.approx(12) for w in soak.window_slopes(leak))
    assert soak.window_slopes(fill[:10]) == []  # shorter than one window


def test_the_soak_splits_resident_memory_into_anonymous_and_file_backed():
    import os

    soak = load_bench("soak")
    kb = soak.rss_parts_kb(os.getpid())  # this process, read from /proc as the soak reads the kernel's
    assert kb and kb["RssAnon"] > 0 and kb["RssFile"] > 0
    assert soak.rss_parts_kb(2**22 + 7) is None  # no such process
    parts = [[t, 300.0 + t * 10 / 3600, 50.0 + t * 40 / 3600, 1.0] for t in range(0, 1800, 20)]
    slopes = soak.memory_fields([[p[0], p[1] + p[2] + p[3]] for p in parts], 5, parts)["rss_part_slopes_mb_per_hour"]
    assert slopes["anon"] == pytest.approx(10) and slopes["file"] == pytest.approx(40) and slopes["shmem"] == 0


def test_the_heal_json_has_every_path_at_every_size_with_fields_bench_heal_writes():
    result = json.loads((REPO / "bench/results/heal.json").read_text())
    written = set(re.findall(r'"(\w+)"', (REPO / "bench/bench_heal.py").read_text())) | set(
        re.findall(r"(\w+)=", (REPO / "bench/bench_heal.py").read_text()))
    paths: dict[float, set[str]] = {}
    for r in result["records"]:
        assert set(r) <= written, sorted(set(r) - written)
        paths.setdefault(r.get("size_asked_gb", r["size_gb"]), set()).add(r["path"])
        if r["path"] in ("heal", "heal_striped"):  # the striped transport says where its time went
            assert set(r["breakdown"]) == {"manifest_s", "fetch_s", "apply_s"} and r["corrupt"] == 0
    wanted = {"memcpy", "loopback_1", "torchft_http", "striped_1", "heal", "heal_striped", "heal_torchft", "torchft_pg"}
    assert all(wanted <= got for got in paths.values()), paths


def test_the_heal_links_json_has_a_heal_per_donor_count_whose_bytes_left_the_donors():
    """bench_heal_links.py: one heal per k, every survivor a donor, and the donors' rate limiters
    counted the state leaving them (their shares add up to it)."""
    result = json.loads((REPO / "bench/results/heal_links.json").read_text())
    written = set(re.findall(r'"(\w+)"', (REPO / "bench/bench_heal.py").read_text()
                             + (REPO / "bench/bench_heal_links.py").read_text())) | set(
        re.findall(r"(\w+)=", (REPO / "bench/bench_heal.py").read_text() + (REPO / "bench/bench_heal_links.py").read_text()))
    ks = []
    for r in result["records"]:
        assert set(r) <= written, sorted(set(r) - written)
        ks.append(r["survivors"])
        donors = {n for i, n in r["nodes"].items() if int(i) < r["survivors"]}
        sent = sum(gb for key, gb in r["sent_gb"].items() if key.split("/")[0] in donors and key.endswith("/mnb0"))
        assert r["donors"] == r["survivors"] and sent >= r["size_gb"], r
        assert r["speedup"] == r["gbps"] / next(x["gbps"] for x in result["records"] if x["survivors"] == 1)
    assert ks == sorted(set(ks)) and ks[0] == 1, ks


def test_the_goodput_json_has_every_arm_at_every_size_and_where_its_time_went():
    """bench_goodput.py's shape (issue: records of groups x arm, lost_s split by cause), and its
    sums: a restart arm's parts come from its own events, ``other`` is the rest of the loss."""
    result = json.loads((REPO / "bench/results/goodput.json").read_text())
    recs = result["records"]
    bench = load_bench("bench_goodput")
    goodput_records = load_bench("goodput_records")  # reads records of before on_failure had its name too
    arms = result["args"]["arms"] or (bench.QUICK_ARMS if result["args"]["quick"] else bench.ARMS)
    races = list(dict.fromkeys(bench.race(r) for r in recs))  # (groups, flavour), in the order they ran
    assert {r["groups"] for r in recs} == {int(x.partition(":")[0]) for x in result["args"]["groups"].split(",")}
    for key in races:
        assert [r["arm"] for r in recs if bench.race(r) == key] == list(arms), key
    if result["args"]["quick"]:  # the heavier flavour races at the smallest size too
        assert (min(g for g, _ in races), "debugmodel") in races and any(m == "tiny" for _, m in races), races
    for r in recs:
        lost = r["lost_s"]
        assert set(lost) == {"detect", "respawn", "load", "redo", "checkpoint_stalls", "survivor_stalls", "steady_steps", "other",
                             "total"}
        assert abs(sum(v for k, v in lost.items() if k != "total") - lost["total"]) < 1e-6
        if goodput_records.on_failure(r) in ("restart", "plain_restart"):
            assert r["restarts"] >= 1 and lost["respawn"] > 0 and lost["load"] > 0, r["arm"]
        if r["arm"] == "no_faults":
            assert r["faults"] == 0 and r["checkpoint_every"] is None
        else:
            assert r["faults"] >= 1, r["arm"]
        if r["arm"] in ("peer", "peer_spare", "restart", "plain_restart"):  # one checkpoint rule for all
            assert r["checkpoint_every"] == r["young_daly_k"], r["arm"]
        # Young/Daly from the whole cost of a save (stall and the slowdown its write causes)
        assert r["save_cost_s"] >= r["save_stall_s"] > 0, r["arm"]
        assert r["young_daly_k"] == bench.young_daly_k(r["save_cost_s"], result["args"]["period"], r["step_time_s"])
    for key in races:  # the most peer could gain on each arm: its own fault-free pace
        same = {r["arm"]: r for r in recs if bench.race(r) == key}
        pace = same["no_faults"]["wall_s"] + same["peer"]["lost_s"]["steady_steps"]
        ref = same["no_faults"]
        for r in same.values():
            reached = bench.reached(r)
            assert abs(r["peer_ceiling"] - r["wall_s"] * r["target_step"] / reached / pace) < 1e-9, r["arm"]
            # goodput is a rate of progress; an arm short of the target ran for exactly its limit
            assert abs(r["goodput"] - (reached / r["wall_s"]) / (ref["target_step"] / ref["wall_s"])) < 1e-9, r["arm"]
            if reached < r["target_step"]:
                assert r["limit_s"] and abs(r["wall_s"] - r["limit_s"]) < 1e-6, r["arm"]


def test_a_saves_cost_is_its_stall_and_the_steps_its_write_slows():
    """Young/Daly's save cost (bench_goodput's calibration): a save at step s stalls step s+1 and
    its background write slows s+1 and s+2; the cost per save is all of that, not the stall."""
    from types import SimpleNamespace as E

    bench = load_bench("bench_goodput")
    t, steps = 0.0, []
    for s in range(1, 41):
        t += 0.1 + {1: 0.05, 2: 0.1}.get(s % 10, 0.0)  # saves at 10, 20, 30, 40 slow the two steps after
        steps.append(E(step=s, t=t))
    saves = [E(step=s, stall=0.01) for s in (10, 20, 30, 40)]
    cal = bench.calibration(steps, saves)
    assert abs(cal.step_s - 0.1) < 1e-9 and cal.save_stall_s == 0.01
    assert abs(cal.save_cost_s - 0.15) < 1e-9, cal
    assert bench.calibration(steps[:12], saves[:1]).save_cost_s == 0.01  # one save: no span to measure, its stall


def test_the_crossover_json_is_what_bench_crossover_composes_from_the_measured_races():
    """Issue 39's crossover: composed from bench_goodput's records (a hand edit fails), every
    race on the 30 s - 24 h grid, and debugmodel at 8 groups measured at two periods or more,
    each measured point composed again from the race's other periods (the check)."""
    committed = json.loads((REPO / "bench/results/crossover.json").read_text())
    crossover = load_bench("bench_crossover")
    assert json.loads(json.dumps(crossover.build(committed["from"], committed.get("overhead_from")))) == committed
    for rec in committed["records"]:
        assert {"model", "groups", "period_s", "peer_goodput", "plain_restart_goodput", "measured"} <= set(rec), rec
    grid = {(r["model"], r["groups"]): set() for r in committed["records"]}
    for r in committed["records"]:
        if not r["measured"]:
            grid[(r["model"], r["groups"])].add(r["period_s"])
    assert all(periods == set(map(float, crossover.GRID)) for periods in grid.values()), grid
    measured = [r for r in committed["records"] if r["measured"] and (r["model"], r["groups"]) == ("debugmodel", 8)]
    assert len(measured) >= 2 and all(r["checked"] for r in measured), measured
    assert all(r["peer_composed_from"] != [r["period_s"]] for r in measured)


def test_the_crossover_composition_and_its_break_even():
    """goodput = pace * (1 - lost per fault / period): two arms whose break-even is known."""
    crossover = load_bench("bench_crossover")
    peer = {"arm": "peer", "pace": 0.9, "fixed_s": 2.0, "save_cost_s": 0.0, "step_s": 0.001, "saves": False}
    plain = dict(peer, arm="plain_restart", pace=1.0, fixed_s=20.0)  # redoes half a step per fault
    assert abs(crossover.compose(peer, 30.0) - 0.9 * (1 - 2 / 30)) < 1e-12
    assert crossover.compose(plain, 10.0) == 0.0  # a fault costs more than the period: no progress
    even = 18.2005 / 0.1  # 0.9 (1 - 2/P) = 1 - 20.0005/P
    assert abs(crossover.crossover(peer, plain) - even) < 1e-6
    assert crossover.crossover(peer, dict(plain, pace=0.8)) is None  # peer ahead everywhere
    saves = dict(peer, saves=True, save_cost_s=0.5, step_s=0.1)  # K = round(sqrt(2*0.5*100)/0.1) = 100
    assert abs(crossover.compose(saves, 100.0) - 0.9 / (1 + 0.5 / 10.0) * (1 - 2 / 100)) < 1e-12


def test_the_build_profile_keeps_the_heaviest_torch_and_torchtitan_imports():
    heaviest = load_bench("build_profile").heaviest
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       500 |       1200 |   json",
        "import time:      2000 |     400000 |     torch._dynamo",
        "import time:     21000 |    1000000 | torch",
        "import time:       300 |    1020000 | torchtitan.models.common.attention",
        "W1205 a warning line from a C++ library",
    ])
    got = heaviest(stderr, top=2)
    assert got == [{"module": "torchtitan.models.common.attention", "cumulative_s": 1.02},
                   {"module": "torch", "cumulative_s": 1.0}]


def test_the_overhead_profile_splits_the_training_threads_samples_into_the_steps_parts():
    classify = load_bench("overhead_profile").classify
    loop = "Thread._bootstrap (threading.py:1);TrainerActor._loop (trainer_actor.py:1)"
    raw = "\n".join([
        f"{loop};TrainStep._compute (train_step.py:1);forward (model.py:1) 60",
        f"{loop};Manager.start_quorum (manager.py:1);Future.result (_base.py:1) 25",
        f"{loop};Manager.should_commit (manager.py:1) 10",
        f"{loop};TrainStep._average (train_step.py:1) 5",
        "Thread._bootstrap (threading.py:1);heartbeat (manager.py:1) 40",  # another thread: not counted
    ])
    out = classify(raw)
    assert out["samples"] == 140 and out["training_thread_samples"] == 100
    assert out["shares"] == {"compute": 0.6, "quorum": 0.25, "should_commit": 0.1, "average": 0.05}
    assert out["detail"]["start_quorum"] == [{"share": 0.25, "below": "Future.result"}]
    assert out["detail"]["should_commit"] == [{"share": 0.1, "below": "(in the call itself)"}]
    saved = json.loads((Path(__file__).parent.parent / "bench/results/overhead_profile.json").read_text())
    assert saved["training_thread_samples"] > 1000 and set(saved["shares"]) >= {"compute", "quorum", "should_commit"}


def test_the_dashboards_curves_are_full_before_the_soaks_fit_window_opens():
    """At a training run's pace (5 steps/s, 3 groups) the shipped windows fill within the soak's
    5-minute warm-up; the old 2,000-point window still grew over minutes 5-20, a slope in every soak."""
    bench = load_bench("dashboard_memory")
    from monarch_nb.notebook import dashboard_model as dm

    shipped = bench.fit_window_slope(bench.model_fill(dm.POINTS_KEPT, groups=3, steps=6000, step_hz=5.0))
    old = bench.fit_window_slope(bench.model_fill(2000, groups=3, steps=6000, step_hz=5.0))
    assert shipped < 0.5 < 2 < old, (shipped, old)
    recorded = json.loads((REPO / "bench/results/dashboard_memory.json").read_text())
    assert recorded["shipped_points_kept"] == dm.POINTS_KEPT
    assert recorded["strings_laid_out"]["live"] < recorded["frames"] / 4 < recorded["strings_laid_out"]["static"]


def test_bench_recovery_names_the_fault_kind_and_sync_mode_behind_every_back_figure():
    """Issue 53: the summary said "0.42 s without (0.7x)" over mixed kinds; now one line per kind
    and sync mode, and the semi-synchronous run against the synchronous one per kind."""
    rec = dict(transport="striped")
    records = [dict(rec, kind="kill", semi_sync=None, spare=True, back_s=0.4, rung="process"),
               dict(rec, kind="kill", semi_sync=None, spare=False, back_s=5.0, rung="process"),
               dict(rec, kind="comms", semi_sync=None, spare=False, back_s=0.3, rung="communicator"),
               dict(rec, kind="comms", semi_sync="diloco", spare=False, back_s=0.6, rung="communicator")]
    lines = load_bench("bench_recovery").back_lines(records)
    assert "kill (synchronous, rung process): victim back median 0.40 s with a spare, 5.00 s without (12.5x)" in lines
    assert "comms (diloco, rung communicator): victim back median 0.60 s without" in lines
    assert "comms: diloco back 0.60 s vs synchronous 0.30 s (2.0x)" in lines
    assert not any("kill" in line and "diloco" in line for line in lines)


def test_the_drain_and_straggler_jsons_hold_the_records_their_benches_write():
    """bench_drain: lost_steps, stall_steps, identical, seconds per drain; bench_stragglers:
    slow_factor, policy, named_after_steps, steps_per_s per slow run, and for fault-free runs
    fault_free with stragglers_named (the figures RESULTS.md quotes)."""
    results = REPO / "bench" / "results"
    drain = json.loads((results / "drain.json").read_text())["records"]
    assert drain and all({"lost_steps", "stall_steps", "identical", "seconds"} <= set(r) for r in drain)
    assert all(r["lost_steps"] == 0 and r["identical"] for r in drain)
    slow = json.loads((results / "stragglers.json").read_text())["records"]
    moved = [r for r in slow if not r["fault_free"]]
    assert {r["policy"] for r in moved} == {"observe", "drain", "drop"}
    assert all({"slow_factor", "named_after_steps", "steps_per_s"} <= set(r) for r in moved)
    assert all(r["named_after_steps"] <= 30 for r in moved)
    quiet = [r for r in slow if r["fault_free"]]
    assert {r["replicas"] for r in quiet} >= {3, 8} and all(r["stragglers_named"] == 0 for r in quiet)
