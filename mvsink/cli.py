"""``mvsink``: run a job file (or the embedded demo), or print a view's frontier.

mvsink run [JOB.toml]          run a streaming job into an MVSink (default: the demo)
mvsink frontier TARGET NAME    print the frontier of view NAME in the table at TARGET
mvsink promote TARGET --name NAME --writer WRITER
                               make WRITER the active writer of view NAME (fences the others)
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence

from mvsink.errors import MVSinkError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mvsink", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job file, or the embedded demo when none is given")
    run.add_argument("config", nargs="?", help="a TOML job file (see conf/)")
    run.add_argument("--epochs", type=int, help="stop after this many epochs")
    run.add_argument("-v", "--verbose", action="store_true", help="log every sink step")
    fr = sub.add_parser("frontier", help="print a view's frontier (empty if none)")
    fr.add_argument("target")
    fr.add_argument("name")
    pr = sub.add_parser("promote", help="make a writer the view's active writer")
    pr.add_argument("target")
    pr.add_argument("--name", required=True, help="the view")
    pr.add_argument("--writer", required=True, help="the writer option of the sink to promote")
    pr.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE", help="for object stores"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "promote":
            from mvsink.sink import promote

            options = dict(o.split("=", 1) for o in args.storage_option)
            version = promote(args.target, args.name, args.writer, options)
            print(f"{args.writer} is the active writer of {args.name} as of version {version}")
            return 0
        if args.command == "frontier":
            from mvsink.sink import frontier

            value = frontier(args.target, args.name)
            print("" if value is None else value)
            return 0
        return _run(args.config, args.epochs, args.verbose)
    except MVSinkError as exc:
        print(f"mvsink: {exc}", file=sys.stderr)
        return 2


def _run(path: str | None, epochs: int | None, verbose: bool) -> int:
    from mvsink.job import JobConfig
    from mvsink.runner import run_job

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = JobConfig.load(path)
    if epochs is not None:
        config = config.model_copy(update={"job": config.job.model_copy(update={"epochs": epochs})})
    run_job(config, stop=threading.Event())
    return 0


if __name__ == "__main__":
    sys.exit(main())
