"""Checks of RunConfig fields that need more than a range: the straggler rule, a heal interface,
and fields RunConfig does not have (torchtitan's names for ours are named in the refusal)."""

from __future__ import annotations

import re
from typing import Any

STRAGGLER_POLICIES = ("observe", "drain", "drop")


# torchtitan's names for fields of ours (its [fault_tolerance] keys): named in the refusal
TITAN_NAMES = {"sync_steps": "sync_every", "semi_sync_method": "sync", "num_fragments": "fragments"}


def refuse_unknown_fields(given: Any, known: set[str]) -> None:
    """A field RunConfig does not have is refused, naming ours when it is torchtitan's name."""
    unknown = sorted(set(given) - known)
    if unknown:
        ours = TITAN_NAMES.get(unknown[0])
        hint = f" (torchtitan's name; here it is {ours})" if ours else ""
        raise ValueError(f"{unknown[0]}: unknown config field{hint}; allowed fields: {', '.join(sorted(known))}")


def check_stragglers(c: Any) -> None:
    """The straggler rule's settings (``ft/control/stragglers.py``)."""
    if c.straggler not in STRAGGLER_POLICIES:
        raise ValueError(f"straggler: unknown value {c.straggler!r}; allowed values: {', '.join(STRAGGLER_POLICIES)}")
    f, w = c.straggler_factor, c.straggler_window
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1.0 < f <= 10.0:
        raise ValueError(f"straggler_factor: {f!r}; allowed: above 1 (no slowness) to 10 (1.3: as Falcon and "
                         "ByteRobust)")
    if isinstance(w, bool) or not isinstance(w, int) or not 3 <= w <= 10_000:
        raise ValueError(f"straggler_window: {w!r}; allowed: 3 to 10000 committed steps")


def check_heal_interface(c: Any) -> None:
    """A named interface for striped/http heals (a 'pg' heal has none of its own)."""
    if c.heal_interface is None:
        return
    if not isinstance(c.heal_interface, str) or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", c.heal_interface):
        raise ValueError(f"heal_interface: {c.heal_interface!r} is not a network interface name "
                         "(e.g. 'eth1', 'ib0'); None uses the collectives' address")
    if c.heal_transport == "pg":
        raise ValueError("heal_interface: a 'pg' heal goes over the collectives' process group; "
                         "use heal_transport='striped' (or 'http') to choose the interface")
