"""`dfpo theory`: run the claims ledger and print / write it.

    dfpo theory                         table of every claim and its verdict
    dfpo theory --verbose               ... with statement, conditions, evidence and notes
    dfpo theory --only eq-55 cor-H.1    a subset (ids as in the table)
    dfpo theory --json PATH             also write the ledger as JSON (the app reads it)
    dfpo theory --markdown PATH         also write it as markdown (docs/ledger.md)

Module-level imports stay light (the standard library and dfpo.core.files); the checks import torch and sympy.
"""

from __future__ import annotations

import argparse
import time

from ..core.files import check_output_file, write_text_atomic


def _run(args: argparse.Namespace) -> int:
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None:
            check_output_file(flag, path)  # before the ledger runs
    # deferred: the ledger imports every check (torch, sympy); dfpo --help and a bad flag stay free of them
    from .ledger import render_json, render_markdown, render_table, run_ledger, validate_ids

    ids = validate_ids(args.only)  # ValueError on an unknown id, before any check runs
    start = time.perf_counter()
    claims = run_ledger(ids)
    elapsed = time.perf_counter() - start
    print(render_table(claims, verbose=args.verbose))
    print(f"ledger ran in {elapsed:.1f} s")
    if args.json:
        write_text_atomic(args.json, render_json(claims))
        print(f"wrote {args.json}")
    if args.markdown:
        write_text_atomic(args.markdown, render_markdown(claims))
        print(f"wrote {args.markdown}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "theory",
        help="claims ledger: verify or refute every claim of the paper (sympy + softmax tables through the loss core)",
        description="Run the claims ledger and print each claim's verdict (holds / holds-under-conditions / fails).",
    )
    p.add_argument("--json", metavar="PATH", default=None, help="write the ledger as JSON to PATH")
    p.add_argument("--markdown", metavar="PATH", default=None, help="write the ledger as markdown to PATH (docs/ledger.md)")
    p.add_argument("--only", metavar="ID", nargs="+", action="extend", default=None, help="run only these claim ids")
    p.add_argument("--verbose", "-v", action="store_true", help="print statement, conditions, evidence and notes of each claim")
    p.set_defaults(func=_run)
