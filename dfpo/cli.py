"""The `dfpo` command: one entry point with a subcommand for each part of the project.

Each part registers its own subcommand from a light module (heavy imports stay inside the
handler), so `dfpo --help` and `dfpo objectives` start fast:

    dfpo objectives            table of every objective preset (dfpo.core.loss); --long, NAME or LABEL: the detail
    dfpo demo                  shared-prefix cancellation on a hand-made group
    dfpo theory ...            claims ledger (dfpo.theory.cli)
    dfpo toy ...               tabular softmax lab (dfpo.toy.cli)
    dfpo train ...             LLM trainer (dfpo.trainer.cli)
    dfpo compare ...           objectives on the LLM trainer over paired seeds (dfpo.trainer.cli)
    dfpo pilot ...             a recipe's four gates before any comparison (dfpo.trainer.cli)
    dfpo probe ...             parameter-space drift per objective (dfpo.trainer.probe.cli)
    dfpo app ...               the Streamlit explorer and its pages (dfpo.app.cli)

A part's module exposes ``register(subparsers) -> None``; it adds one parser and sets
``func=<callable(args) -> int>`` on it with ``set_defaults``.

``dfpo train`` answers SIGINT and SIGTERM from its first moment: ``main`` installs
``dfpo.trainer.run.signals`` before it imports the parts (see that module).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys

from dfpo.core.files import WRITE_ERRNOS, WriteFailed, describe_write_error
from dfpo.trainer.run.logs import IMPORTED_AT  # noqa: F401  imported first, so process_age_s's fallback clock starts with the process
from dfpo.trainer.run.signals import decided, exit_on_signal

# Parts that register their own subcommands; a part that is not built yet is skipped.
PART_MODULES = ("dfpo.theory.cli", "dfpo.toy.cli", "dfpo.trainer.cli", "dfpo.trainer.probe.cli", "dfpo.app.cli")


def _cmd_objectives(args: argparse.Namespace) -> int:
    # deferred (here and in _cmd_demo): dfpo.commands imports torch and the loss core; dfpo --help stays free of them
    from dfpo.commands import atlas_table, objective_trace, objectives_summary, objectives_table

    if args.trace:
        if not args.name or args.atlas or args.long or args.markdown:
            raise SystemExit(
                "dfpo objectives: --trace follows one objective alone; name it (or its label) and nothing else, e.g. "
                "dfpo objectives dfpo_min:stopgrad=score --trace"
            )
        print(objective_trace(args.name))
        return 0
    if args.atlas:
        if args.name:
            raise SystemExit(f"dfpo objectives: --atlas shows every objective; drop the name {args.name!r}")
        if args.long:
            raise SystemExit("dfpo objectives: --long is the long form of the presets' table, not of --atlas; drop one of them")
        print(atlas_table(markdown=args.markdown, own_aggregation=args.own_aggregation))
        return 0
    if args.long or args.name:
        print(objectives_table(markdown=args.markdown, objective=args.name))
    else:
        print(objectives_summary(markdown=args.markdown))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from dfpo.commands import cancellation_demo  # deferred: torch (see _cmd_objectives)

    print(cancellation_demo(seed=args.seed))
    return 0


class _Version(argparse.Action):
    """--version, with the installed version read only when asked (importlib.metadata costs every start ~25 ms)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from dfpo import __version__

        print(f"dfpo {__version__}")  # to stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dfpo",
        description="Token gradient cancellation in group-relative RL fine-tuning (DFPO, arXiv 2604.13088).",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "objectives",
        help="table of every objective preset and what each is (NAME or --long: its components' values and sources)",
        description="Every objective preset: a table of the components that tell them apart and one line on each. "
        "NAME: one preset's every component, its value, whether the loss reads it and its source; a LABEL "
        "(dfpo_min:stopgrad=score, a preset with some components changed) takes a name's place here and with --trace. "
        "--long: every preset's sources, every component's declaration and the advantage estimators.",
    )
    p.add_argument(
        "name",
        nargs="?",
        default=None,
        metavar="NAME",
        help="show one objective only (a preset's name or a label such as dfpo_min:stopgrad=score): every component, its value and source",
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="the long form: every preset's sources, every component's declaration, the advantage estimators",
    )
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument(
        "--trace",
        action="store_true",
        help="with NAME or LABEL: every stage of its loss in order (function file:line, paper equation, values on a small batch)",
    )
    p.add_argument(
        "--atlas", action="store_true", help="the cancellation verdict matrix of every objective, computed now from the loss core"
    )
    p.add_argument("--own-aggregation", action="store_true", help="with --atlas: one row per objective, its preset's own aggregation")
    p.set_defaults(func=_cmd_objectives)

    p = sub.add_parser(
        "demo",
        help="numeric demo of shared-token cancellation (GRPO, GSPO, DFPO, GRPO-fix)",
        description="The gradient each objective leaves on a token shared by all 4 completions of one hand-made group "
        "(rewards 1, 0, 1, 0), at equal and unequal lengths, with the shared token inside and outside the clip range: "
        "0 where the group's pushes cancel (paper eq 2). Every registered objective, then the study's variants of DFPO.",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the hand-made group's ratios")
    p.set_defaults(func=_cmd_demo)

    for name in PART_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # the part is not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Without ``argv`` (the ``dfpo`` program itself) the command line is read
    and ``dfpo train``'s exit signals stay installed until the process ends; with ``argv`` (a call from Python)
    the previous signal handlers are back on return."""
    program = argv is None
    argv = sys.argv[1:] if program else list(argv)
    with exit_on_signal(for_the_process=program) if argv[:1] == ["train"] else contextlib.nullcontext():  # before importing parts
        status = _run(argv)
        decided(status)  # the command's outcome: a later signal only ends the program sooner, with this status
        return status


def _run(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # piped into head, which closed: stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the interpreter's final flush does not fail too
        return 128 + signal.SIGPIPE
    except ValueError as err:  # bad input: one clear line, no traceback
        if not getattr(err, "already_reported", False):  # another process (rank 0) printed it
            print(f"dfpo: error: {err}", file=sys.stderr)
        return 2
    except WriteFailed as err:  # a file could not be written; what was written before is kept
        print(f"dfpo: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full disk, a read-only folder, a permission: named, one line (any other OSError is a bug)
        if err.errno not in WRITE_ERRNOS:
            raise
        print(
            f"dfpo: error: {describe_write_error(err.filename or '(a file)', err)}; free space or fix the folder, then run again",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
