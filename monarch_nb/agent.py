"""The controller's own actor on every process of a mesh.

It answers "who are you" (pid, host) for the health view, and runs notebook code for
``%%monarch`` the way ipyparallel's ``%%px`` does: one persistent namespace per process,
stdout/stderr captured, and the value of a trailing expression returned as its repr.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import socket
import traceback
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import Actor, current_rank, endpoint


@dataclass(frozen=True)
class ProcIdentity:
    rank: int
    pid: int
    host: str
    job_id: str | None = None  # SLURM_JOB_ID when SLURM started the process
    node: str | None = None  # SLURMD_NODENAME: the scheduler's name for this node


@dataclass(frozen=True)
class CellOutput:
    """What one process produced for a ``%%monarch`` cell."""

    rank: int
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    error: str | None = None
    traceback: str | None = None


@dataclass
class _Namespace:
    values: dict[str, Any] = field(default_factory=lambda: {"__name__": "__monarch_cell__"})


def _compile_cell(code: str) -> tuple[Any, Any]:
    """Split a cell into statements and an optional trailing expression, like IPython does."""
    tree = ast.parse(code, filename="<monarch cell>", mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, "<monarch cell>", "exec")
    tail = compile(last, "<monarch cell>", "eval") if last is not None else None
    return body, tail


class ProcAgent(Actor):
    def __init__(self) -> None:
        self._ns = _Namespace()
        self._mesh_rank: int | None = None

    @endpoint
    def identity(self) -> ProcIdentity:
        # The controller asks this once over the whole mesh, so this rank is the global one;
        # later calls may arrive through a slice, where current_rank() is slice-local.
        if self._mesh_rank is None:
            self._mesh_rank = current_rank().rank
        return ProcIdentity(rank=self._mesh_rank, pid=os.getpid(), host=socket.gethostname(),
                            job_id=os.environ.get("SLURM_JOB_ID"), node=os.environ.get("SLURMD_NODENAME"))

    @endpoint
    def run_cell(self, code: str, push: dict[str, Any] | None = None) -> CellOutput:
        rank = self._mesh_rank if self._mesh_rank is not None else current_rank().rank
        ns = self._ns.values
        ns["rank"] = rank
        if push:
            ns.update(push)
        out, err = io.StringIO(), io.StringIO()
        result = error = tb = None
        try:
            body, tail = _compile_cell(code)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(body, ns)
                if tail is not None:
                    value = eval(tail, ns)
                    if value is not None:
                        result = repr(value)
        except BaseException as exc:  # report SystemExit too, but keep the process alive
            error = f"{type(exc).__name__}: {exc}"
            tb = "".join(traceback.format_exception(exc)[1:])
        return CellOutput(rank=rank, stdout=out.getvalue(), stderr=err.getvalue(),
                          result=result, error=error, traceback=tb)
