"""What a person waits for when looking inside the workers, in a real Monarch kernel.

* interrupt: the kernel is interrupted during a ``%%monarch`` cell sleeping 120 s on every rank;
  seconds from the interrupt to the cell's reply (the cell ended on the workers too);
* stacks: ``%monarch stacks`` of an idle mesh and of a rank holding the GIL (py-spy), and the
  faulthandler fallback on the GIL-holding rank (``Session.stacks`` with py-spy hidden);
* logs: ``%monarch logs`` over a log directory of R ranks x N lines, and the dashboard panel's
  incremental read of one more second of output.

Usage: python bench/bench_observability.py [--ranks 4] [--repeats 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.kernel_client import run_in_kernel  # noqa: E402

SLEEP_CELL = "%%monarch\nimport time\ntime.sleep(120)"
# The cell returns first (its reply needs the GIL), then its thread takes the GIL for 60 s.
HOLD_GIL = ("%%monarch --on gpus=0\nimport ctypes, threading\n"
            "def hold_the_gil():\n    threading.Event().wait(1.0)\n"
            "    libc = ctypes.PyDLL(None); libc.sleep.argtypes = [ctypes.c_uint]; libc.sleep(60)\n"
            "threading.Thread(target=hold_the_gil, daemon=True).start()")


def timed(client, code: str, expect: str | None = None) -> float:
    t0 = time.monotonic()
    status, out = run_in_kernel(client, code, timeout=180)
    took = time.monotonic() - t0
    if status != "ok" or (expect and expect not in out):
        raise RuntimeError(f"expected {expect!r}: {out[-2000:]}")
    return took


def interrupt_once(km, client, after_s: float = 2.0) -> float:
    fired = []
    timer = threading.Timer(after_s, lambda: (fired.append(time.monotonic()), km.interrupt_kernel()))
    timer.start()
    client.execute_interactive(SLEEP_CELL, timeout=180)
    return time.monotonic() - fired[0]


def logs_read(ranks: int, lines: int) -> dict:
    from monarch_nb import worker_logs

    with tempfile.TemporaryDirectory() as tmp:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        for r in range(ranks):
            with open(worker_logs.log_path(tmp, "replica0", r), "w") as f:
                for i in range(lines):
                    f.write(f"{stamp}.000 [replica0 rank {r}] INFO torchft.manager: step {i} should_commit=True\n")
        t0 = time.monotonic()
        view = worker_logs.view(tmp, tail=40)
        full_s = time.monotonic() - t0
        follower = worker_logs.LogFollower(tmp)
        follower.poll()
        with open(worker_logs.log_path(tmp, "replica0", 0), "a") as f:
            for i in range(20):
                f.write(f"{stamp}.500 [replica0 rank 0] INFO torchft.manager: step {lines + i} should_commit=True\n")
        t0 = time.monotonic()
        follower.poll()
        follower.tail(14)
        incremental_s = time.monotonic() - t0
        return {"ranks": ranks, "lines_per_rank": lines, "bytes": sum(p.stat().st_size for p in Path(tmp).glob("*")),
                "view_s": round(full_s, 4), "view_lines": len(view.lines),
                "panel_incremental_s": round(incremental_s, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()

    km = KernelManager(kernel_name="monarch")
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    try:
        timed(client, f"%monarch up --procs {args.ranks}")
        interrupts = [interrupt_once(km, client) for _ in range(args.repeats)]
        timed(client, "%%monarch\nrank")  # the mesh still answers
        idle = [timed(client, "%monarch stacks") for _ in range(args.repeats)]
        timed(client, HOLD_GIL)
        time.sleep(2.0)  # let the thread take the GIL (a bench, not a test: nothing to wait on)
        gil = [timed(client, "%monarch stacks --rank 0", expect="hold_the_gil") for _ in range(args.repeats)]
        fallback = [timed(client, "import monarch_nb, monarch_nb.stacks as _st\n_real = _st._py_spy\n_st._py_spy = lambda: None\n"
                                  "try:\n    (_s,) = monarch_nb.current_session().stacks('main', [0])\n    print(_s.how, _s.text)\n"
                                  "finally:\n    _st._py_spy = _real", expect="faulthandler") for _ in range(args.repeats)]
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
    med = lambda xs: round(statistics.median(xs), 3)  # noqa: E731
    result = {
        "ranks": args.ranks,
        "interrupt_to_reply_s": {"median": med(interrupts), "max": round(max(interrupts), 3)},
        "stacks_idle_mesh_s": {"median": med(idle), "max": round(max(idle), 3)},
        "stacks_gil_holder_py_spy_s": {"median": med(gil), "max": round(max(gil), 3)},
        "stacks_gil_holder_faulthandler_s": {"median": med(fallback), "max": round(max(fallback), 3)},
        "logs": [logs_read(args.ranks, n) for n in (1_000, 20_000)],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
