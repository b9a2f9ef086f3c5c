"""Reading and operating a view's history (``history_target``): the view as it was (``as_of``),
the lifetimes of some of its rows (``lifetimes``, the ``mvsink history`` command), what it
holds (``history_status``, in ``mvsink status``), whether its open lifetimes are the view
(``check_history``, in ``mvsink verify``), and its compaction and retention
(``compact_history``, in ``mvsink compact`` and the sink's ``compact_every``).

The view at time ``t`` is the history's rows with ``valid_from <= t AND (valid_to IS NULL OR
valid_to > t)``, less the lifetime columns; at version ``v`` of the view's table, with
``opened_version <= v AND (closed_version IS NULL OR closed_version > v)``. ``as_of`` adds only
what plain SQL cannot see: it refuses a time or version the history does not hold yet (the
view's next version is committed and its history's not yet: H3) or no longer knows (before it
began), and finds the version an epoch committed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from mvsink.compat import to_arrow
from mvsink.config import Cadence, RetryPolicy
from mvsink.errors import ConfigError, HistoryBehindError, Where
from mvsink.history.keep import History
from mvsink.history.lifetimes import (
    CLOSED_EPOCH,
    CLOSED_VERSION,
    COLUMNS,
    OPENED_EPOCH,
    OPENED_VERSION,
    VALID_FROM,
    VALID_TO,
    view_struct,
)
from mvsink.plan.distributed import with_fingerprints
from mvsink.table import record
from mvsink.table.catalog import locate
from mvsink.table.delta import load_snapshot, open_existing, open_table
from mvsink.table.fingerprint import FP_A, FP_B
from mvsink.table.layout import Layout
from mvsink.table.log import commit_info
from mvsink.table.record import EPOCH, HISTORY, VIEW, HistoryKeys, metadata_int
from mvsink.table.schema import arrow_schema, target_struct
from mvsink.table.storage import Store
from mvsink.table.tasks import file_frame, in_task, raise_task_errors, task_files
from mvsink.table.uris import table_root

HISTORY_ROWS_PER_FILE = 1_000_000
"""Closed lifetimes a file of a compacted history holds at most."""
HISTORY_MAX_ROWS = 5_000_000
"""Closed lifetimes one compaction of a history reads at most (on the driver); run it again for
more."""
MOVES = 3
"""Reads ``as_of`` makes again when the history's compaction moves what it knows meanwhile."""
LOOK_BACK = 1000
"""The most commits of the view's table read to find where its history is kept, or past the
last version its history holds."""


@dataclass(frozen=True)
class Held:
    """What a history table holds: view versions ``since .. frontier - 1``."""

    root: str
    options: Mapping[str, str]
    frontier: int
    since: int
    """The first version it holds (0, or the version it began at on a table holding rows)."""
    began_ms: int | None
    next_ms: int | None
    """The time of the view's version ``frontier``, if it is committed already."""
    pending: tuple[int, ...]
    """The epochs of the view's versions it does not hold yet."""


def find(
    spark: object,
    target: str,
    name: str,
    *,
    history_target: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Held:
    """Where view ``name`` (its table at ``target``, a path or a table name) keeps its history,
    and what that holds."""
    options = dict(storage_options or {})
    where = Where(name, target)
    view_store = Store(table_root(locate(target, where, spark)), options)
    root = _root(history_target, view_store, name, where, spark)
    keys = HistoryKeys(name)
    history = open_existing(root, options)
    frontier = None if history is None else history.transaction_version(keys.frontier)
    if history is None or frontier is None:
        raise ConfigError(f"{root} holds no history of view {name!r}", where)
    # Read after the history's frontier: a version the view commits meanwhile is seen.
    pending: list[int] = []
    next_ms: int | None = None
    for version in range(frontier, frontier + LOOK_BACK):
        info = commit_info(view_store, version)
        if info is None:
            break
        if version == frontier:
            next_ms = metadata_int(info.get("inCommitTimestamp")) or metadata_int(info.get("timestamp"))
        epoch = metadata_int(info.get(EPOCH)) if info.get(VIEW) == name else None
        if epoch is not None:
            pending.append(epoch)
    since = history.transaction_version(keys.since)
    began = history.transaction_version(keys.began)
    return Held(
        root,
        options,
        int(frontier),
        0 if since is None else int(since) - 1,
        None if began is None else int(began),
        next_ms,
        tuple(pending),
    )


def recorded(view_store: Store, name: str) -> str | None:
    """Where the view keeps its history, as its newest epoch's commit (of the table's last
    ``LOOK_BACK`` commits) says (``record.HISTORY``); None: it keeps none."""
    table = open_existing(view_store.root, view_store.options)
    newest = table.version() if table is not None else -1
    for version in range(newest, max(newest - LOOK_BACK, -1), -1):
        info = commit_info(view_store, version)
        if info is not None and info.get(VIEW) == name and info.get(EPOCH) is not None:
            return str(info[HISTORY]) if info.get(HISTORY) else None
    return None


def _root(
    history_target: str | None, view_store: Store, name: str, where: Where, spark: object = None
) -> str:
    """The history's root: ``history_target`` (a path, or a table name looked up in the
    catalog), else where the view's commits say."""
    if history_target is not None:
        return table_root(locate(history_target, where, spark, "history_target"))
    return table_root(_recorded(view_store, name, where))


def _recorded(view_store: Store, name: str, where: Where) -> str:
    found = recorded(view_store, name)
    if found is not None:
        return found
    raise ConfigError(
        f"the newest epoch of view {name!r} (of the table's last {LOOK_BACK} commits) keeps no "
        "history: give history_target (the sink's option) to read one it kept",
        where,
    )


def as_of(
    spark: object,
    target: str,
    name: str,
    when: dt.datetime | str | int | None = None,
    *,
    version: int | None = None,
    history_target: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """View ``name`` (its table at ``target``) as it was: at time ``when`` (a datetime, naive
    meaning UTC, or an ISO 8601 string), after epoch ``when`` (an int: the last version of its
    table an epoch of that number committed, or of an earlier epoch of the same query when that
    one changed no row), or at ``version`` of its table. A DataFrame of the view's columns,
    read from its history (``history_target``: where; default, where the view's commits say)
    by Spark tasks through mvsink's own reader: no Delta jars needed in the session."""
    where = Where(name, target)
    for _ in range(MOVES):
        try:
            return _as_of(spark, target, name, when, version, history_target, storage_options, where)
        except _Moved:
            continue  # a compaction of the history moved what it knows while this read: again
    raise HistoryBehindError(
        f"the history's compaction moved what it knows {MOVES} times while this read: try again", where
    )


class _Moved(Exception):
    """What the history knows whole (``#since``, ``#began``) moved between ``find`` and the
    snapshot a read lists its files from (a compaction's retention landed in between): the
    read starts again (``MOVES`` times at most)."""


def _as_of(
    spark: object,
    target: str,
    name: str,
    when: dt.datetime | str | int | None,
    version: int | None,
    history_target: str | None,
    storage_options: Mapping[str, str] | None,
    where: Where,
) -> DataFrame:
    if (when is None) == (version is None):
        raise ConfigError("as_of takes a time or an epoch (when), or a version, and only one", where)
    if isinstance(when, bool) or not (when is None or isinstance(when, int | str | dt.datetime)):
        raise ConfigError(
            f"as_of: when is a datetime, an ISO 8601 string or an epoch number, not {when!r}", where
        )
    micros = None if when is None or isinstance(when, int) else _micros(when, where)
    held = find(spark, target, name, history_target=history_target, storage_options=storage_options)
    if isinstance(when, int) and not isinstance(when, bool):
        late = [e for e in held.pending if e <= when]
        if late:
            raise HistoryBehindError(
                f"epoch {late[0]} committed version(s) of the view's table past {held.frontier - 1}, "
                "the last its history holds (the next epoch completes it)",
                where,
            )
        version = _epoch_version(spark, held, when, where)
    if version is not None:
        if version < held.since:
            raise HistoryBehindError(
                f"the history knows the view's table from version {held.since}, after {version} (it "
                "began there, or its history_retention dropped what came before): it does not "
                "know what the view held then",
                where,
            )
        if version >= held.frontier:
            raise HistoryBehindError(
                f"the history holds the view's versions up to {held.frontier - 1}, not {version} "
                "(yet: the next epoch completes it)",
                where,
            )
        return _read(spark, held, _Held(OPENED_VERSION, CLOSED_VERSION, version), where)
    assert micros is not None
    if held.began_ms is not None and micros < held.began_ms * 1000:
        raise HistoryBehindError(
            f"the history knows the view from {_show(held.began_ms * 1000)}, after {_show(micros)} "
            "(it began then, or its history_retention dropped what came before): it does not "
            "know what the view held then",
            where,
        )
    if held.next_ms is not None and micros >= held.next_ms * 1000:
        raise HistoryBehindError(
            f"version {held.frontier} of the view's table, committed at {_show(held.next_ms * 1000)}, "
            "is not in its history yet (the next epoch completes it)",
            where,
        )
    return _read(spark, held, _Held(VALID_FROM, VALID_TO, micros), where)


@dataclass(frozen=True)
class _Held:
    """The lifetimes that hold ``at`` between columns ``start`` (inclusive) and ``end``
    (exclusive; null: still open): ``start <= at AND (end IS NULL OR end > at)``."""

    start: str
    end: str
    at: int

    def mask(self, rows: pa.Table) -> pa.Array:
        start, end = (rows.column(c) for c in (self.start, self.end))
        if pa.types.is_timestamp(start.type):
            start, end = start.cast(pa.int64()), end.cast(pa.int64())
        at = pa.scalar(self.at, pa.int64())
        return pc.and_kleene(pc.less_equal(start, at), pc.or_kleene(pc.is_null(end), pc.greater(end, at)))


@dataclass(frozen=True)
class _Reader:
    """Runs in a Spark task: each history file's rows that ``held`` picks, the view's columns
    (or, with no ``held``, the distinct (version, epoch) pairs its lifetimes record)."""

    store: Store
    schema: pa.Schema
    held: _Held | None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        view = [n for n in self.schema.names if n not in COLUMNS]
        for _, file in task_files(batches):
            with in_task(f"reading {file.path}"):
                rows = self.store.read(file, self.schema, ())
            if self.held is not None:
                yield from rows.filter(self.held.mask(rows)).select(view).to_batches()
                continue
            pairs = pa.concat_tables(
                [
                    pa.table({"v": rows.column(v), "e": rows.column(e)})
                    for v, e in ((OPENED_VERSION, OPENED_EPOCH), (CLOSED_VERSION, CLOSED_EPOCH))
                ]
            )
            pairs = pairs.filter(pc.is_valid(pairs.column("e"))).group_by(["v", "e"]).aggregate([])
            yield from pairs.to_batches()


def _read(
    spark: object, held: Held, pick: _Held | None, where: Where, *, open_only: bool = False
) -> DataFrame:
    """The history's rows that ``pick`` holds (see ``_Reader``), read by Spark tasks from its
    latest snapshot, which must know what ``held`` says it knows (else ``_Moved``: the checks
    made against ``held`` would not hold of the files read)."""
    keys = HistoryKeys(where.view or "")
    snap = load_snapshot(held.root, keys.frontier, held.options, where, writing=False)
    since, began = snap.transaction(keys.since), snap.transaction(keys.began)
    if (0 if since is None else since - 1, began) != (held.since, held.began_ms):
        raise _Moved()
    assert snap.schema_json is not None
    struct = target_struct(snap.schema_json)
    schema = arrow_schema(struct)
    if pick is None:
        out = StructType([StructField("v", LongType()), StructField("e", LongType())])
    else:
        out = view_struct(struct)
    # mvsink writes closed lifetimes only to ``c-`` files (``history/keep.py``); any other file
    # may hold open ones (a mirror of a view file, or something another writer put there).
    files = [f for f in snap.files if not (open_only and f.key.rpartition("/")[2].startswith("c-"))]
    frame: DataFrame = file_frame(spark, files).mapInArrow(
        _Reader(Store(snap.root, held.options), schema, pick), out
    )
    return frame


def _epoch_version(spark: object, held: Held, epoch: int, where: Where) -> int:
    """The version of the view's table that epoch ``epoch`` of its newest query committed, or
    the newest before it (that epoch changed no row). Epochs count again from a new checkpoint:
    the newest run of epochs that only grew is the newest query's."""
    try:
        found_pairs = to_arrow(_read(spark, held, None, where).distinct())
    except Exception as exc:
        raise_task_errors(exc, where)
        raise
    seen = sorted(zip(found_pairs.column("v").to_pylist(), found_pairs.column("e").to_pylist(), strict=True))
    run: list[tuple[int, int]] = []
    for v, e in seen:
        if run and e < run[-1][1]:
            run = []
        run.append((v, e))
    found = [v for v, e in run if e <= epoch]
    if not found:
        raise HistoryBehindError(
            f"no version of the view's table in its history was committed by epoch {epoch} or an "
            "earlier epoch of the view's newest query: ask for a time or a version",
            where,
        )
    return max(found)


def lifetimes(
    target: str,
    name: str,
    equal: Mapping[str, str],
    *,
    history_target: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The lifetimes of view ``name``'s rows whose columns ``equal`` the values given (as text,
    cast to each column's type: a key, or a whole row), oldest first: the ``mvsink history``
    command. Read with delta-rs, on this machine (no Spark: give a key, not a scan)."""
    where = Where(name, target)
    held = find(None, target, name, history_target=history_target, storage_options=storage_options)
    dataset = open_table(held.root, held.options).to_pyarrow_dataset()
    test = None
    for column, text in equal.items():
        if column not in dataset.schema.names or column in COLUMNS:
            raise ConfigError(
                f"the view has no column {column!r} (it has {view_columns(dataset.schema)})", where
            )
        try:
            value = pa.scalar(text).cast(dataset.schema.field(column).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(f"{column}={text!r}: not a value of the column's type ({exc})", where) from None
        one = pc.field(column) == value
        test = one if test is None else test & one
    found = dataset.to_table(filter=test)
    ordered: pa.Table = found.sort_by([(VALID_FROM, "ascending"), (OPENED_VERSION, "ascending")])
    return ordered


def view_columns(schema: pa.Schema) -> list[str]:
    return [n for n in schema.names if n not in COLUMNS]


def _micros(when: dt.datetime | str, where: Where) -> int:
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when)
        except ValueError:
            raise ConfigError(f"as_of: {when!r} is no ISO 8601 time", where) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _show(micros: int) -> str:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)).isoformat()


# --- operating it -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryStatus:
    """What a view's history holds (``mvsink status``), read from its log alone."""

    root: str
    holds_to: int
    """The last version of the view's table it holds."""
    known_from: int
    """The first version it knows whole (0, or where it began, or past what its retention
    dropped)."""
    open_lifetimes: int
    """Rows the view holds at ``holds_to``, as lifetimes."""
    closed_lifetimes: int
    files: int
    bytes: int
    oldest: str | None
    """The earliest ``valid_from`` it holds (ISO 8601, UTC); None: it holds no lifetime."""
    known_since: str | None
    """The earliest time it knows the view at (where it began, or past what its retention
    dropped); None: since the view's first version."""


def history_status(root: str, name: str, storage_options: Mapping[str, str]) -> HistoryStatus | None:
    """What the history of view ``name`` at ``root`` holds, by its log and its files' row counts
    and statistics (no file is read); None when there is no history there."""
    table = open_existing(root, storage_options)
    keys = HistoryKeys(name)
    frontier = None if table is None else table.transaction_version(keys.frontier)
    if table is None or frontier is None:
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    names = [p.rpartition("/")[2] for p in actions.column("path").to_pylist()]
    counts = [int(n or 0) for n in actions.column("num_records").to_pylist()]
    since, began = table.transaction_version(keys.since), table.transaction_version(keys.began)
    oldest = None
    if f"min.{VALID_FROM}" in actions.column_names and actions.num_rows:
        low = pc.min(actions.column(f"min.{VALID_FROM}")).as_py()
        oldest = None if low is None else low.astimezone(dt.UTC).isoformat()
    return HistoryStatus(
        root=root,
        holds_to=int(frontier) - 1,
        known_from=0 if since is None else int(since) - 1,
        open_lifetimes=sum(c for n, c in zip(names, counts, strict=True) if n.startswith("o-")),
        closed_lifetimes=sum(c for n, c in zip(names, counts, strict=True) if not n.startswith("o-")),
        files=actions.num_rows,
        bytes=int(pc.sum(actions.column("size_bytes")).as_py() or 0),
        oldest=oldest,
        known_since=None if began is None else _show(int(began) * 1000),
    )


@dataclass(frozen=True)
class HistoryCheck:
    """Whether a view's history's open lifetimes are the view's rows (``mvsink verify``)."""

    root: str
    holds_to: int
    table_version: int
    open_lifetimes: int | None
    """None: not compared (the history does not hold the table's version yet)."""
    missing: int = 0
    """Rows the view holds more often than its open lifetimes say."""
    extra: int = 0
    """Open lifetimes of rows the view does not hold (as often)."""

    @property
    def equal(self) -> bool:
        """Compared and equal; a history behind the table is not a difference (its next epoch
        completes it: H3)."""
        return self.missing == 0 and self.extra == 0

    def __str__(self) -> str:
        head = f"  history {self.root}"
        if self.open_lifetimes is None:
            return (
                f"{head}: holds versions up to {self.holds_to}, {self.table_version - self.holds_to} "
                "behind the table (the view's next epoch completes it); not compared"
            )
        if self.equal:
            return f"{head}: its {self.open_lifetimes:,} open lifetimes are the view's rows"
        return (
            f"{head}: its open lifetimes differ from the view: {self.missing:,} row(s) of the view "
            f"without one, {self.extra:,} open for rows the view does not hold"
        )


def check_history(
    spark: object,
    target: str,
    name: str,
    table_version: int,
    view_rows: DataFrame | None,
    layout: Layout,
    storage_options: Mapping[str, str],
) -> HistoryCheck | None:
    """Compare view ``name``'s history's open lifetimes with ``view_rows`` (the table's rows at
    ``table_version``, with fingerprints: ``distributed.stored_rows``; None: it holds none) as
    multisets, in one Spark aggregation; None when the view keeps no history."""
    root = recorded(Store(table_root(target), dict(storage_options)), name)
    if root is None:
        return None
    try:
        held = find(spark, target, name, history_target=root, storage_options=storage_options)
    except ConfigError:  # named by the view's commit, not made yet (its next epoch makes it)
        return HistoryCheck(root, -1, table_version, None)
    last = held.frontier - 1
    if last != table_version:
        return HistoryCheck(held.root, last, table_version, None)
    where = Where(name, target)
    for _ in range(MOVES):
        try:
            lifetimes = _read(spark, held, _Held(OPENED_VERSION, CLOSED_VERSION, last), where, open_only=True)
            break
        except _Moved:  # a compaction of the history landed meanwhile: what it holds is unchanged
            held = find(spark, target, name, history_target=root, storage_options=storage_options)
    else:
        return HistoryCheck(held.root, last, table_version, None)
    fp = [FP_A, FP_B]
    counts = (
        with_fingerprints(lifetimes, layout)
        .groupBy(*fp)
        .agg(F.count(F.lit(1)).alias("h"))
        .withColumn("t", F.lit(0))
    )
    if view_rows is not None:
        held_rows = view_rows.groupBy(*fp).agg(F.count(F.lit(1)).alias("t")).withColumn("h", F.lit(0))
        counts = counts.unionByName(held_rows).groupBy(*fp).agg(F.sum("h").alias("h"), F.sum("t").alias("t"))
    n = F.col("t") - F.col("h")
    totals = counts.agg(
        F.sum("h").alias("open"),
        F.sum(F.greatest(n, F.lit(0))).alias("missing"),
        F.sum(F.greatest(-n, F.lit(0))).alias("extra"),
    ).first()
    figures = {k: int(v or 0) for k, v in (totals.asDict() if totals else {}).items()}
    return HistoryCheck(
        held.root,
        last,
        table_version,
        figures.get("open", 0),
        figures.get("missing", 0),
        figures.get("extra", 0),
    )


@dataclass(frozen=True)
class HistoryCompaction:
    """What ``compact_history`` did: ``version`` None when there was nothing to do."""

    root: str
    version: int | None
    files_removed: int = 0
    files_added: int = 0
    dropped: int = 0
    """Closed lifetimes that ended before the retention's start, dropped."""

    def __str__(self) -> str:
        if self.version is None:
            return f"{self.root}: nothing to compact in the view's history"
        return (
            f"{self.root}: compacted {self.files_removed:,} file(s) of closed lifetimes into "
            f"{self.files_added:,}, dropped {self.dropped:,} past the retention, as version {self.version}"
        )


def compact_history(
    target: str,
    name: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    retention: str | None = None,
    history_target: str | None = None,
    rows_per_file: int = HISTORY_ROWS_PER_FILE,
    max_rows: int = HISTORY_MAX_ROWS,
    retry: Any = None,
    now_ms: int | None = None,
) -> HistoryCompaction:
    """Compact view ``name``'s history (``history/keep.History.tidy``): merge its small files
    of closed lifetimes, and drop those that ended more than ``retention`` (a duration, as
    ``90d``) before ``now_ms``; never an open lifetime. Its own strict commit."""
    options = dict(storage_options or {})
    where = Where(name, target)
    view_store = Store(table_root(locate(target, where)), options)
    root = _root(history_target, view_store, name, where)
    kept_from = None
    if retention is not None:
        try:
            seconds = Cadence.parse(retention).seconds
        except ValueError:
            seconds = None
        if not seconds:
            raise ConfigError(f"history_retention: expected a duration like '90d', got {retention!r}", where)
        kept_from = ((record.now_ms() if now_ms is None else now_ms) - int(seconds * 1000)) * 1000
    history = History(name, root, Store(root, options), retry or RetryPolicy(), where)
    done = history.tidy(kept_from_us=kept_from, rows_per_file=rows_per_file, max_rows=max_rows)
    if done is None:
        return HistoryCompaction(root, None)
    return HistoryCompaction(root, done.version, done.files_removed, done.files_added, done.dropped)
