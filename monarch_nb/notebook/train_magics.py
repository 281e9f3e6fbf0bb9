"""Argument parsers and handlers for the training subcommands of ``%monarch``.

``train`` starts an ``FTRun`` on the notebook's session (from flags, or a torchtitan-style
TOML job file with ``--config``), ``inject``/``schedule`` call the run's fault API, ``wait``
blocks until a group rejoins or a step is committed, ``check`` proves the replicas
bit-identical, ``stop`` stops the run, ``dashboard`` shows it. The handlers only translate
arguments and results; every one is a single call on ``monarch_nb.ft.FTRun`` or
``monarch_nb.ft.control.waiting``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ..errors import Interrupted
from ..ft.settings.config import LOWEST_RUNGS, MODELS, ON_FAILURE, QUORUMS
from ..ft.settings.faults import CLUSTER_KINDS, FaultKind
from .args import non_negative_int, positive_float, positive_int, positive_number
from .progress import Line, Progress

if TYPE_CHECKING:
    from ..ft import FTRun
    from ..session import Session

FAULT_KINDS = tuple(k.value for k in FaultKind)
WAIT_USAGE = ("usage: %monarch wait rejoin [--replica R] [--timeout S]\n"
              "       %monarch wait step N [--replica R] [--timeout S]\n"
              "       %monarch wait spare [--timeout S]")
REJOIN_TIMEOUT_S = 300.0  # a recovery here takes ~5-20 s; on SLURM a new allocation can pend for minutes
STEP_TIMEOUT_S = 300.0
CHECK_TIMEOUT_S = 60.0


def add_training_commands(sub: Any) -> None:
    train = sub.add_parser(
        "train", help="start a fault-tolerant run (FTRun(RunConfig(...)).start())",
        epilog="torchtitan 0.3's job form: --module M --config FUNCTION [--section.key VALUE ...] (e.g. --module "
               "llama3 --config llama3_debugmodel --training.steps 40), parsed by torchtitan's ConfigManager; "
               "`monarch-nb check-job --module M --config F --help` lists its fields. Without --module, --config "
               "is a legacy TOML job file (torchtitan up to 0.2).")
    train.add_argument("--module", default=None, metavar="M",
                       help="torchtitan 0.3 config registry: a shorthand (llama3, qwen3, torchft.llama3) or your "
                            "own module; --config then names its function")
    train.add_argument("--config", default=None, metavar="FUNCTION|FILE.toml",
                       help="with --module: the registry function; else a legacy TOML job file (RunConfig.from_toml); "
                            "the other flags override it")
    train.add_argument("--replicas", type=positive_int, default=None, help="replica groups R (default 3)")
    train.add_argument("--group-size", type=positive_int, default=None,
                       help="processes per group G (FSDP when > 1; default 1)")
    train.add_argument("--spares", type=non_negative_int, default=None,
                       help="warm standby groups that replace failed ones at once (default 0)")
    train.add_argument("--steps", type=positive_int, default=None, help="stop after N steps (default: until stopped)")
    train.add_argument("--seq-len", type=positive_int, default=None)
    train.add_argument("--batch-size", type=positive_int, default=None)
    train.add_argument("--lr", type=positive_number, default=None, help="peak learning rate (default 8e-4)")
    train.add_argument("--model", default=None, metavar="FLAVOUR",
                       help=f"Llama 3 flavour: {', '.join(MODELS)} (default debugmodel, 6.2M parameters; tiny, "
                            "~0.4M, for many groups on a small machine)")
    train.add_argument("--job", default=None, choices=["local", "process", "slurm", "kubernetes"],
                       help="local procs, each group on its own ProcessJob host, on its own SLURM allocation, or "
                            "on its own Kubernetes pod set (the one-machine cluster of ./run.sh k8s up)")
    train.add_argument("--slurm", action="store_true", help="same as --job slurm")
    train.add_argument("--k8s", action="store_true", help="same as --job kubernetes")
    train.add_argument("--partition", default=None, help="with --slurm: SLURM partition")
    train.add_argument("--time", default=None, dest="time_limit", metavar="HH:MM:SS",
                       help="with --slurm: time limit of each group's allocation")
    train.add_argument("--controller-on", default=None, choices=["local", "cluster"],
                       help="with --name and --slurm / --k8s: 'cluster' runs the run's controller there too")
    train.add_argument("--platform", default=None, choices=["auto", "cpu", "cuda", "rocm"])
    train.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                       help="collective backend (default: nccl on GPUs, gloo on CPU)")
    train.add_argument("--max-respawns", type=int, default=None)
    train.add_argument("--name", default=None, help="run name (default: a timestamp); a named run lives in a process "
                       "of its own and outlives this kernel (%%monarch attach NAME from any kernel)")
    train.add_argument("--attached", action="store_true",
                       help="a named run that ends with this kernel, as unnamed ones do (quick experiments)")
    train.add_argument("--checkpoint-every", type=positive_int, default=None, metavar="K",
                       help="a durable checkpoint (torch DCP, asynchronous) every K committed steps")
    train.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: in the run directory)")
    train.add_argument("--on-failure", default=None, choices=list(ON_FAILURE),
                       help="peer (default): heal from a live peer; restart: every group restarts from disk; "
                            "plain_restart: the same without torchft (one process group, as torchrun runs it)")
    train.add_argument("--lowest-rung", default=None, choices=list(LOWEST_RUNGS),
                       help="communicator (default): a live process whose communicator broke or whose step "
                            "raised is repaired in place; process: every fault replaces the process")
    train.add_argument("--straggler", default=None, choices=["observe", "drain", "drop"],
                       help="a group named slow (its own work >= --straggler-factor x its peers' over "
                            "--straggler-window steps): observe (default: named only), drain (moved while it "
                            "trains), drop (let go at once, then replaced)")
    train.add_argument("--straggler-factor", type=float, default=None, help="the rule's factor (default 1.3)")
    train.add_argument("--straggler-window", type=int, default=None, help="the rule's window in steps (default 20)")
    train.add_argument("--quorum", default=None, choices=list(QUORUMS),
                       help="sync (default): torchft's quorum before each step's forward pass; async: beside "
                            "it (a healing group adds no gradient to that step)")
    train.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue a run from its newest durable checkpoint (same run id and event log)")
    train.add_argument("--resume-from", default=None, metavar="PATH",
                       help="start a NEW run from another run's checkpoint (a step-N directory or a checkpoint "
                            "folder): its weights, optimizer state and step; the model must match")
    train.add_argument("--no-wait", action="store_true", help="return before the first step is committed")

    inject = sub.add_parser("inject", help="inject a fault into one replica group (run.inject)")
    inject.add_argument("kind", choices=FAULT_KINDS)
    inject.add_argument("--replica", type=int, required=True)
    inject.add_argument("--rank", type=int, default=0)
    when = inject.add_mutually_exclusive_group()
    when.add_argument("--at-step", type=int, default=None)
    when.add_argument("--after", type=positive_float, default=None, metavar="SECONDS")
    inject.add_argument("--hang-seconds", type=positive_float, default=30.0, help="for 'hang': how long the GIL is held")
    inject.add_argument("--stuck", action="store_true",
                        help="for 'comms': the process cannot rebuild its communicator (the ladder escalates)")
    inject.add_argument("--factor", type=float, default=2.5,
                        help="for 'slow': the group's steps take this many times as long (1: back to normal)")

    schedule = sub.add_parser("schedule", help="inject random faults periodically (run.schedule)")
    schedule.add_argument("--every", type=positive_float, required=True, metavar="SECONDS")
    schedule.add_argument("--kinds", default="kill", help="comma-separated fault kinds (default: kill)")
    schedule.add_argument("--max", type=positive_int, default=None, dest="max_faults")
    schedule.add_argument("--seed", type=int, default=None)
    schedule.add_argument("--at-once", type=positive_int, default=1, help="groups hit together in each wave")
    schedule.add_argument("--keep", type=positive_int, default=1,
                          help="training groups a wave always leaves standing (default 1)")

    scale = sub.add_parser("scale", help="resize the running job to N replica groups (run.scale)")
    scale.add_argument("replicas", type=positive_int)

    drain = sub.add_parser("drain", help="move a replica group onto a spare or fresh processes while it trains, "
                                         "then let it go (run.drain): its node is about to leave")
    drain.add_argument("--replica", type=int, required=True)
    drain.add_argument("--timeout", type=float, default=180.0, help="seconds for the replacement to commit a step")

    wait = sub.add_parser("wait", help="block until a group rejoins or step N is committed "
                                       "(waiting.wait_for_rejoin / run.wait_for_step)")
    targets = wait.add_subparsers(dest="target", metavar="{rejoin,step,spare}", required=True)
    rejoin = targets.add_parser(
        "rejoin", help="until the recoveries under way (or, with none, the next one) are back",
        description="Block until replica groups rejoin (monarch_nb.ft.control.waiting.wait_for_rejoin). Recoveries "
                    "under way when typed (a fault injected or a failure detected, and the group not back yet) "
                    "are the ones waited for, all of them or that of --replica; with none under way, the next "
                    "rejoin. Prints one line per group: the step it rejoined at and how long after the fault.")
    rejoin.add_argument("--replica", type=non_negative_int, default=None, metavar="R",
                        help="only this replica group")
    rejoin.add_argument("--timeout", type=positive_float, default=REJOIN_TIMEOUT_S, metavar="S",
                        help=f"give up after S seconds (default {REJOIN_TIMEOUT_S:g})")
    step = targets.add_parser("step", help="until every group (or --replica) committed step N",
                              description="Block until every active replica group (or --replica) has committed "
                                          "step N (run.wait_for_step).")
    step.add_argument("step", type=positive_int, metavar="N")
    step.add_argument("--replica", type=non_negative_int, default=None, metavar="R",
                      help="only this replica group")
    step.add_argument("--timeout", type=positive_float, default=STEP_TIMEOUT_S, metavar="S",
                      help=f"give up after S seconds (default {STEP_TIMEOUT_S:g})")

    spare = targets.add_parser("spare", help="until every warm spare of the run is built and ready",
                               description="Block until every warm spare (--spares K) is ready to take a failed "
                                           "group's place (waiting.wait_for_spares).")
    spare.add_argument("--timeout", type=positive_float, default=REJOIN_TIMEOUT_S, metavar="S",
                       help=f"give up after S seconds (default {REJOIN_TIMEOUT_S:g})")

    check = sub.add_parser("check", help="prove the replicas bit-identical at a common step "
                                         "(waiting.require_identical / run.check_identical)")
    check.add_argument("--timeout", type=positive_float, default=CHECK_TIMEOUT_S, metavar="S",
                       help=f"give up after S seconds (default {CHECK_TIMEOUT_S:g})")

    restart = sub.add_parser("restart", help="after every group was lost with no checkpoint: train again from "
                                             "the initial weights (run.restart_from_scratch)")
    restart.add_argument("--from-scratch", action="store_true", required=True,
                         help="required: says that the lost state is given up")
    sub.add_parser("stop", help="stop the fault-tolerant run (run.stop)")
    attach = sub.add_parser("attach", help="attach this kernel to a live named run (FTRun.attach): its history, "
                                           "dashboard and controls")
    attach.add_argument("name", help="the run's name (%%monarch runs lists the live ones)")
    sub.add_parser("runs", help="the live named runs: name, step, groups, owner, age (monarch-nb runs)")
    sub.add_parser("dashboard", help="live dashboard of the run (run.dashboard())")


class TrainingCommands:
    """Holds the notebook's current run between magics."""

    def __init__(self) -> None:
        self.run: FTRun | None = None

    def current(self) -> FTRun:
        if self.run is None:
            raise UsageError("no fault-tolerant run is active; start one with `%monarch train`")
        if self.run.stopped:
            run = self.run
            raise UsageError(f"run {run.run_id} has stopped ({stopped_how(run)}); its history stays: "
                             f"monarch_nb.open_run({str(run.run_dir)!r}). Start another with `%monarch train`, or "
                             f"continue this one with `%monarch train --resume {run.run_dir} --steps N`")
        return self.run

    def train(self, args: argparse.Namespace, session: Session, shell: Any) -> FTRun:
        from ..ft import FTRun

        if self.run is not None and not self.run.stopped and not getattr(self.run, "detached", False):
            raise UsageError(f"run {self.run.run_id} is still active; `%monarch stop` it first")
        if args.name and not args.resume:
            from ..ft.control.run_client import live_runs

            if args.name in {r["name"] for r in live_runs()}:
                raise UsageError(f"run {args.name!r} is live (it outlived a kernel, or another kernel started it): "
                                 f"`%monarch attach {args.name}` gives it to this kernel")
        if args.resume:
            from ..ft.control.run_client import had_a_host

            try:
                if had_a_host(args.resume) and not args.attached:  # it resumes where it lived: a home of its own
                    return self._started_detached(None, args, shell)
                run = FTRun.resume(args.resume, session=session, **resume_overrides(args))
            except (ValueError, TypeError) as exc:
                raise UsageError(str(exc)) from None
            return self._started(run, args, shell, f" resumed from step {run.resume_from.step}")
        try:
            config = config_from_args(args)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        if args.name and not args.attached:  # a named run has a home of its own: it outlives this kernel
            return self._started_detached(config, args, shell)
        try:
            run = FTRun(config, session=session)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        how = f" from {args.module or ''}{' ' if args.module else ''}{args.config}" if args.config else ""
        if run.resume_from is not None:
            source = f"run {run.resume_source}'s" if run.resume_source else "the"
            how += f", starting from {source} checkpoint of step {run.resume_from.step}"
        return self._started(run, args, shell, how)

    def _started(self, run: FTRun, args: argparse.Namespace, shell: Any, how: str) -> FTRun:
        config = run.config
        self.run = run
        try:
            with Progress(lambda: groups_line(run, "replica groups training")):
                run.start()
        except KeyboardInterrupt:  # start() stops what it had started before it re-raises
            self.run = None
            raise Interrupted(f"%monarch train: interrupted while the groups were starting; run {run.run_id} "
                              "was stopped and left no process behind") from None
        except BaseException:  # a run that did not start is no active run (wait/inject/stop refuse);
            self.run = None   # a refusal (ValueError, e.g. nccl on too few GPUs) becomes a UsageError
            raise
        if shell is not None:
            shell.user_ns["run"] = run
        from .notices import watch_run

        watch_run(run)
        if not args.no_wait:
            first = run.resume_from.step + 1 if run.resume_from is not None else 1
            try:
                with Progress(lambda: step_line(run, first)):
                    run.wait_for_step(first, timeout=config.init_timeout_s)
            except KeyboardInterrupt:
                raise Interrupted(f"%monarch train: stopped waiting for step {first}; run {run.run_id} keeps "
                                  "training as `run` (%monarch status, %monarch stop)") from None
        print(f"run {run.run_id}{how}: {config.replicas} replica groups x {config.group_size} "
              f"process(es); events in {run.run_dir / 'events.jsonl'}; the run is `run` in this notebook")
        return run

    def _started_detached(self, config: Any, args: argparse.Namespace, shell: Any) -> Any:
        """``config``'s run, or (None) ``--resume``'s, in a host process of its own."""
        from ..ft.control import host_placement
        from ..ft.control.run_client import resume_detached, start_detached

        t0 = time.monotonic()
        try:
            run = start_detached(config) if config is not None else resume_detached(args.resume,
                                                                                   **resume_overrides(args))
        except ValueError as exc:
            raise UsageError(f"%monarch train: {exc}") from None
        self._adopt(run, shell)
        how = f" resumed from step {run.resumed_step}," if config is None else ""
        print(f"run {run.run_id}:{how} {run.config.replicas} replica groups x {run.config.group_size} process(es) "
              f"training in a process of their own ({host_placement.describe(run.host)}; "
              f"{time.monotonic() - t0:.1f} s): it outlives "
              f"this kernel. `%monarch attach {run.run_id}` from any kernel; events in "
              f"{run.run_dir / 'events.jsonl'}; the run is `run` in this notebook")
        return run

    def _adopt(self, run: Any, shell: Any) -> None:
        from .notices import watch_run

        if self.run is not None and getattr(self.run, "detached", False) and self.run is not run:
            self.run.detach()  # this kernel follows one run at a time; the other goes on
        self.run = run
        if shell is not None:
            shell.user_ns["run"] = run
        watch_run(run)

    def attach(self, args: argparse.Namespace, shell: Any) -> Any:
        from ..ft.control import host_placement
        from ..ft.control.run_client import attach

        if self.run is not None and not self.run.stopped and not getattr(self.run, "detached", False):
            raise UsageError(f"run {self.run.run_id} runs in this kernel; `%monarch stop` it before attaching another")
        try:
            run = attach(args.name)
        except (ValueError, PermissionError) as exc:
            raise UsageError(f"attach: {exc}") from None
        self._adopt(run, shell)
        steps = run.history().summary().get("committed_steps")
        print(f"attached to run {run.run_id} (host {host_placement.describe(run.host)}): "
              f"{len(run.events)} events replayed, "
              f"{steps} steps committed; the run is `run` in this notebook")
        return run

    def runs(self) -> None:
        from ..ft.control.run_client import live_runs

        rows = live_runs()
        if not rows:
            print("no live named runs (a run started with `%monarch train --name NAME` lives until it is stopped)")
            return
        print(f"{'name':<28} {'step':>7} {'groups':>6}  {'owner':<10} {'age':>8}  host")
        for r in rows:
            print(f"{r['name']:<28} {r['step']:>7} {r['groups']:>6}  {str(r['owner']):<10} {r['age_s'] / 60:>6.1f} m  "
                  f"{r['where']}")

    def inject(self, args: argparse.Namespace) -> None:
        run = self.current()
        try:
            run.inject(args.kind, replica=args.replica, rank=args.rank, at_step=args.at_step,
                       after_s=args.after, hang_s=args.hang_seconds, stuck=args.stuck, factor=args.factor)
        except (ValueError, RuntimeError) as exc:  # RuntimeError: the target is not training now
            raise UsageError(str(exc)) from None
        when = f" at step {args.at_step}" if args.at_step is not None else (
            f" after {args.after:g} s" if args.after else "")
        if FaultKind.parse(args.kind) in CLUSTER_KINDS:
            print(f"{args.kind}: sent to the scheduler for replica {args.replica}'s allocation{when}")
        elif FaultKind.parse(args.kind) is FaultKind.SLOW:
            print(f"replica {args.replica}'s steps take {args.factor:g}x as long{when}"
                  + (" (back to normal)" if args.factor == 1 else "; `--factor 1` ends it"))
        else:
            print(f"armed {args.kind} in replica {args.replica} rank {args.rank}{when}")

    def schedule(self, args: argparse.Namespace) -> None:
        run = self.current()
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad or not kinds:
            raise UsageError(f"--kinds: unknown fault kind(s) {bad}; allowed: {', '.join(FAULT_KINDS)}")
        try:
            run.schedule(args.every, kinds=kinds, seed=args.seed, max_faults=args.max_faults, at_once=args.at_once,
                         keep=args.keep)
        except ValueError as exc:  # e.g. more groups at once than the run has
            raise UsageError(f"schedule: {exc}") from None
        wave = f" into {args.at_once} groups at once" if args.at_once > 1 else ""
        wave += f", leaving at least {args.keep} training" if args.keep > 1 else ""
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

    def drain(self, args: argparse.Namespace) -> None:
        run = self.current()
        try:
            with Progress(lambda: groups_line(run, f"group {args.replica} draining; replica groups training")):
                event = run.drain(args.replica, timeout=args.timeout, reason="%monarch drain")
        except (ValueError, RuntimeError, TimeoutError) as exc:
            raise UsageError(str(exc)) from None
        source = "a warm spare" if event.from_spare else "fresh processes"
        print(f"group {event.replica} moved to group {event.replacement} ({source}) in {event.seconds:.1f} s: the "
              f"replacement healed from live peers and committed a step before group {event.replica} left")

    def wait(self, args: argparse.Namespace) -> None:
        from ..ft.control.waiting import describe_rejoin, wait_for_rejoin

        run = self.current()
        if args.target == "spare":
            from ..ft.control.waiting import wait_for_spares

            try:
                with Progress(lambda: spares_line(run)):
                    ready = wait_for_spares(run, timeout=args.timeout)
            except (ValueError, TimeoutError) as exc:
                raise UsageError(f"wait spare: {exc}") from None
            print(f"warm spare(s) ready: {', '.join(ready)}")
            return
        if args.replica is not None:
            active = sorted(g.index for g in run.groups.active())
            if args.replica not in active:
                raise UsageError(f"--replica: {args.replica} is not an active replica group; active groups: "
                                 f"{', '.join(map(str, active)) or 'none'}\n\n{WAIT_USAGE}")
        if args.target == "rejoin":
            try:
                with Progress(lambda: groups_line(run, "replica groups training")):
                    events = wait_for_rejoin(run, replica=args.replica, timeout=args.timeout)
            except (ValueError, TimeoutError, RuntimeError) as exc:
                raise UsageError(f"wait rejoin: {exc}") from None
            for e in events:
                print(describe_rejoin(e))
            return
        steps = run.config.steps
        if steps is not None and args.step > steps:
            raise UsageError(f"N: step {args.step} is past the run's last step (steps={steps}); "
                             f"allowed: 1..{steps}\n\n{WAIT_USAGE}")
        # Every live group: retired and given-up groups are no longer part of the run.
        groups = run.groups.live()
        want = [args.replica] if args.replica is not None else sorted(g.index for g in groups)
        t0 = time.monotonic()
        try:
            with Progress(lambda: step_line(run, args.step, want)):
                run.wait_for_step(args.step, replicas=want, timeout=args.timeout)
        except TimeoutError:
            status = run.status()
            behind = [r for r in want if status.get(r, {}).get("step", 0) < args.step]
            where = "; ".join(f"replica {r} is {status[r]['state']} at step {status[r]['step']}"
                              for r in behind if r in status)
            raise UsageError(f"wait step {args.step}: {_groups(behind or want)} had not committed step {args.step} "
                             f"within {args.timeout:g} s ({where or 'no step recorded'}); "
                             "see `%monarch status`, or pass a longer --timeout") from None
        print(f"step {args.step} committed by {_groups(want, every=args.replica is None)} "
              f"({time.monotonic() - t0:.1f} s)")

    def check(self, args: argparse.Namespace) -> None:
        from ..ft.control.waiting import require_identical

        run = self.current()
        try:
            with Progress(lambda: groups_line(run, "groups training (the check waits for a common step)")):
                event = require_identical(run, timeout=args.timeout)
        except (RuntimeError, TimeoutError) as exc:  # ReplicasDiffer is a RuntimeError
            raise UsageError(f"check: {exc}") from None
        what = "" if run.config.sync == "step" else \
            f" (their parameters at a {run.config.sync} meeting step; each group's optimizer state is its own)"
        print(f"replicas bit-identical at step {event.step} ({len(event.hashes)} ranks){what}")

    def restart(self, args: argparse.Namespace) -> None:
        run = self.current()
        try:
            event = run.restart_from_scratch()
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
        print(f"replica groups {', '.join(map(str, event.replicas))} train again from the initial weights "
              f"(the state of step {event.lost_step} was lost)")

    def stop(self) -> None:
        run = self.current()
        report = run.stop()
        print(f"{report}; reopen it with monarch_nb.open_run({str(run.run_dir)!r})")

    def dashboard(self) -> Any:
        """The run's dashboard; a finished or stopped run's too (drawn from its events)."""
        run = self.run if self.run is not None and self.run.stopped else self.current()
        return run.dashboard()


def groups_line(run: FTRun, what: str) -> Line:
    """Progress of a wait on the groups: how many train, and what the others are doing."""
    status = {k: v for k, v in run.status().items() if isinstance(k, int) and v.get("state") not in
              ("retired", "retiring", "gave_up")}
    training = [k for k, v in status.items() if v.get("state") == "training"]
    others = ", ".join(f"replica{k} {v.get('state')}" for k, v in sorted(status.items()) if k not in training)
    return Line(len(training), len(status), what + (f"; {others}" if others else ""))


def spares_line(run: FTRun) -> Line:
    """Progress of a wait for the warm spares: how many are ready."""
    spares = {k: v for k, v in run.status().items() if isinstance(k, str) and k.startswith("spare")}
    ready = [k for k, v in spares.items() if v.get("state") == "ready"]
    return Line(len(ready), run.config.spares, "warm spares ready" + (
        f"; {', '.join(k for k in spares if k not in ready)} building" if len(ready) < len(spares) else ""))


def stopped_how(run: FTRun) -> str:
    """How a stopped run ended, in a few words: finished (and where its final state is), or stopped."""
    from ..telemetry.events import RunFinished

    finished = [e for e in run.events.recent(RunFinished) if e.checkpoint]
    if finished:
        return f"it finished at step {finished[-1].step}, final checkpoint {finished[-1].checkpoint}"
    return "stopped"


def step_line(run: FTRun, step: int, replicas: list[int] | None = None) -> Line:
    """Progress of a wait for a step: groups that committed it, and where the others are."""
    status = run.status()
    want = replicas if replicas is not None else [k for k in status if isinstance(k, int)]
    steps = {r: status.get(r, {}).get("step", 0) or 0 for r in want}
    behind = ", ".join(f"replica{r} at {s}" for r, s in sorted(steps.items()) if s < step)
    return Line(sum(1 for s in steps.values() if s >= step), len(want),
                f"groups committed step {step}" + (f"; {behind}" if behind else ""))


def _groups(replicas: list[int], every: bool = False) -> str:
    """``replica 2``, ``replicas 0, 1`` or ``every replica group (0, 1, 2)``."""
    names = ", ".join(map(str, replicas))
    if every:
        return f"every replica group ({names})"
    return f"replica {names}" if len(replicas) == 1 else f"replicas {names}"


# flags of ours that a torchtitan 0.3 job sets itself: with --module, give torchtitan's flag
TITAN_SETS = {"steps": "--training.steps", "seq_len": "--training.seq_len", "batch_size": "--training.local_batch_size",
              "lr": "--optimizer.param-groups.0.optimizer-kwargs.lr", "model": "--config (the registry function picks the model)",
              "group_size": "--parallelism.data_parallel_shard_degree", "backend": "--fault_tolerance.process_group",
              "checkpoint_every": "--checkpoint.enable --checkpoint.interval K"}


def _own_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = {"replicas": args.replicas, "group_size": args.group_size, "steps": args.steps,
              "seq_len": args.seq_len, "batch_size": args.batch_size, "lr": args.lr, "model": args.model,
              "job": "slurm" if args.slurm else "kubernetes" if args.k8s else args.job, "platform": args.platform,
              "backend": args.backend, "run_name": args.name,
              "partition": args.partition, "time_limit": args.time_limit, "spares": args.spares,
              "controller_on": args.controller_on,
              "checkpoint_every": args.checkpoint_every, "checkpoint_dir": args.checkpoint_dir,
              "on_failure": args.on_failure, "resume_from": args.resume_from,
              "lowest_rung": args.lowest_rung, "quorum": args.quorum, "straggler": args.straggler,
              "straggler_factor": args.straggler_factor, "straggler_window": args.straggler_window}
    return {k: v for k, v in fields.items() if v is not None}


def _check_job_flags(args: argparse.Namespace) -> None:
    if args.slurm and args.job not in (None, "slurm"):
        raise ValueError(f"--slurm and --job {args.job} disagree; give one")
    if args.k8s and (args.slurm or args.job not in (None, "kubernetes")):
        raise ValueError(f"--k8s and {'--slurm' if args.slurm else '--job ' + str(args.job)} disagree; give one")


def resume_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--resume RUN_DIR``: the run's own config, with these flags over it."""
    _check_job_flags(args)
    if args.config or args.module:
        raise ValueError("--resume continues a run with its own config; drop --config/--module")
    if args.resume_from:
        raise ValueError("--resume continues a run from its own checkpoints; --resume-from starts a new run "
                         "from another run's checkpoint: give one of them")
    return _own_fields(args)


def config_from_args(args: argparse.Namespace) -> Any:
    """The validated RunConfig that ``%monarch train ARGS`` and ``monarch-nb train ARGS`` start: from
    flags, a torchtitan 0.3 registry job (``--module M --config F --section.key V``, read by
    torchtitan's own ConfigManager), or a legacy TOML file. A ``ValueError`` names what is wrong."""
    from ..ft import RespawnBackoff, RunConfig
    from ..ft.settings import titan_job

    _check_job_flags(args)
    overrides = _own_fields(args)
    titan_args = list(getattr(args, "titan_args", None) or [])
    if args.module is not None:
        clash = [f"--{k.replace('_', '-')} (give {TITAN_SETS[k]})" for k in overrides if k in TITAN_SETS]
        if clash:
            raise ValueError(f"with --module the job sets these itself: {', '.join(clash)}")
        if args.config is None:
            raise ValueError(f"--module {args.module} needs --config FUNCTION (the registry function to call)")
        config = titan_job.run_config(["--module", args.module, "--config", args.config, *titan_args], **overrides)
    elif titan_args:
        raise ValueError(f"unrecognized arguments: {' '.join(titan_args)} (torchtitan's --section.key flags need "
                         "--module M --config F)")
    else:
        config = RunConfig.from_toml(args.config, **overrides) if args.config else RunConfig(**overrides)
    if args.max_respawns is not None:
        respawn = dataclasses.replace(config.respawn or RespawnBackoff(), max_respawns=args.max_respawns)
        config = config.replace(respawn=respawn)
    return config.validate()
