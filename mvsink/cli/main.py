"""``mvsink``: run a job file (or the embedded demo), and operate a view's table.

mvsink run [JOB.toml] [--epochs N] [--arg KEY=VALUE] [--conf KEY=VALUE] [-v]
                               run a streaming job into an MVSink (default: the demo);
                               Ctrl-C stops it after the epoch in flight
mvsink status [TARGET] [--name NAME] [--json] [--job JOB.toml]
                               what the target's log says about its views
mvsink verify [TARGET] [--name NAME] (--sql QUERY | --job JOB.toml) [--json]
                               whether the target equals desired (exit 0 equal, 1 different)
mvsink frontier TARGET NAME    print the frontier of view NAME in the table at TARGET
mvsink promote TARGET --name NAME --writer WRITER
                               make WRITER the active writer of view NAME (fences the others)
mvsink compact [TARGET] --name NAME [--max-rows-per-file N] [--cluster-by A,B]
               [--history-retention D]
                               merge small files through the sink's strict commit (and
                               compact the view's history, dropping what ended before D)
mvsink vacuum [TARGET] [--retention-hours H] [--apply] [--json]
                               delete unreferenced files, crashed attempts' and stale index entries
mvsink history [TARGET] --name NAME [--equal COLUMN=VALUE ...] [--json]
                               the lifetimes of a key's or a row's values (history_target)

TARGET is a path or URI, or a table name ([catalog.][schema.]table) resolved through a Spark
session that the command starts, configured by the job file's [spark] table and --conf.
Exit codes: 0 done (verify: equal), 1 verify found a difference or frontier found none,
2 an error (the message says what), 130 stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from mvsink.errors import ConfigError, MVSinkError, first_line


def _plain(text: str) -> str:
    """A docstring's line as a terminal shows it: no reStructuredText literals."""
    return text.replace("``", "")


INTERRUPTED = 130
"""Exit code of a command stopped by Ctrl-C (SIGINT), as shells report it."""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a job's query started, or a command in its middle
        print("mvsink: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        from mvsink.table.storage import wait_for_cleanup

        # Deletes queued in the background get a bounded time (CLEANUP_WAIT) to finish before
        # the process ends; what a hung store leaves, the next sweep finds.
        wait_for_cleanup()


def _main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except MVSinkError as exc:
        print(f"mvsink: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # exit 2 means "error" (verify's 1 means "different")
        print(f"mvsink: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    from mvsink._version import __version__

    summary, _, commands = _plain(__doc__).partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="mvsink",
        description=summary,
        epilog=commands,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mvsink {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_run_parser, _frontier_parser, _promote_parser, _status_parser, _verify_parser):
        add(sub)
    _vacuum_parser(sub)
    _compact_parser(sub)
    _history_parser(sub)
    return parser


def _run_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run a job file, or the embedded demo when none is given")
    run.add_argument("config", nargs="?", help="a TOML job file (see conf/)")
    run.add_argument("--epochs", type=_positive, help="stop after this many epochs")
    run.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [job] args value for this run (over the job file's; VALUE as in TOML, else a string)",
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="log every sink step (phases, retries, sweeps)"
    )
    _conf_option(run)


def _frontier_parser(sub: Any) -> None:
    fr = sub.add_parser("frontier", help="print a view's frontier (exit 1 if it never committed there)")
    fr.add_argument("target")
    fr.add_argument("name")
    _conf_option(fr)


def _promote_parser(sub: Any) -> None:
    pr = sub.add_parser("promote", help="make a writer the view's active writer")
    pr.add_argument("target")
    pr.add_argument("--name", required=True, help="the view")
    pr.add_argument("--writer", required=True, help="the writer option of the sink to promote")
    pr.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE", help="for object stores"
    )
    _conf_option(pr)


def _status_parser(sub: Any) -> None:
    st = sub.add_parser("status", help="per view: frontier, lineage, writer, last commit, lag, files")
    st.add_argument("target", nargs="?", help="the Delta table (or give --job)")
    st.add_argument("--name", help="one view (default: every view committed recently)")
    st.add_argument("--json", action="store_true", help="machine-readable (docs/operations.md)")
    st.add_argument("--history", type=int, default=200, help="commits read for per-commit figures")
    _target_options(st)


def _verify_parser(sub: Any) -> None:
    ve = sub.add_parser("verify", help="compare the target with desired: exit 0 equal, 1 different, 2 error")
    ve.add_argument("target", nargs="?", help="the Delta table (or give --job)")
    ve.add_argument("--name", help="the view")
    ve.add_argument("--sql", help="a Spark SQL query whose result is desired")
    ve.add_argument("--json", action="store_true", help="machine-readable (docs/operations.md)")
    _target_options(ve)


def _vacuum_parser(sub: Any) -> None:
    va = sub.add_parser("vacuum", help="delete what no version within the retention references")
    va.add_argument("target", nargs="?", help="the Delta table (or give --job)")
    va.add_argument(
        "--retention-hours",
        type=int,
        help="must be the table's delta.deletedFileRetentionDuration (7 days unless set)",
    )
    va.add_argument("--apply", action="store_true", help="delete (default: a dry run that only reports)")
    va.add_argument("--json", action="store_true", help="machine-readable")
    va.add_argument("--name", help=argparse.SUPPRESS)
    _target_options(va)


def _compact_parser(sub: Any) -> None:
    co = sub.add_parser("compact", help="merge a view's small files (a commit that changes no row)")
    co.add_argument("target", nargs="?", help="the Delta table (or give --job)")
    co.add_argument("--name", help="the view (its index entries are carried over)")
    co.add_argument("--max-rows-per-file", type=int, help="default: the job's, or 50,000")
    co.add_argument("--cluster-by", default="", help="comma-separated columns to sort rows by")
    co.add_argument(
        "--history-retention",
        help="a view keeping a history: drop lifetimes that ended longer ago than this (e.g. 90d; "
        "default: the job's history_retention, else keep all)",
    )
    _target_options(co)


def _history_parser(sub: Any) -> None:
    hi = sub.add_parser("history", help="the lifetimes of a key's or a row's values, from the view's history")
    hi.add_argument("target", nargs="?", help="the view's Delta table (or give --job)")
    hi.add_argument("--name", help="the view (default: the job file's)")
    hi.add_argument(
        "--equal",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="only rows with this value (repeat: a key of several columns, or a whole row)",
    )
    hi.add_argument("--history-target", help="where the history is (default: where the view's commits say)")
    hi.add_argument("--json", action="store_true", help="one JSON object per lifetime")
    _target_options(hi)


def _history(args: argparse.Namespace) -> int:
    from mvsink.cli.runner import show_table
    from mvsink.ops.history import lifetimes

    target, name, options, _ = _target(args)
    if not name:
        raise ConfigError("give the view's name (--name, or --job with a job file)")
    if not args.equal:
        raise ConfigError("give a key's or a row's values, --equal COLUMN=VALUE (one per column)")
    history = args.history_target
    if history is None and args.job:
        from mvsink.cli.job import JobConfig

        history = JobConfig.load(args.job).sink.history_target
    history = _located(history, args) if history else None
    equal = _pairs(args.equal, "--equal")
    found = lifetimes(target, name, equal, history_target=history, storage_options=options)
    if args.json:
        for row in found.to_pylist():
            print(json.dumps(row, default=str, sort_keys=True))
    else:
        what = ", ".join(args.equal)
        print(
            show_table(found, f"lifetimes of view {name} ({what})", limit=found.num_rows or 1, ordered=True)
        )
    return 0


def _compact(args: argparse.Namespace) -> int:
    from mvsink.ops.compact import compact

    target, name, options, small = _target(args)
    if not name:
        raise ConfigError("give the view: --name NAME (or --job)")
    _session_if_needed(target, options, args)
    rows = args.max_rows_per_file or small * 4
    _progress(f"compacting {target} ...")
    cluster = tuple(c.strip() for c in args.cluster_by.split(",") if c.strip())
    retention, history = args.history_retention, None
    if args.job:
        from mvsink.cli.job import JobConfig

        sink = JobConfig.load(args.job).sink
        cluster = cluster or sink.cluster_by
        retention, history = retention or sink.history_retention, sink.history_target
    print(compact(target, name, options, max_rows_per_file=rows, cluster_by=cluster))
    from mvsink.ops.history import compact_history, recorded
    from mvsink.table.storage import Store
    from mvsink.table.uris import table_root

    history = _located(history, args) if history else None
    if history is None and recorded(Store(table_root(target), options), name) is None:
        if retention is not None:
            raise ConfigError(f"--history-retention: view {name!r} keeps no history")
        return 0
    print(compact_history(target, name, options, retention=retention, history_target=history))
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from mvsink.ops.vacuum import vacuum

    target, _, options, _ = _target(args)
    _session_if_needed(target, options, args)
    _progress(f"vacuuming {target} ({'apply' if args.apply else 'dry run'}) ...")
    done = vacuum(target, options, retention_hours=args.retention_hours, apply=args.apply)
    print(json.dumps({"format": 1, **asdict(done)}, indent=2) if args.json else done)
    return 0


def _status(args: argparse.Namespace) -> int:
    from mvsink.ops.status import describe_missing_table, status

    target, name, options, small = _target(args)
    result = status(target, name, options, history=args.history, small_rows=small)
    if result.table_version is None:
        raise ConfigError(describe_missing_table(target, options))
    print(json.dumps(result.to_json(), indent=2, sort_keys=True) if args.json else result)
    return 0


def _promote(args: argparse.Namespace) -> int:
    from mvsink.ops.promote import promote

    options = _pairs(args.storage_option, "--storage-option")
    target = _located(args.target, args)
    _session_if_needed(target, options, args)
    version = promote(target, args.name, args.writer, options)
    print(f"{args.writer} is the active writer of {args.name} as of version {version}")
    return 0


def _frontier(args: argparse.Namespace) -> int:
    from mvsink.ops.promote import frontier

    target = _located(args.target, args)
    value = frontier(target, args.name)
    if value is None:
        print(f"mvsink: {_no_frontier(target, args.name)}", file=sys.stderr)
        return 1
    print(value)
    return 0


def _progress(message: str) -> None:
    """A progress line on a terminal; nothing when output goes to a file or a pipe."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", help="a TOML job file: target, view and storage options from its [sink]")
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE", help="for object stores"
    )
    _conf_option(parser)


def _conf_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark configuration for the session this command starts, over spark-submit's and "
        "the job file's [spark]",
    )


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    bad = [v for v in values if "=" not in v]
    if bad:
        raise ConfigError(f"{flag} takes KEY=VALUE, got {bad[0]!r}")
    return dict(v.split("=", 1) for v in values)


def _spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """The job file's [spark] for a command's session (its master aside: the command runs
    here). What the launcher and --conf set wins over it (``cli.session``)."""
    conf: dict[str, str] = {}
    if getattr(args, "job", None):
        from mvsink.cli.job import JobConfig

        conf = {k: v for k, v in JobConfig.load(args.job).spark.items() if k != "spark.master"}
    # Spark's console progress bar on a terminal only.
    conf["spark.ui.showConsoleProgress"] = str(sys.stderr.isatty()).lower()
    return conf


def _session(args: argparse.Namespace) -> Any:
    """The command's Spark session (started once): --conf, then the launcher's settings, then
    the job file's [spark]."""
    from mvsink.cli.session import local_session

    return local_session(
        f"mvsink-{args.command}", conf=_spark_conf(args), explicit=_pairs(args.conf, "--conf")
    )


def _located(target: str, args: argparse.Namespace) -> str:
    """``target``, or for a table name its location, looked up through a Spark session this
    command starts (configured by the job file's [spark] and --conf); the lookup is echoed."""
    from mvsink.errors import Where
    from mvsink.table.catalog import is_path, locate

    if not target or is_path(target):
        return target
    _progress(f"starting Spark to look up {target} ...")
    location = locate(target, Where(getattr(args, "name", None), target), _session(args))
    print(f"mvsink: table {target} is at {location}", file=sys.stderr)
    return location


def _session_if_needed(target: str, options: dict[str, str], args: argparse.Namespace) -> None:
    """Start the command's Spark session (job file's [spark], then --conf) when only the JVM
    Delta can commit to ``target`` (the ``delta-spark`` engine needs a session with Delta)."""
    from mvsink.table.delta import delta_rs_refusal

    refusal = delta_rs_refusal(target, options)
    if refusal is not None:
        _progress(f"starting Spark with Delta: the installed deltalake cannot commit to {target} ({refusal})")
        _session(args)


def _target(args: argparse.Namespace) -> tuple[str, str | None, dict[str, str], int]:
    """Target, view name, storage options and the small-file threshold (a quarter of the
    sink's ``max_rows_per_file``) from the arguments, a job file filling in what they omit."""
    options = _pairs(args.storage_option, "--storage-option")
    if args.job:
        from mvsink.cli.job import JobConfig

        sink = JobConfig.load(args.job).sink
        target, name = args.target or sink.target, args.name or sink.name
        options, small = {**sink.storage_options, **options}, sink.max_rows_per_file // 4
    elif not args.target:
        raise ConfigError("give the target table (or --job with a job file)")
    else:
        from mvsink.config import SinkOptions

        target, name = args.target, args.name
        small = int(SinkOptions.model_fields["max_rows_per_file"].default) // 4
    return _located(target, args), name, options, small


def _verify(args: argparse.Namespace) -> int:
    import tempfile

    from mvsink.ops.verify import desired_of_job, verify

    if bool(args.sql) == bool(args.job):
        raise ConfigError("give desired as exactly one of --sql QUERY or --job JOB.toml")
    target, name, options, _ = _target(args)
    _progress(f"verifying {target} ...")
    spark = _session(args)
    with tempfile.TemporaryDirectory(prefix="mvsink-verify-") as scratch:
        if args.sql:
            desired, position = spark.sql(args.sql), None
        else:
            from mvsink.cli.job import JobConfig

            desired, position = desired_of_job(spark, JobConfig.load(args.job), scratch)
        result = verify(desired, target, name, options, position=position)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True, default=str) if args.json else result)
    return 0 if result.ok else 1


def _no_frontier(target: str, name: str) -> str:
    """Why view ``name`` has no frontier at ``target``: no table there (an error), or the
    table's log holds no commit of that view (naming the views it holds)."""
    from mvsink.ops.status import status

    found = status(target, None, {}, history=200)
    if found.table_version is None:
        from mvsink.ops.status import describe_missing_table

        raise ConfigError(describe_missing_table(target, {}))
    others = sorted(v.view for v in found.views)
    held = f"views with a frontier there: {', '.join(others)}" if others else "it holds no mvsink view"
    return f"view {name!r} has never committed to {target} ({held})"


def _run(args: argparse.Namespace) -> int:
    """``mvsink run``: the job's own modules are imported and checked before Spark starts
    (``job.importable``); Ctrl-C stops the query after the epoch in flight (``runner``)."""
    from mvsink.cli.job import JobConfig, importable
    from mvsink.cli.runner import Interrupted, run_job

    _logging(args.verbose)
    config = JobConfig.load(args.config)
    overrides = _job_args(args.arg)
    if args.epochs is not None or overrides:
        job = config.job.model_copy(
            update={
                **({"epochs": args.epochs} if args.epochs is not None else {}),
                **({"args": {**config.job.args, **overrides}} if overrides else {}),
            }
        )
        config = config.model_copy(update={"job": job})
    importable(config.job, args.config)
    try:
        run_job(config, stop=threading.Event(), explicit=_pairs(args.conf, "--conf"))
    except Interrupted as stopped:
        print(f"mvsink: {stopped}", file=sys.stderr)
        return INTERRUPTED
    if args.config is None:
        command = sys.argv[0] if os.path.basename(sys.argv[0]) == "mvsink" else "mvsink"
        print(
            _DEMO_NEXT.format(
                mvsink=os.path.relpath(command) if os.sep in command else command, target=config.sink.target
            )
        )
    return 0


_DEMO_NEXT = """
Next: check the view against its query run again over the order files, and read its state
from the Delta log alone:
  {mvsink} verify --job conf/demo.toml
  {mvsink} status {target}
then write your own job file (conf/*.toml) or call MVSink from your query (README.md)."""


def _job_args(values: Sequence[str]) -> dict[str, Any]:
    """``--arg KEY=VALUE`` pairs, each VALUE read as a TOML value (``9092``, ``true``,
    ``"a b"``) or, when it is not one (or one a job's args cannot hold), as the string it is."""
    import tomllib

    parsed: dict[str, Any] = {}
    for key, value in _pairs(values, "--arg").items():
        try:
            read = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            read = value
        # What [job] args can hold (numbers, booleans, strings); a date or nan stays as typed.
        usable = isinstance(read, bool | int | str) or (isinstance(read, float) and math.isfinite(read))
        parsed[key] = read if usable else value
    return parsed


def _logging(verbose: bool) -> None:
    """What ``mvsink run`` logs: mvsink's progress on long steps (INFO) and warnings; with
    ``-v`` every sink step (DEBUG). Spark's Python bridge (py4j) logs warnings only."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mvsink").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # the runner prints each epoch's report; the sink's log line would repeat it
        logging.getLogger("mvsink.sink").setLevel(logging.WARNING)
    logging.getLogger("mvsink.metrics").setLevel(logging.WARNING)  # the JSON record: for pipelines
    logging.getLogger("py4j").setLevel(logging.WARNING)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "frontier": _frontier,
    "promote": _promote,
    "status": _status,
    "verify": _verify,
    "vacuum": _vacuum,
    "compact": _compact,
    "history": _history,
}
"""Each command's function: its exit code (0 done; 1 verify's "different", frontier's "none";
errors are the caller's, 2)."""
