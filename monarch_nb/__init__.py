"""monarch_nb: drive fault-tolerant distributed PyTorch training from a notebook.

The kernel is the single controller: ``Session`` holds Monarch process and actor meshes
by name, calls them with deadlines, and reports worker failures; the fault-tolerant run
(``monarch_nb.ft``) adds torchft replica groups running torchtitan; telemetry is typed
events kept in memory and in ``events.jsonl``. ``%load_ext monarch_nb`` adds ``%monarch``.
"""

from . import _runtime  # noqa: F401  (sets Monarch's environment before it is imported)
from . import views
from .calls import MeshResult
from .errors import CallTimeout, MonarchNbError, RemoteError, SliceError, UnknownMeshError
from .meshes import MeshHandle, ProcInfo
from .session import DeadlineMesh, Session, current_session
from .telemetry import EventStore


def _dashboard(*args, **kwargs):  # noqa: ANN002, ANN003
    # The package root wires the layers: the controller asks for views by name (see views.py).
    from .notebook.dashboard import Dashboard

    return Dashboard(*args, **kwargs)


views.register("dashboard", _dashboard)


def load_ipython_extension(ipython):  # noqa: ANN001
    from .notebook.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # noqa: ANN001
    from .notebook.extension import unload_ipython_extension as unload

    unload(ipython)


def __getattr__(name):  # noqa: ANN001
    # Lazy: the dashboard pulls in ipywidgets and matplotlib, which plain scripts may not need.
    if name == "Dashboard":
        from .notebook.dashboard import Dashboard

        return Dashboard
    if name in ("FTRun", "RunConfig", "RespawnBackoff", "FaultKind", "FaultSchedule"):
        from . import ft

        return getattr(ft, name)
    raise AttributeError(f"module 'monarch_nb' has no attribute {name!r}")


def open_run(path):  # noqa: ANN001
    """Reopen a finished or interrupted run from its directory (or events.jsonl)."""
    from .ft.control.run import open_run as _open_run

    return _open_run(path)


__all__ = [
    "CallTimeout", "Dashboard", "DeadlineMesh", "FTRun", "FaultKind", "FaultSchedule", "RespawnBackoff", "RunConfig", "EventStore", "MeshHandle", "MeshResult", "MonarchNbError",
    "ProcInfo", "RemoteError", "Session", "SliceError", "UnknownMeshError", "current_session",
    "load_ipython_extension", "open_run", "unload_ipython_extension",
]
