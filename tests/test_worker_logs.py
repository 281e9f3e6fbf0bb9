"""Reading and folding worker log files (monarch_nb.worker_logs), on files written the way the
workers write them: timestamped, rank-prefixed Python lines and bare native lines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from monarch_nb import worker_logs as wl

T0 = time.mktime(time.strptime("2026-11-29 10:00:00", "%Y-%m-%d %H:%M:%S"))


def stamp(seconds: float) -> str:
    t = T0 + seconds
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(round(t % 1 * 1000)):03d}"


def write(log_dir: Path, mesh: str, rank: int, lines: list[tuple[float | None, str]]) -> Path:
    """(seconds, text) lines; seconds None: a native write (no prefix)."""
    path = wl.log_path(log_dir, mesh, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for t, text in lines:
            f.write(f"{stamp(t)} [{mesh} rank {rank}] {text}\n" if t is not None else text + "\n")
    return path


GLOO_TRACE = [
    (None, "Traceback (most recent call last):"),
    (None, '  File "torchft/process_group.py", line 100, in wait'),
    (None, "    work.wait()"),
    (None, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
]


def test_a_traceback_is_one_line_with_its_text_and_native_lines_take_the_time_before_them(tmp_path):
    write(tmp_path, "main", 0, [(1.0, "hello"), (None, "a native line"), (2.0, "WARNING x: careful"),
                                (None, "Traceback (most recent call last):"), (None, '  File "a.py", line 3, in f'),
                                (None, "ValueError: bad 41")])
    lines = wl.read_logs(tmp_path)
    assert [ln.text for ln in lines] == ["hello", "a native line", "WARNING x: careful", "ValueError: bad 41"]
    assert lines[1].t == pytest.approx(T0 + 1.0)
    assert lines[3].detail.startswith("Traceback") and 'File "a.py"' in lines[3].detail
    assert 'File "a.py"' in lines[3].render()  # a real error is shown whole


def test_the_same_line_from_many_ranks_is_shown_once_naming_how_many(tmp_path):
    for rank in range(12):
        write(tmp_path, "main", rank, [(1.0 + rank * 0.01, "loading tokenizer.json")])
    (line,) = wl.aggregate(wl.read_logs(tmp_path))
    assert line.count == 12 and len(line.where) == 12
    assert "[main x 12 ranks] loading tokenizer.json" in line.render()


def test_lines_of_different_ranks_that_differ_in_a_number_stay_apart(tmp_path):
    write(tmp_path, "main", 0, [(1.0, "loss 3.21")])
    write(tmp_path, "main", 1, [(1.1, "loss 4.05")])
    assert [ln.text for ln in wl.aggregate(wl.read_logs(tmp_path))] == ["loss 3.21", "loss 4.05"]


def test_a_per_step_line_of_one_rank_folds_into_its_latest_text_with_a_count(tmp_path):
    write(tmp_path, "replica0", 0, [(i * 0.3, f"INFO torchft.manager: step {i} should_commit=True") for i in range(50)]
          + [(16.0, "INFO torchft_commits: "), (16.1, "")])
    (line,) = wl.aggregate(wl.read_logs(tmp_path))  # the empty structured-logger lines are dropped
    assert line.count == 50 and line.text.endswith("step 49 should_commit=True")
    assert "[x 50 since" in line.render()


def test_a_fault_s_noise_from_every_survivor_is_one_line_and_stays_in_the_files(tmp_path):
    for rank in range(3):
        write(tmp_path, "replica0", rank, [(5.0 + rank * 0.1, "step 7 ok"), (6.0, "")] + GLOO_TRACE
              + [(6.5, "INFO torchft.manager: got exception in all reduce -- skipping")])
    lines = wl.aggregate(wl.read_logs(tmp_path))
    noise = [ln for ln in lines if "full text in the log files" in ln.text]
    assert [ln.text.split(" (")[0] for ln in noise] == [
        "gloo: a peer's connection closed", "torchft: a collective failed; the step is not committed and retried at the "
        "next quorum"]
    assert noise[0].count == 3 and len(noise[0].where) == 3
    assert all("Connection closed by peer" in p.read_text() for p in tmp_path.glob("*.log"))  # nothing lost


def test_a_burst_that_comes_back_later_is_a_second_line(tmp_path):
    write(tmp_path, "replica0", 0, GLOO_TRACE[:0] + [(1.0, "Connection reset by peer"), (40.0, "Connection reset by peer")])
    assert len(wl.aggregate(wl.read_logs(tmp_path))) == 2


def test_the_follower_reads_only_what_was_appended_and_holds_back_a_partial_line(tmp_path):
    path = write(tmp_path, "main", 0, [(1.0, "first")])
    follower = wl.LogFollower(tmp_path)
    assert follower.poll() == 1
    assert follower.poll() == 0
    with open(path, "a") as f:
        f.write(f"{stamp(2.0)} [main rank 0] second\n{stamp(3.0)} [main rank 0] thi")
    assert follower.poll() == 1
    with open(path, "a") as f:
        f.write("rd\n")
    assert follower.poll() == 1
    assert [ln.text for ln in follower.tail(10)] == ["first", "second", "third"]


def test_a_spare_that_took_a_group_s_name_appends_to_that_group_s_file(tmp_path):
    write(tmp_path, "replica1", 0, [(1.0, "--- process 10 writes here as replica1 rank 0 ---"), (2.0, "old")])
    write(tmp_path, "replica1", 0, [(9.0, "--- process 20 writes here as replica1 rank 0 ---"), (9.5, "new")])
    view = wl.view(tmp_path, mesh="replica1", rank=0)
    assert [ln.text for ln in view.lines][-1] == "new" and len(view.files) == 1


def test_grep_tail_and_a_directory_with_no_logs(tmp_path):
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    write(tmp_path, "main", 0, [(float(i), f"{w} {'odd' if i % 2 else 'even'}") for i, w in enumerate(words)])
    write(tmp_path, "other", 0, [(1.0, "elsewhere")])
    view = wl.view(tmp_path, mesh="main", grep="odd", tail=2)
    assert [ln.text for ln in view.lines] == ["delta odd", "foxtrot odd"]
    assert "elsewhere" not in view.text() and "1 log files" in view.text()
    assert "no worker logs under" in wl.view(tmp_path / "nothing").text()
