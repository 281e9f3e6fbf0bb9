"""The quick goodput comparison, as CI runs it: the same model, data and kill schedule with peer
recovery and with checkpoint-restart; peer recovery must reach the target step sooner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_quick_goodput_run_peer_recovery_beats_checkpoint_restart(tmp_path):
    out = tmp_path / "goodput.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_goodput.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = {r["arm"]: r for r in json.loads(out.read_text())["records"]}
    assert set(records) == {"no_faults", "peer", "restart"}
    for r in records.values():
        assert {"arm", "goodput", "steps_lost", "faults", "wall_s"} <= set(r)
    peer, restart = records["peer"], records["restart"]
    assert peer["faults"] >= 1 and restart["faults"] >= 1, (peer["faults"], restart["faults"])
    assert peer["goodput"] > restart["goodput"], (peer["goodput"], restart["goodput"])
    assert restart["restarts"] >= 1 and peer["restarts"] == 0
    assert (out.parent / "goodput-loss.png").exists() and (out.parent / "goodput-groups.png").exists()
