"""How every state looks, in one table: the health view, the dashboard and the badges share it.

Each state has a background colour, a text colour, a glyph and a word, so colour is never
the only cue (colour-blind readers, screen readers, a printed notebook). States come from two
vocabularies defined below the notebook layer: a process's or mesh's health
(``monarch_nb.meshes``) and a replica group's state (``monarch_nb.ft.control.groups``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateStyle:
    background: str
    foreground: str
    glyph: str
    label: str


_RED, _GREEN, _AMBER, _BLUE, _GREY = "#d32f2f", "#2e7d32", "#f9a825", "#1565c0", "#616161"

STATE_STYLES: dict[str, StateStyle] = {
    # replica groups (monarch_nb.ft.control.groups.GROUP_STATES)
    "starting": StateStyle("#b0bec5", "#102027", "\u25cc", "starting"),
    "training": StateStyle(_GREEN, "#ffffff", "\u2713", "training"),
    "failed": StateStyle(_RED, "#ffffff", "\u2717", "FAILED"),
    "repairing": StateStyle("#ff8f00", "#1a1a1a", "\u2699", "repairing in place"),
    "respawning": StateStyle(_AMBER, "#1a1a1a", "\u21bb", "respawning"),
    "healing": StateStyle(_BLUE, "#ffffff", "\u21c4", "healing"),
    # U+25F7: in DejaVu, which Debian's Chromium draws with (U+29D7 came out as an empty box)
    "waiting": StateStyle("#6a1b9a", "#ffffff", "\u25f7", "waiting for a state holder"),
    "stopped": StateStyle(_GREY, "#ffffff", "\u25a0", "stopped"),
    "gave_up": StateStyle("#7f0000", "#ffffff", "\u2620", "GAVE UP"),
    "finished": StateStyle("#455a64", "#ffffff", "\u2691", "finished"),
    "retiring": StateStyle("#90a4ae", "#102027", "\u2198", "retiring"),
    "retired": StateStyle("#37474f", "#ffffff", "\u21e5", "retired"),
    # warm spare groups (monarch_nb.ft.control.spares)
    "building": StateStyle("#b2dfdb", "#102027", "\u2692", "building"),
    "ready": StateStyle("#00897b", "#ffffff", "\u25c7", "spare ready"),
    # processes and meshes (monarch_nb.meshes), call outcomes
    "alive": StateStyle(_GREEN, "#ffffff", "\u2713", "alive"),
    "healthy": StateStyle(_GREEN, "#ffffff", "\u2713", "healthy"),
    "degraded": StateStyle(_AMBER, "#1a1a1a", "!", "degraded"),
    "ok": StateStyle(_GREEN, "#ffffff", "\u2713", "ok"),
    "error": StateStyle(_RED, "#ffffff", "\u2717", "error"),
    "missing": StateStyle(_AMBER, "#1a1a1a", "?", "missing"),
    "unknown": StateStyle("#e0e0e0", "#1a1a1a", "?", "unknown"),
}


def style_of(state: str) -> StateStyle:
    return STATE_STYLES.get(state, STATE_STYLES["unknown"])
