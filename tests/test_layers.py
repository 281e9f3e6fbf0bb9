"""The layer map, checked on the source: imports only point down (notebook -> ft -> controller
-> telemetry), no import loops, Monarch/torchft/torchtitan internals only in the seam module,
and one definition of a recovery."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "monarch_nb"

# Layer of each module, top to bottom; a module may import its own layer or lower ones.
SURFACE, NOTEBOOK, FT, CONTROLLER, TELEMETRY = 4, 3, 2, 1, 0


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[1:2] == ["notebook"]:
        return NOTEBOOK
    if parts[1:2] == ["ft"]:
        return FT
    if parts[1:2] == ["telemetry"]:
        return TELEMETRY
    if parts[1:2] in (["cli"], ["execute"], ["shell_train"]) or module == "monarch_nb":
        return SURFACE  # the shell commands, and the package root that wires the layers
    return CONTROLLER


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports_of(module: str, path: Path) -> set[str]:
    """Every monarch_nb module imported anywhere in ``path`` (lazy imports too)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("monarch_nb")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("monarch_nb"):
                known = modules()
                submodules = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
                found |= submodules
                if len(submodules) < len(node.names):  # names defined in the module itself
                    found.add(target)
    return found


def test_imports_only_point_down_the_layer_map():
    upward = []
    for module, path in modules().items():
        for target in imports_of(module, path):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_no_import_loops_between_modules():
    mods = modules()
    graph = {m: {t for t in imports_of(m, p) if t in mods and t != m and not mods[t].name == "__init__.py"}
             for m, p in mods.items() if p.name != "__init__.py"}
    seen, stack, loops = set(), [], []

    def visit(m: str) -> None:
        if m in stack:
            loops.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            visit(t)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not loops, loops


PRIVATE = re.compile(r"monarch\._src|\._(ndslice|mesh_name|host_to_pid|mailbox|receiver|client|quorum|pg|server|"
                     r"name_str|actor_mesh|class|manager|manager_state_dict|local_step)\b|(?<![A-Za-z0-9])_manager=|"
                     r"\.device_type\s*=(?!=)")


def test_dependency_internals_only_in_the_seam_module():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name in ("seam.py", "seam_cluster.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code) and not re.search(r"self\._(client|pg|server|class)\b", code):
                offenders.append(f"{path.relative_to(PKG)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_one_class_recovery():
    found = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if re.search(r"^class Recovery\b", p.read_text(), re.M)]
    assert found == ["ft/record/recovery.py"]


SIDES = ("settings", "control", "worker", "record")


def side_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["monarch_nb", "ft"] and len(parts) > 2 and parts[2] in SIDES else None


def test_every_ft_module_lives_in_the_folder_of_the_side_it_runs_on():
    loose = [m for m in modules() if m.startswith("monarch_nb.ft.") and side_of(m) is None]
    assert not loose, f"ft/ modules outside settings/, control/, worker/, record/: {loose}"


def test_the_kernel_side_and_the_worker_side_never_import_each_other():
    """control/ may import only the actor class it spawns from worker/; worker/ imports no control/
    code; settings/ (plain data) and record/ (folds of events) import neither side."""
    allowed = {("control", "monarch_nb.ft.worker.trainer_actor")}
    crossing = []
    for module, path in modules().items():
        side = side_of(module)
        if side is None:
            continue
        for target in imports_of(module, path):
            other = side_of(target)
            if other is None or other == side or other == "settings":
                continue
            if other == "record" and side == "control":
                continue  # the controller folds its events
            if (side, target) not in allowed:
                crossing.append(f"{module} -> {target}")
    assert not crossing, crossing


def test_the_product_never_imports_the_lab():
    users = [f"{m} -> {t}" for m, p in modules().items() for t in imports_of(m, p) if t.startswith("lab")]
    plain = [str(p) for p in PKG.rglob("*.py") if re.search(r"^\s*(from|import)\s+lab\b", p.read_text(), re.M)]
    assert not users and not plain, users + plain


def test_no_product_file_is_over_600_lines_and_no_class_over_350():
    """A reader can hold a module in their head: the house's limits (issue 37)."""
    files, classes = [], []
    for name, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 600:
            files.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 350:
                classes.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not files and not classes, files + classes
