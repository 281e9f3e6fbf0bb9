"""Views the controller can ask for without depending on the notebook layer.

``FTRun.dashboard()`` and ``RunHistory.dashboard()`` need a widget, which lives in
``monarch_nb.notebook`` - above them in the layer map. Instead of importing upward, they ask
this registry for a view by name; the package root (``monarch_nb/__init__.py``, the one
place that knows every layer) registers the notebook's factories. A script that never
imports ipywidgets never pays for them: factories import lazily.
"""

from __future__ import annotations

from typing import Any, Callable

_factories: dict[str, Callable[..., Any]] = {}


def register(name: str, factory: Callable[..., Any]) -> None:
    _factories[name] = factory


def build(name: str, *args: Any, **kwargs: Any) -> Any:
    try:
        factory = _factories[name]
    except KeyError:
        raise RuntimeError(f"no {name!r} view is registered; import monarch_nb (it registers the notebook views)") from None
    return factory(*args, **kwargs)
