#!/usr/bin/env python3
"""Write the tables of torchtitan 0.3 job fields into README.md and docs/torchtitan_jobs.md, from the code.

Every leaf of the shipped debug configs (llama3, qwen3, torchft.llama3), read by
``monarch_nb.ft.settings.titan_job`` with torchtitan's own ConfigManager: the docs' table lists
each leaf with its default and what monarch_nb makes of it; the README's sums each section up
(what it sets, how many leaves are fixed at what monarch_nb does). Run it after changing a rule;
``tests/test_titan_job.py`` fails while either table is stale.

    .venv/bin/python scripts/titan_fields.py          # rewrite both tables
    .venv/bin/python scripts/titan_fields.py --check  # exit 1 if either is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"llama3": "llama3_debugmodel", "qwen3": "qwen3_debugmodel", "torchft.llama3": "llama3_torchft_debugmodel"}
START, END = "<!-- titan-fields:start (scripts/titan_fields.py) -->", "<!-- titan-fields:end -->"


def verdicts() -> dict[str, tuple[object, bool, str]]:
    """path -> (default, honoured, what it becomes), over the shipped configs (torchft's wins on a tie:
    it has every section the others have, and fault_tolerance)."""
    sys.path.insert(0, str(ROOT))
    from monarch_nb.ft.settings import titan_job

    import os

    out: dict[str, tuple[object, bool, str]] = {}
    runs = os.environ.pop("MONARCH_NB_RUNS", None)  # the tables describe a machine without it set
    try:
        for module, function in SHIPPED.items():
            for leaf in titan_job.read(titan_job.load(["--module", module, "--config", function]))[1]:
                out[leaf.path] = (leaf.value, leaf.honoured, leaf.becomes)
    finally:
        if runs is not None:
            os.environ["MONARCH_NB_RUNS"] = runs
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def doc_table(rows: dict[str, tuple[object, bool, str]]) -> str:
    lines = ["| field | shipped value | monarch_nb |", "|---|---|---|"]
    for path in sorted(rows):
        value, honoured, becomes = rows[path]
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        lines.append(f"| `{path}` | `{_cell(shown)}` | {'' if honoured else '**refused**: '}{_cell(becomes)} |")
    return "\n".join(lines)


def readme_table(rows: dict[str, tuple[object, bool, str]]) -> str:
    sections: dict[str, list[tuple[str, bool, str]]] = {}
    for path, (_, honoured, becomes) in rows.items():
        sections.setdefault(path.split(".")[0], []).append((path, honoured, becomes))
    lines = ["| section | at the shipped values, sets (RunConfig / titan.X) |", "|---|---|"]
    others = []
    for name in sorted(sections):
        sets = sorted({m.group(1) for _, _, b in sections[name] for m in [re.match(r"([a-z_.]+) = ", b)] if m})
        if sets:
            lines.append(f"| `{name}` | {', '.join(f'`{s}`' for s in sets)} |")
        else:
            others.append(name)
    lines.append(f"| {', '.join(f'`{n}`' for n in others)} | as monarch_nb does it, or unused while off |")
    return "\n".join(lines)


def _replace(text: str, table: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str]) -> int:
    rows = verdicts()
    targets = {ROOT / "README.md": readme_table(rows), ROOT / "docs" / "torchtitan_jobs.md": doc_table(rows)}
    stale = []
    for path, table in targets.items():
        text = path.read_text()
        new = _replace(text, table)
        if new != text:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print(f"stale: {', '.join(stale)} (run scripts/titan_fields.py)", file=sys.stderr)
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {', '.join(p.name for p in targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
