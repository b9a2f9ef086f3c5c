"""The sink: keeps a Delta table equal to a streaming query's result, epoch by epoch.

``MVSink`` is a ``foreachBatch`` callable and the facade over the parts: it resolves a target
given as a table name (``table/catalog.py``), checks the store and Spark's workers once, splits
off rows that break the view's rules (``plan/quarantine.py``), runs the epoch
(``epoch/run.py``: its stages and the invariants they keep are stated in ``mvsink.epoch``),
then records metrics and compacts when due. It pickles as its options: what it keeps between
epochs (``epoch/run.SinkState``) is made where it runs.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from mvsink.compat import release
from mvsink.config import SinkOptions
from mvsink.epoch.query import Query, running_query
from mvsink.epoch.run import Epoch, SinkState
from mvsink.epoch.workers import check_workers
from mvsink.errors import CatalogUnavailable, ConfigError, InputError, Where
from mvsink.ops.promote import promote
from mvsink.options_doc import options_section, options_signature
from mvsink.plan.quarantine import Quarantine, check_expressions, errors_options
from mvsink.report import HELD, EpochReport
from mvsink.table.catalog import is_path, locate
from mvsink.table.delta import read_frontier
from mvsink.table.record import Keys
from mvsink.table.storage import Store
from mvsink.table.uris import table_root

log = logging.getLogger(__name__)
metrics = logging.getLogger("mvsink.metrics")
"""One JSON object per epoch (``EpochReport.to_json``): route it to a metrics pipeline."""


class MVSink:
    """Keep the Delta table at ``target`` equal to each micro-batch (``complete`` mode).

    Use as ``df.writeStream.foreachBatch(MVSink(target, name))``, or call it directly as
    ``sink(batch_df, epoch)`` from a batch job. Options are those of ``SinkOptions`` (listed
    below, from its fields).

    The sink pickles as its options alone (Spark Connect ships ``foreachBatch`` callables to a
    Python process next to the server): its runtime state (lock, index, reports) is created
    where it runs.
    """

    def __init__(self, target: str, name: str, **options: Any) -> None:
        """Validate ``target``, ``name`` and the options (``SinkOptions.build``): a wrong one is a
        ``ConfigError`` naming it."""
        self.options = SinkOptions.build(target=target, name=name, **options)
        self._read_only = self.options.read_only
        self._names: dict[str, str] = {}  # the table names options were given as, once resolved
        self._located_for: str | None = None  # the query run the name was last looked up for
        self._runtime()

    def _runtime(self) -> None:
        self.state = SinkState()
        """What the sink keeps between epochs (``epoch/run.py``), where it runs."""
        self._lock = threading.Lock()
        self._probed = False
        self._errors: Quarantine | None = None  # on_error = "table": the errors table's sink
        self.reports: deque[EpochReport] = deque(maxlen=1000)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "read_only": self._read_only, "names": self._names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._read_only = state["read_only"]
        self._names = dict(state.get("names") or {})
        self._runtime()

    @classmethod
    def from_options(cls, options: SinkOptions) -> MVSink:
        """A sink from an already validated ``SinkOptions`` (e.g. ``SinkOptions.from_toml``)."""
        return cls(**options.model_dump())

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def target(self) -> str:
        """The table's location (once a table name was resolved, its location)."""
        return self.options.target

    def _locate(self, spark: Any, run: str | None = None) -> None:
        """Resolve a target (and a ``history_target``) given as a table name to the Delta
        table's location, through ``spark``'s catalog (``catalog.py``): the options then hold
        the location. Looked up at the first epoch of each run of a query (``run``, the query's
        id), at every direct call and operation (``run`` None), and again after an epoch found
        no table there: not at every epoch, where Delta's ``DESCRIBE DETAIL`` costs a listing of
        the table. A table moved (``ALTER TABLE ... SET LOCATION``) is followed from then, with
        a WARNING: the catalog is the truth; the caches of the old folder's files (index,
        tombstones) go, and the new store is probed. A catalog that cannot answer keeps the
        location found before, with a WARNING, instead of stopping the query."""
        if self.state.look_up_again:
            self._located_for, self.state.look_up_again = None, False
        if run is not None and run == self._located_for:
            return
        found: dict[str, str] = {}
        names: dict[str, str] = {}
        for option in ("target", "history_target"):
            name = self._names.get(option) or getattr(self.options, option)
            if name is None or is_path(name):
                continue
            location = self._look_up(spark, option, name)
            if location is not None:
                found[option], names[option] = location, name
        # Only once every name resolved and the options hold together is anything kept.
        if found:
            self.options = SinkOptions.build(**{**self.options.model_dump(), **found})
        moved = "target" in found and "target" in self._names
        self._names.update(names)
        self._located_for = run
        if moved:
            self.state.forget_table()
            self._probed = False

    def _look_up(self, spark: Any, option: str, name: str) -> str | None:
        """The location of table ``name`` (given as ``option``) when it is new to the sink (its
        first look-up, or a move); None: where the options hold it already."""
        where = Where(self.name, self._names.get("target") or self.options.target)
        try:
            location = locate(name, where, spark, option)
        except CatalogUnavailable as exc:
            if option not in self._names:
                raise
            log.warning("%s: %s; writing %s, where the table was", where, exc, getattr(self.options, option))
            return None
        what = "table" if option == "target" else "history table"
        if option in self._names:
            if location == getattr(self.options, option):
                return None
            log.warning(
                "%s: %s %s moved from %s to %s: writing the new location",
                where,
                what,
                name,
                getattr(self.options, option),
                location,
            )
        log.info("%s: %s %s is at %s", where, what, name, location)
        return location

    def _locate_now(self) -> None:
        """``_locate`` outside an epoch: through the active Spark session."""
        self._locate(None)

    @property
    def store(self) -> Store:
        """The target's files, as the I/O layer reaches them."""
        return Store(table_root(self.target), dict(self.options.storage_options))

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    @property
    def read_only(self) -> bool:
        """True while the sink only computes and reports corrections (a standby replica)."""
        return self._read_only

    def promote(self) -> None:
        """Make this sink's ``writer`` the view's active writer, recorded in the target
        (``promote``), and start committing from the next epoch on. Every other writer of the
        view is fenced from then on. Needs the ``writer`` option (a name stable across
        restarts) and an existing table."""
        if self.options.writer is None:
            raise ConfigError(
                "promote() needs the 'writer' option: a name for this writer that stays the same "
                "across restarts",
                Where(self.name, self.target),
            )
        with self._lock:
            self._locate_now()
            promote(self.target, self.name, self.options.writer, self.options.storage_options)
            self._read_only = False

    def _with_errors_table(
        self, batch_df: DataFrame, epoch_id: int, query: Query | None, where: Where
    ) -> EpochReport:
        """Split the batch (``quarantine.py``): the rows that keep the rules to the view, then
        the error rows to the errors table. The view decides: the errors table is written only
        for an epoch the view committed or already holds (a replay: the errors table may have
        missed it in a crash), never for one the view refused (fenced, read-only, before
        ``as_of``), so it follows the view's lineage and active writer."""
        if self._errors is None:
            self._errors = Quarantine(MVSink.from_options(errors_options(self.options)))
        marked, ok, bad = self._errors.split(batch_df, self.options, where)
        try:
            view = self._epoch(ok, epoch_id, query)
            report = view.run()
            if view.entitled and report.outcome in HELD:
                try:
                    errors = self._errors.run(bad, epoch_id)
                except Exception as exc:
                    # Its message speaks for the errors table only: say what the view did.
                    done = (
                        f"the view committed this epoch as version {report.version}"
                        if report.outcome == "committed"
                        else f"the view needed no commit for this epoch ({report.outcome})"
                    )
                    exc.add_note(f"{done}; its errors table may be behind until the batch runs again")
                    raise
                if errors.outcome == "fenced":
                    log.warning(
                        "%s: the errors table %s is owned by another lineage or writer than the "
                        "view: its rows were not written",
                        where,
                        self._errors.sink.target,
                    )
            return report
        finally:
            release(marked)

    def _record_metrics(self, version: int, where: Where) -> None:
        """Append the view's committed epochs to the metrics table (``metrics.py``). The epoch
        is committed whatever happens here: a failure is a WARNING, and the next epoch's
        append fills the gap."""
        from mvsink.ops.metrics import record

        opts = self.options
        assert opts.metrics_table is not None
        try:
            record(opts.metrics_table, opts.name, opts.target, opts.storage_options, version)
        except Exception as exc:  # the epoch is committed: never fail it (or the query) now
            log.warning("%s: could not append to the metrics table (the epoch is committed): %s", where, exc)

    def _compact_due(self, report: EpochReport) -> bool:
        """``compact_every`` epochs passed since the last compaction, counted in frontiers:
        the table records the frontier each compaction ran at (``#compacted``)."""
        every = self.options.compact_every
        if not every or report.outcome != "committed" or report.upper is None:
            return False
        last = read_frontier(self.target, Keys(self.options.app_id).compacted, self.options.storage_options)
        # A new lineage restarts epoch numbers: a last mark above the frontier is another's.
        since = report.upper - (last if last is not None and last <= report.upper else 0)
        return since >= every

    def _compact(self, where: Where) -> None:
        """Merge small files after a committed epoch (``compact_every``), then compact the
        view's history (its ``history_retention``)."""
        from mvsink.ops.compact import compact
        from mvsink.ops.history import compact_history

        opts = self.options
        _after_epoch(
            "compaction",
            where,
            lambda: compact(
                opts.target,
                opts.name,
                opts.storage_options,
                max_rows_per_file=opts.max_rows_per_file,
                cluster_by=opts.cluster_by,
                retry=opts.retry,
                engine=opts.engine,
            ),
        )
        if opts.history_target is not None:
            _after_epoch(
                "the history's compaction",
                where,
                lambda: compact_history(
                    opts.target,
                    opts.name,
                    opts.storage_options,
                    retention=opts.history_retention,
                    history_target=opts.history_target,
                    retry=opts.retry,
                ),
            )

    def frontier(self) -> int | None:
        """The target's frontier for this view (None before the first commit)."""
        self._locate_now()
        return read_frontier(self.target, self.options.app_id, self.options.storage_options)

    def _epoch(self, desired: DataFrame, epoch: int, query: Query | None) -> Epoch:
        return Epoch(
            self.state,
            self.options,
            desired,
            epoch,
            store=self.store,
            read_only=self.read_only,
            named=self._names.get("target"),
            query=query,
        )

    def __call__(self, batch_df: DataFrame, epoch_id: int) -> EpochReport:
        """Run one epoch: make the target equal ``batch_df`` and record ``epoch_id + 1``."""
        where = Where(self.name, self.target, epoch_id if isinstance(epoch_id, int) else None)
        if isinstance(epoch_id, bool) or not isinstance(epoch_id, int) or epoch_id < 0:
            raise InputError(f"the epoch must be a non-negative int, got {epoch_id!r}", where)
        with self._lock:
            named = bool(self.options.lineage or self.options.checkpoint)
            query = running_query(batch_df, named, where)
            self._locate(batch_df.sparkSession, query.run if query else None)
            if not self._probed:
                where = Where(self.name, self.target, epoch_id)
                self.store.probe(where)
                check_workers(batch_df.sparkSession, where)
                self._probed = True
            if self.options.checks or self.options.not_null:
                check_expressions(batch_df, self.options, where)
            if self.options.on_error == "table":
                report = self._with_errors_table(batch_df, epoch_id, query, where)
            else:
                report = self._epoch(batch_df, epoch_id, query).run()
            if self.options.metrics_table and report.outcome == "committed" and report.version is not None:
                self._record_metrics(report.version, where)
            if self._compact_due(report):
                self._compact(where)
        self.reports.append(report)
        log.info("%s", report)
        metrics.info("%s", json.dumps(report.to_json(), sort_keys=True))
        return report


def _after_epoch(what: str, where: Where, step: Callable[[], object]) -> None:
    """Run ``step`` after a committed epoch and log what it did. The epoch is committed whatever
    happens here: a failure is a WARNING, never the epoch's error."""
    try:
        log.info("%s: %s", where, step())
    except Exception as exc:  # never fail the epoch (or the query) now
        log.warning("%s: %s after the epoch failed (the epoch is committed): %s", where, what, exc)


# help(MVSink), IDEs and inspect.signature(MVSink) show each option from SinkOptions' fields
# (``options_doc.py``); the constructor still takes them as ``**options``.
MVSink.__init__.__signature__ = options_signature()  # type: ignore[attr-defined]
MVSink.__doc__ = f"{inspect.cleandoc(MVSink.__doc__ or '')}\n\n{options_section()}"
