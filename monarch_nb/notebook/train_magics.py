"""Argument parsers and handlers for the training subcommands of ``%monarch``.

``train`` starts an ``FTRun`` on the notebook's session, ``inject``/``schedule`` call the
run's fault API, ``stop`` stops it, ``dashboard`` shows it. The handlers only translate
arguments; every one is a single call on ``monarch_nb.ft.FTRun``.
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from ..ft.faults import CLUSTER_KINDS, FaultKind
from .args import non_negative_int, positive_float, positive_int

FAULT_KINDS = tuple(k.value for k in FaultKind)


def add_training_commands(sub: Any) -> None:
    train = sub.add_parser("train", help="start a fault-tolerant run (FTRun(RunConfig(...)).start())")
    train.add_argument("--replicas", type=positive_int, default=3, help="replica groups R (default 3)")
    train.add_argument("--group-size", type=positive_int, default=1, help="processes per group G (FSDP when > 1)")
    train.add_argument("--spares", type=non_negative_int, default=None,
                       help="warm standby groups that replace failed ones at once (default 0)")
    train.add_argument("--steps", type=positive_int, default=None, help="stop after N steps (default: until stopped)")
    train.add_argument("--seq-len", type=positive_int, default=None)
    train.add_argument("--batch-size", type=positive_int, default=None)
    train.add_argument("--lr", type=positive_float, default=None)
    train.add_argument("--model", default=None, help="torchtitan Llama 3 flavor (default debugmodel)")
    train.add_argument("--job", default=None, choices=["local", "process", "slurm"],
                       help="local procs, each group on its own ProcessJob host, or on its own SLURM allocation")
    train.add_argument("--slurm", action="store_true", help="same as --job slurm")
    train.add_argument("--partition", default=None, help="with --slurm: SLURM partition")
    train.add_argument("--time", default=None, dest="time_limit", metavar="HH:MM:SS",
                       help="with --slurm: time limit of each group's allocation")
    train.add_argument("--platform", default=None, choices=["auto", "cpu", "cuda", "rocm"])
    train.add_argument("--max-restarts", type=int, default=None)
    train.add_argument("--name", default=None, help="run name (default: a timestamp)")
    train.add_argument("--no-wait", action="store_true", help="return before the first step is committed")

    inject = sub.add_parser("inject", help="inject a fault into one replica group (run.inject)")
    inject.add_argument("kind", choices=FAULT_KINDS)
    inject.add_argument("--replica", type=int, required=True)
    inject.add_argument("--rank", type=int, default=0)
    when = inject.add_mutually_exclusive_group()
    when.add_argument("--at-step", type=int, default=None)
    when.add_argument("--after", type=positive_float, default=None, metavar="SECONDS")
    inject.add_argument("--hang-seconds", type=positive_float, default=30.0, help="for 'hang': how long the GIL is held")

    schedule = sub.add_parser("schedule", help="inject random faults periodically (run.schedule)")
    schedule.add_argument("--every", type=positive_float, required=True, metavar="SECONDS")
    schedule.add_argument("--kinds", default="kill", help="comma-separated fault kinds (default: kill)")
    schedule.add_argument("--max", type=positive_int, default=None, dest="max_faults")
    schedule.add_argument("--seed", type=int, default=None)
    schedule.add_argument("--at-once", type=positive_int, default=1, help="groups hit together in each wave")

    scale = sub.add_parser("scale", help="resize the running job to N replica groups (run.scale)")
    scale.add_argument("replicas", type=positive_int)

    sub.add_parser("stop", help="stop the fault-tolerant run (run.stop)")
    sub.add_parser("dashboard", help="live dashboard of the run (run.dashboard())")


class TrainingCommands:
    """Holds the notebook's current run between magics."""

    def __init__(self) -> None:
        self.run: Any = None

    def current(self) -> Any:
        if self.run is None or self.run.stopped:
            raise UsageError("no fault-tolerant run is active; start one with `%monarch train`")
        return self.run

    def train(self, args: argparse.Namespace, session: Any, shell: Any) -> Any:
        from ..ft import FTRun, RestartPolicy, RunConfig

        if self.run is not None and not self.run.stopped:
            raise UsageError(f"run {self.run.run_id} is still active; `%monarch stop` it first")
        if args.slurm and args.job not in (None, "slurm"):
            raise UsageError(f"--slurm and --job {args.job} disagree; give one")
        fields = {"replicas": args.replicas, "group_size": args.group_size, "steps": args.steps,
                  "seq_len": args.seq_len, "batch_size": args.batch_size, "lr": args.lr, "model": args.model,
                  "job": "slurm" if args.slurm else args.job, "platform": args.platform, "run_name": args.name,
                  "partition": args.partition, "time_limit": args.time_limit, "spares": args.spares}
        overrides = {k: v for k, v in fields.items() if v is not None}
        if args.max_restarts is not None:
            overrides["restart"] = RestartPolicy(max_restarts=args.max_restarts)
        try:
            config = RunConfig(**overrides).validate()
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        run = FTRun(config, session=session)
        self.run = run
        run.start()
        if not args.no_wait:
            run.wait_for_step(1, timeout=config.init_timeout_s)
        if shell is not None:
            shell.user_ns["run"] = run
        print(f"run {run.run_id}: {config.replicas} replica groups x {config.group_size} "
              f"process(es); events in {run.run_dir / 'events.jsonl'}; the run is `run` in this notebook")
        return run

    def inject(self, args: argparse.Namespace) -> None:
        run = self.current()
        try:
            run.inject(args.kind, replica=args.replica, rank=args.rank, at_step=args.at_step,
                       after_s=args.after, hang_s=args.hang_seconds)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        when = f" at step {args.at_step}" if args.at_step is not None else (
            f" after {args.after:g} s" if args.after else "")
        if FaultKind.parse(args.kind) in CLUSTER_KINDS:
            print(f"{args.kind}: sent to the scheduler for replica {args.replica}'s allocation{when}")
        else:
            print(f"armed {args.kind} in replica {args.replica} rank {args.rank}{when}")

    def schedule(self, args: argparse.Namespace) -> None:
        run = self.current()
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad or not kinds:
            raise UsageError(f"--kinds: unknown fault kind(s) {bad}; allowed: {', '.join(FAULT_KINDS)}")
        run.schedule(args.every, kinds=kinds, seed=args.seed, max_faults=args.max_faults, at_once=args.at_once)
        wave = f" into {args.at_once} groups at once" if args.at_once > 1 else ""
        print(f"injecting {'/'.join(kinds)} every {args.every:g} s{wave}")

    def scale(self, args: argparse.Namespace) -> None:
        run = self.current()
        try:
            event = run.scale(args.replicas)
        except (ValueError, RuntimeError) as exc:
            raise UsageError(str(exc)) from None
        parts = ([f"added groups {event.added}"] if event.added else []) + (
            [f"retired groups {event.retired}"] if event.retired else [])
        print(f"run {run.run_id}: {event.replicas} replica groups ({', '.join(parts) or 'no change'})")

    def stop(self) -> None:
        run = self.current()
        run.stop()
        print(f"run {run.run_id} stopped; reopen it with monarch_nb.open_run({str(run.run_dir)!r})")

    def dashboard(self) -> Any:
        return self.current().dashboard()
