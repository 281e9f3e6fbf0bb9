"""Telemetry: typed events, and the store that keeps them in memory and on disk."""

from .events import *  # noqa: F401,F403
from .decode import event_from_dict, event_kinds
from .events import Event
from .store import EventStore

__all__ = ["Event", "EventStore", "event_from_dict", "event_kinds"]
