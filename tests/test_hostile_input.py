"""Whatever a person points monarch_nb at, it answers: damaged event logs open with their bad
lines skipped and counted, a file that is no event log is refused naming the file, and
``monarch-nb execute`` refuses a non-notebook in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_nb.ft import open_run
from monarch_nb.telemetry import EventStore
from monarch_nb.telemetry.decode import event_from_dict
from monarch_nb.telemetry.events import RunStopped, Step, UnknownEvent
from monarch_nb.telemetry.store import MAX_LINE_BYTES, SKIPPED_KEPT, NotAnEventLog

REPO = Path(__file__).resolve().parent.parent


def step(t: float, s: int, replica: int = 0) -> str:
    return json.dumps({"t": t, "kind": "step", "replica": replica, "step": s, "loss": 3.0 - 0.1 * s,
                       "tokens_per_s": 100.0, "committed": True})


def started(t: float = 1.0) -> str:
    return json.dumps({"t": t, "kind": "run_started", "run_id": "r", "config": {"replicas": 1}})


def write(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


DAMAGED = [  # (line, what the reason says)
    (b"\x00\x9f\xff binary \xfe", "binary bytes"),
    (b"[1, 2, 3]", "a JSON array, not an object"),
    (b'"just a string"', "a JSON string, not an object"),
    (b'{"t": 5, "kind": "step", "replica": 0}', "step: missing step, loss, tokens_per_s, committed"),
    (b'{"t": "yesterday", "kind": "step"}', "step: 't' is string 'yesterday'"),
    (b'{"t": NaN, "kind": "run_stopped", "run_id": "r"}', "run_stopped: 't' is number nan"),
    (b'{"kind": "run_stopped", "run_id": "r"}', "run_stopped: no 't'"),
    (b'{"t": 5, "replica": 0}', "no 'kind'"),
    (b'{"t": 5, "kind": 7}', "'kind' is a JSON number"),
    (b'{"t": 5, "kind": "step", "replica": "0", "step": 1, "loss": 1.0, "tokens_per_s": 1.0, "committed": true}',
     "step: replica is string '0', expected int"),
    (b"[" * 100_000 + b"]" * 100_000, "not readable JSON (RecursionError)"),
    (b'{"t": 5, "kind": "step", "step": ' + b"9" * 5000 + b"}", "not readable JSON (ValueError)"),
    (b"{not json at all", "not JSON"),
]


def test_a_damaged_log_opens_with_every_bad_line_skipped_counted_and_named(tmp_path):
    path = write(tmp_path / "events.jsonl", started(), step(2.0, 0),
                 *[line for line, _ in DAMAGED], step(3.0, 1),
                 json.dumps({"t": 4.0, "kind": "from_a_newer_writer", "x": 1}))
    store = EventStore.open(path)
    kinds = [e.kind for e in store]
    assert kinds[:3] == ["run_started", "step", "step"] and isinstance(store.events()[-1], UnknownEvent)
    assert store.skipped_lines == len(DAMAGED)
    assert [n for n, _ in store.skipped] == list(range(3, 3 + len(DAMAGED)))
    for (line_no, reason), (_, expected) in zip(store.skipped, DAMAGED):
        assert reason.startswith(expected), (line_no, reason, expected)

    history = open_run(tmp_path)
    summary = history.summary()
    assert summary["skipped_lines"] == len(DAMAGED) and summary["committed_steps"] == 1
    assert f"{len(DAMAGED)} damaged lines skipped (line 3: binary bytes" in repr(history)


def test_a_torn_last_line_is_skipped_counted_and_never_glued_to_the_next_event(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(started() + "\n" + step(2.0, 0) + "\n" + '{"t": 3.0, "kind": "st')
    store = EventStore.open(path)
    assert len(store) == 2 and store.skipped == [(3, "torn last line (the writer stopped mid-line)")]
    # Resuming the log appends after a newline, so the next event is not lost to the torn line.
    follow = EventStore.open(path, follow=True)
    follow.append(RunStopped(t=4.0, run_id="r"))
    follow.close()
    reopened = EventStore.open(path)
    assert [e.kind for e in reopened] == ["run_started", "step", "run_stopped"]
    assert reopened.skipped_lines == 1


def test_an_overlong_line_is_skipped_without_reading_it_whole(tmp_path):
    path = write(tmp_path / "events.jsonl", started(), b"x" * (3 * MAX_LINE_BYTES + 17), step(2.0, 0))
    store = EventStore.open(path)
    assert [e.kind for e in store] == ["run_started", "step"]
    assert store.skipped == [(2, f"longer than {MAX_LINE_BYTES} bytes")]


def test_only_the_first_skipped_lines_keep_their_reason_but_all_are_counted(tmp_path):
    path = write(tmp_path / "events.jsonl", started(), *["garbage"] * (SKIPPED_KEPT + 30))
    store = EventStore.open(path)
    assert store.skipped_lines == SKIPPED_KEPT + 30 and len(store.skipped) == SKIPPED_KEPT


@pytest.mark.parametrize("content", [
    b"import os\nprint('hello')\n",
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",
    b'{"cells": [], "metadata": {}, "nbformat": 4}\n',  # a notebook: JSON, but not one event a line
    b'{"name": "not an event"}\n{"t": 1}\n',
], ids=["python", "binary", "notebook", "other-jsonl"])
def test_a_file_that_is_no_event_log_is_refused_naming_it_and_the_format(tmp_path, content):
    path = tmp_path / "mystery.txt"
    path.write_bytes(content)
    with pytest.raises(NotAnEventLog) as info:
        open_run(path)
    message = str(info.value)
    assert message.startswith(f"no line of {path} is a monarch_nb event")
    assert "JSON objects with 'kind' and 't', one per line" in message and "events.jsonl" in message
    assert isinstance(info.value, ValueError)


def test_an_empty_log_is_an_empty_run(tmp_path):
    (tmp_path / "events.jsonl").write_bytes(b"\n\n")
    history = open_run(tmp_path)
    assert len(history.events) == 0 and history.events.skipped_lines == 0
    assert history.summary()["state"] == "not started" and history.summary()["committed_steps"] == 0


def test_event_from_dict_names_the_kind_and_the_field_it_rejects():
    with pytest.raises(ValueError, match=r"^healed: missing bytes, seconds, source_replica$"):
        event_from_dict({"t": 1.0, "kind": "healed", "replica": 0, "step": 1})
    with pytest.raises(ValueError, match=r"^step: committed is number 1, expected bool$"):
        event_from_dict({"t": 1.0, "kind": "step", "replica": 0, "step": 1, "loss": 1.0, "tokens_per_s": 1.0,
                         "committed": 1})
    # optional fields take null, ints pass as floats, a diverged loss (NaN) is data, not damage
    e = event_from_dict({"t": 1, "kind": "step", "replica": 0, "step": 1, "loss": float("nan"),
                         "tokens_per_s": 7, "committed": False, "quorum_id": None})
    assert isinstance(e, Step) and e.quorum_id is None and e.tokens_per_s == 7


# ---- monarch-nb execute on things that are no notebook ----------------------------------


def execute(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", "execute", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("name,content,why", [
    ("train.py", b"import torch\nprint('train')\n", "not JSON"),
    ("data.ipynb", b'{"rows": [1, 2]}', "JSON without 'nbformat' and 'cells'"),
    ("blob.ipynb", b"\x00\xff\xfe\x01", "not JSON"),
    ("empty.ipynb", b"", "not JSON"),
    ("broken.ipynb", b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": "x"}',
     "nbformat cannot read it"),
])
def test_execute_refuses_a_non_notebook_in_one_line_naming_it_and_the_fix(tmp_path, name, content, why):
    path = tmp_path / name
    path.write_bytes(content)
    proc = execute(str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"monarch-nb: {path} is not a Jupyter notebook ({why}")
    assert "pass an .ipynb notebook" in lines[0]
    if name.endswith(".py"):
        assert f"run the script with `python {path}`" in lines[0]
