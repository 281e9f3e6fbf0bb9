"""What the live dashboard keeps, and how fast it fills at a training run's pace.

Two measurements, in seconds of CPU, no run needed:
- the dashboard model fed ``--steps`` committed steps of ``--groups`` groups (as a 5-step/s run
  reports them): Python memory it holds (tracemalloc) every 1,000 steps, for each ``--points``
  window (the curves' points kept before thinning; the shipped value and any to compare);
- the live loss frame drawn ``--frames`` times as a run moves on: how many distinct strings
  matplotlib laid out (it keeps the size of each, 4,096 per renderer), for the live frame and for
  the static image, which carries a heading that changes every frame.

    python bench/dashboard_memory.py --points 2000,600 --out bench/results/dashboard_memory.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tracemalloc
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monarch_nb.notebook import dashboard_curves as dc  # noqa: E402
from monarch_nb.notebook import dashboard_model as dm  # noqa: E402
from monarch_nb.telemetry.events import Step  # noqa: E402

T0 = 1_700_000_000.0


def model_fill(points: int, groups: int, steps: int, step_hz: float) -> list[list[float]]:
    """[[step, minutes at step_hz, MB the model holds], ...] every 1,000 steps."""
    with mock.patch.object(dm, "POINTS_KEPT", points), mock.patch.object(dm, "LOSS_KEPT", points):
        model = dm.DashboardModel()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        out = []
        for s in range(1, steps + 1):
            for r in range(groups):
                model.apply(Step(replica=r, step=s, loss=3.0 - s * 1e-4 + 0.01 * r, tokens_per_s=2048.0,
                                 committed=True, t=T0 + s / step_hz))
            if s % 1000 == 0:
                out.append([s, round(s / step_hz / 60, 1), round((tracemalloc.get_traced_memory()[0] - base) / 2**20, 2)])
        tracemalloc.stop()
    return out


def fit_window_slope(rows: list[list[float]], first_min: float = 5, last_min: float = 20) -> float:
    """MB/h the model grew over the soak's fit window (a least-squares line, as soak.py fits RSS)."""
    pts = [(m, mb) for _, m, mb in rows if first_min <= m <= last_min]
    return round(statistics.linear_regression([m for m, _ in pts], [mb for _, mb in pts]).slope * 60, 2)


def strings_laid_out(frames: int, legend: bool) -> set[str]:
    """The distinct strings matplotlib measured while ``frames`` frames of a moving run were drawn
    (a window of 100 steps moving on: the axes keep their ticks)."""
    import matplotlib.text as mtext

    from monarch_nb.notebook.render_plot import LossPlot

    seen: set[str] = set()
    measure = mtext._get_text_metrics_with_cache

    def watched(renderer, text, fontprop, ismath, dpi):
        seen.add(text)
        return measure(renderer, text, fontprop, ismath, dpi)

    with mock.patch.object(mtext, "_get_text_metrics_with_cache", watched):
        plot = LossPlot()
        for n in range(frames):
            steps = range(n, n + 100)
            data = dc.PlotData({r: [(float(s), 3.0 - 0.001 * s + 0.1 * r) for s in steps] for r in range(3)}, {},
                               [(s, 3.0 - 0.001 * s) for s in steps], [], point_count=300 + 3 * n, global_step=n + 99)
            plot.render(data, legend=legend)
    return seen


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--points", default=f"{dm.POINTS_KEPT}", help="comma-separated curve windows to compare")
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--steps", type=int, default=12000)
    p.add_argument("--step-hz", type=float, default=5.0, help="steps a second per group (the soak's pace)")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--out")
    a = p.parse_args()
    fills, slopes = {}, {}
    for points in (int(x) for x in a.points.split(",")):
        fills[str(points)] = rows = model_fill(points, a.groups, a.steps, a.step_hz)
        slope = fit_window_slope(rows)
        slopes[str(points)] = slope
        print(f"points kept {points}: the model holds {rows[-1][2]:.2f} MB after {rows[-1][1]:g} min at {a.step_hz:g} "
              f"steps/s, up to {max(mb for *_, mb in rows):.2f}; it grows {slope:.1f} MB/h over minutes 5-20 "
              "(the soak's fit window)", flush=True)
    texts = {"live": len(strings_laid_out(a.frames, legend=False)), "static": len(strings_laid_out(a.frames, legend=True))}
    print(f"strings laid out in {a.frames} frames: live {texts['live']}, static image {texts['static']}")
    report = {"command": "python bench/dashboard_memory.py " + " ".join(sys.argv[1:]), "shipped_points_kept": dm.POINTS_KEPT,
              "groups": a.groups, "step_hz": a.step_hz, "model_mb_by_points_kept": fills,
              "model_mb_per_hour_minutes_5_to_20": slopes,
              "frames": a.frames, "strings_laid_out": texts}
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
