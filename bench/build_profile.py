"""Where a worker's build goes: the process rung's ``build`` phase, taken apart.

A replaced group's new process imports torch and torchtitan and builds its model, optimizer and
data before it can heal (``bench_recovery.py``'s ``build``). Each repeat runs in a fresh
interpreter (the imports are the point): ``python -X importtime`` splits the imports by
top-level package and by the heaviest modules, and the rank's parts are then built as a warm
spare does (``ReplicaTrainer(replica=None)``: everything but the torchft Manager), timed apart.

JSON: ``{"records": [{"repeat", "import_torch_s", "import_torchtitan_s", "build_parts_s",
"total_s", "heaviest": [{"module", "cumulative_s"}]}], "argv": [...], "cpus": N}``.

Usage: python bench/build_profile.py --repeats 3 --out bench/results/build_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, time
t0 = time.time()
import torch
t1 = time.time()
from monarch_nb import seam
seam.stub_triton_kernels()
seam.import_torchtitan()
t2 = time.time()
from monarch_nb.ft.settings.config import RunConfig
from monarch_nb.ft.settings.tinydata import ensure_tinydata
from monarch_nb.ft.worker.replica_trainer import ReplicaTrainer
cfg = {**RunConfig(replicas=1).to_dict(), "respawn": None, "run_id": "profile", "checkpoint_dir": %r,
       "advertise_host": "127.0.0.1", "communicator_at_once": True}
data = ensure_tinydata()
t3 = time.time()
ReplicaTrainer(cfg, replica=None, rank=0, group_size=1, lighthouse=None, store_port=None, data_dir=data,
               emit=lambda e: None)
t4 = time.time()
print(json.dumps({"import_torch_s": t1 - t0, "import_torchtitan_s": t2 - t1, "build_parts_s": t4 - t3,
                  "total_s": t4 - t0}))
"""


def heaviest(importtime: str, top: int) -> list[dict]:
    """The modules with the largest cumulative import time (-X importtime's stderr)."""
    rows = []
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        try:
            rows.append({"module": name.strip(), "cumulative_s": int(cumulative) / 1e6})
        except ValueError:  # the header line
            continue
    picked = [r for r in rows if r["module"].split(".")[0] in ("torch", "torchtitan", "spmd_types", "torchft")]
    return sorted(picked, key=lambda r: -r["cumulative_s"])[:top]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=12, help="heaviest modules kept per repeat")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeats):
            proc = subprocess.run([sys.executable, "-X", "importtime", "-c", CHILD % tmp], capture_output=True,
                                  text=True, timeout=300, check=True)
            rec = {"repeat": n, **json.loads(proc.stdout.strip().splitlines()[-1]),
                   "heaviest": heaviest(proc.stderr, args.top)}
            records.append(rec)
            print(f"repeat {n}: torch {rec['import_torch_s']:.2f} s, torchtitan {rec['import_torchtitan_s']:.2f} s, "
                  f"parts {rec['build_parts_s']:.2f} s, total {rec['total_s']:.2f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"records": records, "argv": sys.argv[1:], "cpus": os.cpu_count()},
                                         indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
