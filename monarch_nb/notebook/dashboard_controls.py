"""The dashboard's controls: inject a fault into a replica group, stop the run.

The panel drives a ``RunControls`` (the fault-tolerant run, or a synthetic one in tests) and
nothing else: a click runs the action on a thread of its own, off the kernel's message loop (a
kill or a stop can take seconds), and says in ``control_status`` what it is doing and how it
ended. A reopened or finished run has no controls: the panel is hidden and disabled. The group
choices and whether the buttons work come from the model through the frame loop (``show``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from ..ft.settings.faults import kinds_for
from .dashboard_format import esc

if TYPE_CHECKING:
    import ipywidgets


class RunControls(Protocol):
    """What the controls panel drives: the fault-tolerant run."""

    def inject(self, kind: str, replica: int) -> object: ...

    def stop(self) -> object: ...


class ControlPanel:
    """The fault and group choices, the two buttons and a status line, in one ``box``.

    Args:
        controls: the run the buttons act on; ``None`` for a read-only dashboard (hidden).
    """

    def __init__(self, controls: RunControls | None) -> None:
        import ipywidgets as w

        self.controls = controls
        # the kinds this run's job can deliver (a local run lists no Kubernetes or SLURM kind)
        kinds = kinds_for(getattr(getattr(controls, "config", None), "job", None))
        self.fault_kind = w.Dropdown(options=list(kinds), value="kill", description="fault",
                                     layout=w.Layout(width="180px"))
        self.replica_choice = w.Dropdown(options=[], description="group", layout=w.Layout(width="190px"))
        self.inject_button = w.Button(description="Inject fault", button_style="danger", icon="bolt",
                                      tooltip="inject the chosen fault into the chosen replica group")
        self.stop_button = w.Button(description="Stop run", button_style="warning", icon="stop",
                                    tooltip="stop the training run")
        self.control_status = w.HTML()
        self.inject_button.on_click(self._on_inject_clicked)
        self.stop_button.on_click(self._on_stop_clicked)
        self.box = w.HBox([self.fault_kind, self.replica_choice, self.inject_button,
                           self.stop_button, self.control_status])
        self.box.add_class("mnb-controls")
        if self.controls is None:
            self.box.layout.display = "none"
            for c in (self.fault_kind, self.replica_choice, self.inject_button, self.stop_button):
                c.disabled = True

    @property
    def stateful(self) -> list[ipywidgets.DOMWidget]:
        """The widgets whose state a frame changes (sent again by ``Dashboard.flush``)."""
        return [self.replica_choice, self.inject_button, self.stop_button, self.control_status]

    def show(self, replicas: list[int], live: bool) -> int:
        """The groups to choose from and whether the run takes actions now; comm messages sent."""
        sent = 0
        options = [(f"group {r}", r) for r in replicas]
        if list(self.replica_choice.options) != options:
            keep = self.replica_choice.value
            self.replica_choice.options = options
            if replicas:
                self.replica_choice.value = keep if keep in replicas else replicas[0]
            sent += 1
        if self.controls is not None:
            disabled = not live
            if self.inject_button.disabled != disabled:
                self.inject_button.disabled = disabled
                self.stop_button.disabled = disabled
                sent += 2
        return sent

    def report(self, exc: BaseException) -> None:
        """A dashboard error, in the status line (never raises: it is the last resort)."""
        try:
            self.control_status.value = f"<span style='color:#d32f2f'>dashboard error: {type(exc).__name__}: {exc}</span>"
        except Exception:
            pass

    def _on_inject_clicked(self, _button: ipywidgets.Button | None = None) -> None:
        if self.inject_button.disabled:  # a click from a stale frontend: the run takes no faults now
            return
        kind, replica = self.fault_kind.value, self.replica_choice.value
        if replica is None:
            self.control_status.value = "<span style='color:#d32f2f'>no replica group to inject into</span>"
            return
        self._call_control(f"inject '{kind}' into group {replica}", "inject", kind, replica=replica)

    def _on_stop_clicked(self, _button: ipywidgets.Button | None = None) -> None:
        if self.stop_button.disabled:
            return
        self._call_control("stop the run", "stop")

    def _call_control(self, what: str, method: str, *args: object, **kwargs: object) -> threading.Thread | None:
        """Run a control action off the kernel's message loop (a kill or stop can take seconds)."""
        if self.controls is None:
            self.control_status.value = "<span style='color:#616161'>read-only: no live run attached</span>"
            return None
        self.control_status.value = f"<span class='mnb-control-status' data-state='pending'>{what}&hellip;</span>"

        def call() -> None:
            try:
                getattr(self.controls, method)(*args, **kwargs)
            except Exception as exc:
                self.control_status.value = (f"<span class='mnb-control-status' data-state='error' "
                                             f"style='color:#d32f2f'>could not {what}: "
                                             f"{esc(type(exc).__name__)}: {esc(exc)}</span>")
            else:
                self.control_status.value = (f"<span class='mnb-control-status' data-state='done'>"
                                             f"done: {what}</span>")

        thread = threading.Thread(target=call, name=f"monarch_nb-dashboard-{method}", daemon=True)
        thread.start()
        return thread
