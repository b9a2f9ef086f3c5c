"""Run a ``JobConfig``: start the streaming query into an ``MVSink`` and stop after N epochs."""

from __future__ import annotations

import decimal
import logging
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from mvsink.cli.job import JobConfig
from mvsink.cli.session import local_session
from mvsink.compat import to_arrow
from mvsink.errors import MVSinkError, first_line
from mvsink.ops.history import as_of
from mvsink.report import EpochReport
from mvsink.sink import MVSink
from mvsink.table import delta

SHOWN_ROWS = 12
"""Rows of the view printed after each epoch (``show = true``): a sample, never the whole view."""


def show_table(
    table: pa.Table, title: str, limit: int = SHOWN_ROWS, total: int | None = None, *, ordered: bool = False
) -> str:
    """A small text rendering of a view, rows sorted (``ordered``: in the table's order), at most
    ``limit`` of them (of ``total``)."""
    cols = table.column_names
    rows = [tuple(r[c] for c in cols) for r in table.slice(0, limit).to_pylist()]
    if not ordered:
        rows.sort(key=repr)
    more = (table.num_rows if total is None else total) - len(rows)
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    tail = [f"  ... and {more} more rows"] if more > 0 else []
    return "\n".join([title, "  " + line, *("  " + b for b in body), *tail])


def _fmt(v: Any) -> str:
    if isinstance(v, decimal.Decimal):
        return f"{v:.2f}"
    return "NULL" if v is None else str(v)


def _show(sink: MVSink, epoch: int) -> None:
    """Print a sample of the view, read through the sink's store. The epoch is committed: a
    view that cannot be shown is a note, never a failure."""
    title = f"\n== view {sink.name} after epoch {epoch}"
    try:
        sample, total = delta.read_sample(sink.target, sink.options.storage_options, SHOWN_ROWS)
    except Exception as exc:
        print(f"{title}: not shown ({type(exc).__name__}: {first_line(exc)})")
        return
    print(show_table(sample, title, total=total))


class Interrupted(Exception):
    """Ctrl-C stopped the job; the message says where the view stands."""


def run_job(
    config: JobConfig, stop: threading.Event, explicit: Mapping[str, str] | None = None
) -> list[EpochReport]:
    """Run the job until ``config.job.epochs`` epochs ran, ``stop`` is set, or it fails (the
    sink's ``MVSinkError``, as raised, when the sink failed the batch).

    Ctrl-C (SIGINT) stops the query once the epoch in flight is over, however it ends: its
    commit landed or not, the log says which, so the next run knows where the view stands. The
    session's JVM (with Spark's Python workers) runs in a process group of its own, so a
    terminal's Ctrl-C reaches this process only, whose handler (``_Interrupts``, while the
    query runs) lets the epoch finish. A second Ctrl-C cancels the epoch's Spark jobs: it is
    abandoned, as a crash could abandon it (its staged files are the next sweep's, I4). Either
    way ``Interrupted`` says where the view stands.

    ``explicit`` Spark settings win over the launcher's (spark-submit), which win over the job
    file's ``[spark]`` (``cli.session``)."""
    spark_conf = dict(config.spark)
    master = spark_conf.pop("spark.master", "local[2]")
    spark = local_session(
        "mvsink-job", master=master, conf=spark_conf, explicit=explicit, own_process_group=True
    )
    job = config.job
    sink = MVSink.from_options(config.sink)
    job.feed_once(spark)  # the first epoch's input
    query_df: DataFrame = job.query_of(spark)
    reports: list[EpochReport] = []
    failed: list[MVSinkError] = []
    in_flight = threading.Event()

    def each_batch(batch: DataFrame, epoch: int) -> None:
        in_flight.set()
        try:
            report = sink(batch, epoch)
        except MVSinkError as exc:
            failed.append(exc)
            raise
        finally:
            in_flight.clear()
        reports.append(report)
        if job.show:
            _show(sink, epoch)
        print(f"   {report}", flush=True)
        if job.tamper_after_epoch is not None and len(reports) == job.tamper_after_epoch + 1:
            _tamper(sink, epoch)
        if job.epochs is not None and len(reports) >= job.epochs:
            stop.set()
        else:
            job.feed_once(spark)  # the next epoch's input

    logging.getLogger("py4j.clientserver").addFilter(_not_mvsink_errors)
    query = (
        query_df.writeStream.outputMode(job.output_mode)
        .foreachBatch(each_batch)
        .option("checkpointLocation", job.checkpoint)
        .trigger(processingTime=f"{job.trigger_seconds} seconds")
        .start()
    )
    interrupts = _Interrupts(stop, spark)
    try:
        with interrupts:
            while query.isActive and not stop.wait(0.2):
                pass
            if interrupts.count:
                while in_flight.is_set():  # the epoch in flight ends (or a second Ctrl-C ends it)
                    time.sleep(0.1)
                # The query may have started its next batch meanwhile; stopping interrupts it,
                # and Spark logs each interrupted step (a broadcast, a task) as an ERROR: noise
                # after a Ctrl-C, whose one line says where the view stands.
                spark.sparkContext.setLogLevel("OFF")
                query.stop()
                raise Interrupted(_stands(sink, reports))
        if query.exception() is not None:
            if failed:  # the sink's own error says what happened and what to do
                raise failed[-1] from None
            raise query.exception()  # type: ignore[misc]
    finally:
        query.stop()
    if job.show and sink.options.history_target is not None and reports:
        _show_history(spark, sink, reports)
    return reports


def _show_history(spark: Any, sink: MVSink, reports: list[EpochReport]) -> None:
    """After the run, what the view's history keeps (``history_target``): the view as of its
    second epoch (``mvsink.as_of``), and the lifetimes foreign writes and their repair touched.
    A history that cannot be shown is a note, never a failure."""
    first = reports[min(1, len(reports) - 1)].epoch
    history = sink.options.history_target
    assert history is not None
    try:
        then = to_arrow(
            as_of(spark, sink.target, sink.name, first, storage_options=sink.options.storage_options)
        )
        print(show_table(then, f"\nthe view as of epoch {first}, from its history (mvsink.as_of)"))
        kept = delta.read_table(history, sink.options.storage_options)
        touched = kept.filter(
            pc.or_kleene(
                pc.is_in(kept["opened_by"], pa.array(["foreign", "repair"])),
                pc.is_in(kept["closed_by"], pa.array(["foreign", "repair"])),
            )
        )
        print(
            show_table(touched, f"lifetimes foreign writes and their repair opened or closed, in {history}")
        )
    except Exception as exc:  # a note, as _show's
        print(f"the view's history: not shown ({type(exc).__name__}: {first_line(exc)})")


class _Interrupts:
    """Ctrl-C while a job's query runs: the first sets ``stop`` (the runner lets the epoch in
    flight finish, then stops the query); a second cancels the session's Spark jobs, which
    abandons the epoch. PySpark's own handler, which cancels every job at the first, is put
    back on exit. Outside the main thread (where Python takes no signal) it does nothing."""

    def __init__(self, stop: threading.Event, spark: Any) -> None:
        self.stop, self.spark, self.count = stop, spark, 0
        self.previous: Any = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *_: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _on_interrupt(self, _signum: int, _frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            print(
                "mvsink: stopping after the epoch in flight (Ctrl-C again to abandon it) ...", file=sys.stderr
            )
            self.stop.set()
        elif self.count == 2:
            print("mvsink: abandoning the epoch in flight ...", file=sys.stderr)
            self.spark.sparkContext.cancelAllJobs()


def _stands(sink: MVSink, reports: list[EpochReport]) -> str:
    """One line: where the stopped job leaves its view, read from the Delta log."""
    ran = f"{len(reports)} epoch(s) ran"
    try:
        upper = delta.read_frontier(sink.target, sink.options.app_id, sink.options.storage_options)
    except Exception as exc:
        return f"stopped ({ran}); the view's frontier could not be read: {first_line(exc)}"
    if upper is None:
        return f"stopped ({ran}); view {sink.name} has not committed to {sink.target} yet"
    return (
        f"stopped ({ran}); view {sink.name} in {sink.target} is at frontier {upper}: "
        "the next run goes on from there"
    )


def _not_mvsink_errors(record: logging.LogRecord) -> bool:
    """py4j logs the whole trace of an error the batch function raised; an ``MVSinkError``
    says what happened itself, and the runner prints it last."""
    return not (record.exc_info and isinstance(record.exc_info[1], MVSinkError))


def _foreign_append(target: str, rows: list[dict[str, Any]]) -> None:
    """Append rows as another writer would (delta-rs through the shim, no mvsink records)."""
    schema = pa.schema(delta.open_table(target).schema().to_arrow())
    delta.write_rows(target, pa.Table.from_pylist(rows, schema=schema))


def _foreign_delete(target: str, predicate: str) -> None:
    """Delete rows as another writer would, with delta-rs's SQL-like predicate."""
    delta.open_table(target).delete(predicate)


def _tamper(sink: MVSink, epoch: int) -> None:
    """Disturb the view as a stray writer would: a rogue row in, a real row out."""
    table = delta.read_table(sink.target)
    victim = sorted(table.column(table.column_names[0]).to_pylist(), key=repr)[0]
    rogue: dict[str, Any] = {name: None for name in table.column_names}
    rogue[table.column_names[0]] = "rogue"
    _foreign_append(sink.target, [rogue])
    _foreign_delete(sink.target, f"{table.column_names[0]} = '{victim}'")
    print(
        show_table(
            delta.read_table(sink.target),
            f"\n!! tampered after epoch {epoch}: inserted a rogue row, deleted {victim!r}",
        )
    )
    print("   the next epoch must repair this")
