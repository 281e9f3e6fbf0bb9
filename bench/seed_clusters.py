"""The seed's clusters (costmodel.SEED_CLUSTERS), extrapolated from the failures measured here.

Reads bench/bench_scale_model.py's JSON, fits costmodel's lines to its measured failures, and
takes them to each seed cluster with costmodel.extrapolate: what was measured here comes from the
fit, everything else is a named assumption. ``--scale`` (bench_scale.py's per-R records, when
there are some) measures the survivors' stall against the number of groups; where it holds two
or more group counts it replaces the fit's stall, and the JSON says so. Writes, per cluster,
every assumption with its value and source, the cost of one failure both ways, and the goodput;
prints the README's table rows (bench/readme_tables.py puts them in README.md).

Usage: python bench/seed_clusters.py --from bench/results/scale_model.json
           [--scale bench/results/scale.json] --out bench/results/seed_clusters.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from readme_tables import seed_table  # noqa: E402
from monarch_nb.ft.costmodel import SEED_CLUSTERS, extrapolate, fit, scale_medians  # noqa: E402


def seed_clusters(failures: list[dict[str, Any]], scale: list[dict[str, Any]] | None = None,
                  source: str = "", scale_source: str = "") -> dict[str, Any]:
    """The whole JSON: the fit of ``failures``, and every seed cluster extrapolated from it."""
    model = fit(failures)
    out: dict[str, Any] = {"from": source, "fit": model.to_dict(),
                           "clusters": [extrapolate(model, c, scale) for c in SEED_CLUSTERS]}
    if scale is not None:
        out["scale"] = {"from": scale_source, "medians_by_groups": {
            str(r): m for r, m in scale_medians(scale).items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", default="bench/results/scale_model.json")
    p.add_argument("--scale", help="bench_scale.py's JSON ({'records': [...]}), optional")
    p.add_argument("--out", default="bench/results/seed_clusters.json")
    a = p.parse_args(argv)
    failures = json.loads(Path(a.source).read_text())["failures"]
    scale = json.loads(Path(a.scale).read_text())["records"] if a.scale else None
    result = seed_clusters(failures, scale, source=a.source, scale_source=a.scale or "")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(seed_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
