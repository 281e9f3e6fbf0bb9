"""How the dashboard writes values as text: escaped HTML, seconds, clock times, byte sizes.

The model's event-log lines and every rendered panel share these, so a quantity reads the same
wherever it appears (a heal's size in the events list and in the recoveries table). Plain
functions of plain values: no model, no widgets.
"""

from __future__ import annotations

import html
import time

__all__ = ["esc", "secs", "clock", "wall", "fmt_bytes"]


def esc(s: object) -> str:
    """``s`` as text safe inside HTML, attribute values included."""
    return html.escape(str(s), quote=True)


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def clock(t: float | None, t0: float | None) -> str:
    """A time as seconds since ``t0`` (the run's start), or the wall-clock time without one."""
    if t is None:
        return "-"
    if t0 is not None:
        return f"+{t - t0:.1f} s"
    return time.strftime("%H:%M:%S", time.localtime(t))


def wall(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
