"""``monarch-nb``: run notebooks headless on the Monarch kernel, train or check a torchtitan job, install the kernel."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check-job"]:  # the rest is torchtitan's own job form, parsed by torchtitan
        from .ft.settings.titan_job import check

        code, text = check(argv[1:])
        print(text, file=sys.stderr if code == 2 else sys.stdout)
        return code
    if argv[:1] == ["convert-job"] and len(argv) == 2 and not argv[1].startswith("-"):
        from .ft.settings.job_convert import convert

        code, text = convert(argv[1])
        print(text, file=sys.stderr if code else sys.stdout)
        return code
    if argv[:1] == ["runs"] or argv[:1] == ["stop"]:
        return _runs(argv)
    if argv[:1] == ["train"]:  # the flags of `%monarch train`, torchtitan's job form among them
        from .shell_train import main as train

        return train(argv[1:])
    parser = argparse.ArgumentParser(prog="monarch-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("execute", help="run a notebook headless; exit non-zero naming the failing cell")
    run.add_argument("notebook")
    run.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                     help="set a parameter (Python literal, else a string); repeatable")
    run.add_argument("--output", "-o", default=None, help="where to write the executed notebook")
    run.add_argument("--timeout", type=float, default=600, help="seconds allowed per cell (default 600)")
    run.add_argument("--kernel", default="monarch", help="kernel name (default: monarch)")
    run.add_argument("--cwd", default=None, help="working directory of the kernel (default: the notebook's folder)")

    sub.add_parser("check-job", help="torchtitan 0.3's job form (--module M --config F --section.key V ...): "
                   "print what every field becomes, honoured or refused; nothing is started")

    sub.add_parser("train", help="start a fault-tolerant run headless and train to its last step: the flags of "
                   "`%%monarch train` (monarch-nb train --help), torchtitan 0.3's job form among them")

    conv = sub.add_parser("convert-job", help="print a legacy TOML job (torchtitan up to 0.2) in torchtitan 0.3's "
                          "form: a config-registry function and `monarch-nb train` flags, checked to give the same run")
    conv.add_argument("toml", metavar="OLD.toml")

    sub.add_parser("runs", help="the live named runs (started with --name: they outlive their kernel): name, step, "
                   "groups, owner, age")
    stop = sub.add_parser("stop", help="stop a live named run from a shell")
    stop.add_argument("name")

    inst = sub.add_parser("install-kernel", help="install the Monarch kernelspec")
    inst.add_argument("--user", action="store_true", help="install for this user instead of this environment")

    args = parser.parse_args(argv)
    if args.command == "install-kernel":
        import sys as _sys

        from .execute import install_kernel

        print(install_kernel(user=args.user, prefix=None if args.user else _sys.prefix))
        return 0

    from .execute import NotANotebook, NotebookFailed, execute_notebook, parse_parameter

    try:
        params = dict(parse_parameter(p) for p in args.param)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        execute_notebook(args.notebook, params=params, output=args.output, timeout=args.timeout,
                         kernel_name=args.kernel, cwd=args.cwd)
    except NotebookFailed as exc:
        print(f"monarch-nb: {args.notebook}: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, NotANotebook) as exc:
        print(f"monarch-nb: {exc}", file=sys.stderr)
        return 2
    print(f"monarch-nb: {args.notebook}: all cells ran" + (f"; wrote {args.output}" if args.output else ""))
    return 0


def _runs(argv: list[str]) -> int:
    """``monarch-nb runs`` and ``monarch-nb stop NAME``: the live named runs, from a shell."""
    from .ft.control.run_client import attach, live_runs

    if argv[0] == "runs":
        rows = live_runs()
        for r in rows:
            print(f"{r['name']}\tstep {r['step']}\t{r['groups']} groups\towner {r['owner']}\t"
                  f"{r['age_s'] / 60:.1f} min\thost {r['where']}")
        if not rows:
            print("no live named runs", file=sys.stderr)
        return 0
    if len(argv) != 2:
        print("usage: monarch-nb stop NAME", file=sys.stderr)
        return 2
    try:
        run = attach(argv[1])
    except (ValueError, PermissionError) as exc:
        print(f"monarch-nb stop: {exc}", file=sys.stderr)
        return 2
    print(run.stop())
    run.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
