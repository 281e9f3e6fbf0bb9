"""The seed's clusters (costmodel.SEED_CLUSTERS), extrapolated from the failures measured here.

Reads bench/bench_scale_model.py's JSON, fits costmodel's lines to its measured failures, and
takes them to each seed cluster with costmodel.extrapolate: what was measured here comes from the
fit, everything else is a named assumption. ``--scale`` (bench_scale.py's per-R records, when
there are some) measures the survivors' stall against the number of groups; where it holds two
or more group counts it replaces the fit's stall, and the JSON says so. Writes, per cluster,
every assumption with its value and source, the cost of one failure both ways, and the goodput;
prints the table rows of RESULTS.md (bench/readme_tables.py puts them there).

``--parts`` (bench_cost_parts.py's JSON) replaces the fit's fixed parts with one group's recovery
and restart measured alone, adds the rendezvous of R groups to a restart and the per-step quorum
to peer recovery (costmodel.OVERLAP says what overlaps on a cluster), and checks the composition
against bench_scale_model.py's restarts of R groups on this box.

Usage: python bench/seed_clusters.py --from bench/results/scale_model.json
           [--scale bench/results/scale.json] [--parts bench/results/cost_parts.json]
           --out bench/results/seed_clusters.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from readme_tables import seed_table  # noqa: E402
from lab.costmodel import SEED_CLUSTERS, Parts, compose, extrapolate, fit, scale_medians  # noqa: E402


def composition_check(failures: list[dict[str, Any]], parts_json: dict[str, Any], cores: int) -> list[dict[str, Any]]:
    """The composition tried where it can be checked: one group's restart of R groups on this box
    (R restarts sharing ``cores``), composed from the parts of the same model measured alone,
    against the restarts bench_scale_model.py measured at that R."""
    rows = []
    for model in parts_json.get("alone", {}):
        parts = Parts.from_json(parts_json, model)
        by_r: dict[int, list[float]] = {}
        for f in failures:
            if f["mode"] == "restart" and f["model"] == model and f.get("restart_s") is not None:
                by_r.setdefault(int(f["replicas"]), []).append(f["restart_s"])
        for groups, measured in sorted(by_r.items()):
            here = compose(parts, groups, cores)
            rows.append({"model": model, "groups": groups, "composed_s": here["restart_wall_s"],
                         "measured_s": statistics.median(measured), "cluster_s": compose(parts, groups)["restart_wall_s"]})
    return rows


def seed_clusters(failures: list[dict[str, Any]], scale: list[dict[str, Any]] | None = None,
                  source: str = "", scale_source: str = "", parts_json: dict[str, Any] | None = None,
                  parts_source: str = "", parts_model: str | None = None, cores: int = 2) -> dict[str, Any]:
    """The whole JSON: the fit of ``failures``, and every seed cluster extrapolated from it (with
    the parts measured one at a time, when given)."""
    model = fit(failures)
    parts = Parts.from_json(parts_json, parts_model) if parts_json else None
    out: dict[str, Any] = {"from": source, "fit": model.to_dict(),
                           "clusters": [extrapolate(model, c, scale, parts) for c in SEED_CLUSTERS]}
    if scale is not None:
        out["scale"] = {"from": scale_source, "medians_by_groups": {
            str(r): m for r, m in scale_medians(scale).items()}}
    if parts is not None:
        groups = sorted({int(r["groups"]) for r in parts_json["parts"]} | {c.groups for c in SEED_CLUSTERS})
        out["parts"] = {"from": parts_source, "model": parts.model, "state_bytes": parts_json.get("state_bytes"),
                        "alone": {"peer": {"wall_s": parts.peer_alone[0], "cpu_s": parts.peer_alone[1]},
                                  "restart": {"wall_s": parts.restart_alone[0], "cpu_s": parts.restart_alone[1]}},
                        "medians": {p: {str(g): {"wall_s": w, "cpu_s": c} for g, (w, c) in rows.items()}
                                    for p, rows in parts.by_part.items()},
                        "composed_cluster": [compose(parts, g) for g in groups],
                        "composed_here": [compose(parts, g, cores) for g in groups],
                        "check": composition_check(failures, parts_json, cores)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", default="bench/results/scale_model.json")
    p.add_argument("--scale", help="bench_scale.py's JSON ({'records': [...]}), optional")
    p.add_argument("--parts", help="bench_cost_parts.py's JSON, optional: fixed parts measured alone, "
                   "rendezvous and quorum against R")
    p.add_argument("--parts-model", help="which of --parts' alone models the clusters use (default: its first)")
    p.add_argument("--cores", type=int, default=2, help="cores of the box the parts were measured on")
    p.add_argument("--out", default="bench/results/seed_clusters.json")
    a = p.parse_args(argv)
    failures = json.loads(Path(a.source).read_text())["failures"]
    scale = json.loads(Path(a.scale).read_text())["records"] if a.scale else None
    parts = json.loads(Path(a.parts).read_text()) if a.parts else None
    result = seed_clusters(failures, scale, source=a.source, scale_source=a.scale or "", parts_json=parts,
                           parts_source=a.parts or "", parts_model=a.parts_model, cores=a.cores)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(seed_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
