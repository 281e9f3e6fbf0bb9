"""The seed's experiment at 4 groups: waves of 2 faults, live groups swinging 4 <-> 2, no restart.

``bench/bench_swing.py`` with smaller defaults (4 groups of the debugmodel flavour, a wave of
up to two ``comms`` faults every 25 s, never fewer than 2 groups training, waves until step
240); the measurement is ``lab.swing`` (see there and bench_swing.py for what the
JSON holds). The 16-group run is bench_swing.py itself.

Usage: python bench/bench_waves.py [--steps 240] [--every 25] [--at-once 2] [--out results.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_swing import main, parser  # noqa: E402

if __name__ == "__main__":
    p = parser(__doc__, groups=4, every=25.0, at_once=2, steps=240, model="debugmodel")
    p.set_defaults(name="bench-waves")
    sys.exit(main(p=p))
