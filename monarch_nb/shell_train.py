"""``monarch-nb train ...``: the run ``%monarch train ...`` starts, from a shell, headless, to its last step.

The flags are the magic's own (one parser, :func:`~monarch_nb.notebook.train_magics.add_training_commands`),
so a job typed in a notebook runs unchanged in CI or a terminal; torchtitan 0.3's job form
(``--module M --config F --section.key V``) goes to torchtitan's ConfigManager as in the notebook.
It prints one line per committed step of group 0 and the run's end, and exits 0 when every group
reached the last step, 1 when the run ended otherwise, 2 on bad input (nothing started).
"""

from __future__ import annotations

import shlex
import sys
import threading
from typing import Any, TextIO


def main(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    from IPython.core.error import UsageError

    from .notebook.args import HelpShown, MagicArgumentParser
    from .notebook.train_magics import add_training_commands, config_from_args

    parser = MagicArgumentParser(prog="monarch-nb")
    add_training_commands(parser.add_subparsers(dest="command"))
    try:
        args = parser.parse_line(shlex.join(["train", *argv]))
        config = config_from_args(args)
    except HelpShown as shown:
        print(shown.args[0], file=out)
        if "--module" in argv:  # and torchtitan's own field list for that job
            print(_titan_help(argv), file=out)
        return 0
    except (UsageError, ValueError, TypeError) as exc:
        # a usage error ends with the whole usage text: its first line; a refusal lists every field
        text = (str(exc).splitlines() or [type(exc).__name__])[0] if isinstance(exc, UsageError) else str(exc)
        print(text if text.startswith("monarch-nb train:") else f"monarch-nb train: {text}", file=err)
        return 2
    if not config.steps:
        print("monarch-nb train: a shell run ends at its last step: give --training.steps N (or --steps N)", file=err)
        return 2
    return _run(config, out)


def _titan_help(argv: list[str]) -> str:
    from .ft.settings.titan_job import check

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    job = ["--module", value("--module") or ""] + (["--config", value("--config") or ""] if "--config" in argv else [])
    return check([*job, "--help"])[1]


def _run(config: Any, out: TextIO) -> int:
    from .ft import FTRun
    from .telemetry.events import Event, RunFinished, RunStopped, Step

    run = FTRun(config)
    done = threading.Event()

    def show(e: Event) -> None:
        if isinstance(e, Step) and e.committed and e.replica == 0:
            print(f"step {e.step:>5}  loss {e.loss:.4f}  {e.tokens_per_s:,.0f} tok/s", file=out, flush=True)
        elif isinstance(e, RunFinished):
            print(f"finished at step {e.step}; final checkpoint {e.checkpoint or e.error}", file=out, flush=True)
        elif isinstance(e, RunStopped):
            done.set()

    unsubscribe = run.events.subscribe(show)
    try:
        run.start()
        print(f"run {run.run_id}: {config.replicas} replica groups x {config.group_size} process(es), "
              f"{config.steps} steps; events in {run.run_dir / 'events.jsonl'}", file=out, flush=True)
        done.wait()
    except KeyboardInterrupt:
        print(f"interrupted: stopping run {run.run_id}", file=out, flush=True)
    finally:
        run.stop()
        unsubscribe()
    return 0 if run.events.events(RunFinished) else 1
