"""Upsert mode: each micro-batch carries the new rows of the keys that changed.

For a batch, per key:

1. Several rows for one key: with ``sequence_column`` the highest sequence wins (a tie at the
   top between rows that differ is ambiguous and an error); without it, rows that differ are a
   ``DuplicateKeyError``. Rows equal in every column (an event delivered twice, as
   at-least-once feeds do) count once. A null key or a null sequence is bad input. All of this
   is checked before anything is written.
2. The touched keys' winning rows go to the driver as Arrow (one Spark job); the snapshot's
   files are pruned to those whose partition values and key min/max statistics can hold one
   of them, and only those are read, through the I/O layer; their rows of touched keys are
   fingerprinted and decided with Arrow joins. Cost follows the touched keys, not the table.
   A first epoch on an empty target writes the winners from Spark tasks, never collected.
3. For each touched key the desired row is the batch's winner, unless the target already
   holds a newer sequence for the key (then the stored newest row stays), or the winner is a
   delete (then nothing). Whatever the target holds for the key (nothing, several rows, a
   stale value) becomes exactly that: one stored copy equal to it is kept, every other stored
   row of the key is retracted, and the winner is inserted if no copy was kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from mvsink.compat import KEEP, map_in_arrow, release
from mvsink.errors import DuplicateKeyError, InputError, Where
from mvsink.plan import tombstones
from mvsink.plan.context import EpochContext
from mvsink.plan.distributed import with_fingerprints
from mvsink.plan.late import ROWS_PER_FILE as LATE_ROWS_PER_FILE
from mvsink.plan.late import LateEvents
from mvsink.plan.prune import candidate_files, files_in_ranges
from mvsink.plan.rules import RULE, Rules, broken_error, checked, rules_for
from mvsink.plan.tombstones import Changes, Manifest, NewSet, Tombstones
from mvsink.table.delta import DataFile, Snapshot
from mvsink.table.fingerprint import FP_A, FP_B, I64, fingerprints, quote
from mvsink.table.layout import Layout
from mvsink.table.plan import Plan, Rewrite, Staged, TaskRewrites
from mvsink.table.record import now_ms
from mvsink.table.staging import IO_THREADS
from mvsink.table.storage import Store
from mvsink.table.tasks import file_frame, in_task, raise_task_errors, task_files

FILE = "__mvsink_file"
POS = "__mvsink_pos"
DEL = "__mvsink_delete"
_RN = "__mvsink_rn"
_RK = "__mvsink_rk"
_TIED = "__mvsink_tied"
_DIFFERS = "__mvsink_differs"
_ODD = "__mvsink_odd"
# Timestamps to the microsecond (JSON's default keeps milliseconds: rows a microsecond apart
# would look equal).
_EXACT_JSON = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}
_TI = "__mvsink_touched"
_SIDE = "__mvsink_side"
_KIND = "__mvsink_kind"
_RANGE = "__mvsink_range"
DECIDE_CHUNK_ROWS = 65_536
"""Rows a task of the distributed path decides at a time (``_Decider``)."""
KEY_RANGES = 256
"""Ranges the distributed path cuts touched keys into to prune files (``_key_ranges``)."""
_ADDRESS = StructType([StructField(n, LongType()) for n in (FILE, POS, FP_A, FP_B)])


@dataclass(frozen=True)
class _Marks:
    """Where a view's tombstones (``tombstones.py``) stand for one attempt."""

    manifest: Manifest | None
    """The current set's (None: the view holds none yet)."""
    schema: pa.Schema
    now: int
    """The attempt's time (ms): when the tombstones it makes are made."""
    since: int
    """Tombstones made before this (ms) are past the retention: they count for nothing."""
    table_retention: int | None
    """The table's ``deletedFileRetentionDuration`` (ms; None: not read as Delta does): how long
    sets that are not current are kept (``tombstones.sweep``)."""

    @property
    def held(self) -> int:
        return 0 if self.manifest is None else self.manifest.rows

    @property
    def expired(self) -> bool:
        """The current set holds a tombstone past the retention (the next set leaves it out)."""
        oldest = None if self.manifest is None else self.manifest.oldest
        return oldest is not None and oldest < self.since

    def live(self, rows: pa.Table) -> pa.Table:
        return rows.filter(pc.greater_equal(rows.column(tombstones.DELETED_AT), self.since))


@dataclass(frozen=True)
class UpsertSpec:
    key: tuple[str, ...]
    delete_column: str | None
    sequence_column: str | None


def prepare(batch: DataFrame, schema: StructType, spec: UpsertSpec, where: Where) -> DataFrame:
    """The batch ranked within each key, cached, and checked (rule 1 of the module doc).

    The pass that caches the batch asks, by key (a hash aggregate, no sort), whether any key
    comes more than once or any row has a null where it must not: most batches (an update-mode
    aggregation's, a feed's of distinct keys) have neither, and their rows are each their
    key's winner as they are. Only a batch that has either is ranked in its keys (a sort) and
    checked row by row (``_check``).

    The caller unpersists it when the epoch ends; retries of the epoch reuse it.
    """
    columns = [F.col(quote(c)) for c in schema.names]
    # A null marker is refused by _check; it is never read as "not deleted".
    deleted = F.col(quote(spec.delete_column)) if spec.delete_column else F.lit(False)
    plain = batch.select(*columns, deleted.alias(DEL), F.lit(1).alias(_RN), F.lit(False).alias(_DIFFERS))
    plain = plain.persist(KEEP)
    try:
        if _plain(plain, spec):
            return plain
        ranked = _ranked(plain, schema, spec).persist(KEEP)
    except BaseException:
        release(plain)
        raise
    try:
        _check(ranked, spec, where)  # (a whole pass when nothing is wrong: ranked is cached)
    except BaseException:
        release(ranked)
        raise
    finally:
        release(plain)
    return ranked


def _plain(rows: DataFrame, spec: UpsertSpec) -> bool:
    """Whether no key of ``rows`` comes more than once and no row has a null key, a null or NaN
    sequence or a null delete marker (one Spark job)."""
    keys = [F.col(quote(k)) for k in spec.key]
    flags = [F.col(quote(k)).isNull() for k in spec.key] + [F.col(DEL).isNull()]
    if spec.sequence_column:
        flags.append(_null_sequence(rows, spec.sequence_column))
    bad = F.lit(False)
    for flag in flags:
        bad = bad | flag
    # One row a key, then one for the batch: one job, whatever the keys are named.
    odd = rows.groupBy(*keys).agg(((F.count(F.lit(1)) > 1) | F.max(bad)).alias(_ODD))
    return odd.agg(F.max(F.col(_ODD))).collect()[0][0] is not True


def _null_sequence(rows: DataFrame, column: str) -> Column:
    """A row's sequence is null, or NaN (which orders no event: see ``_check``)."""
    seq = F.col(quote(column))
    floating = isinstance(rows.schema[column].dataType, (FloatType, DoubleType))
    return seq.isNull() | F.isnan(seq) if floating else seq.isNull()


def _ranked(rows: DataFrame, schema: StructType, spec: UpsertSpec) -> DataFrame:
    """The batch's rows (with ``DEL``), each with its place in its key (``_RN``: 1 for the
    winner) and whether it ties for the top with a row that differs (``_DIFFERS``), in one
    pass: the windows share the key's partitioning and order, and only rows that tie are
    rendered (as JSON, exact: NaN equal to NaN, timestamps to the microsecond) to be compared."""
    keys = [F.col(quote(k)) for k in spec.key]
    seq = F.col(quote(spec.sequence_column)) if spec.sequence_column else None
    w = Window.partitionBy(*keys).orderBy(seq.desc() if seq is not None else F.lit(1))
    peers = w.rangeBetween(Window.currentRow, Window.currentRow)  # the rows of its sequence
    columns = [F.col(quote(c)) for c in schema.names]
    placed = rows.select(
        *columns,
        F.col(DEL),
        F.row_number().over(w).alias(_RN),
        (F.rank().over(w) if seq is not None else F.lit(1)).alias(_RK),
        F.count(F.lit(1)).over(peers).alias(_TIED),
    )
    row = F.when(F.col(_TIED) > 1, F.to_json(F.struct(*columns, F.col(DEL)), _EXACT_JSON))
    differs = (F.col(_RK) == 1) & (F.min(row).over(peers) != F.max(row).over(peers))
    return placed.select(*columns, F.col(DEL), F.col(_RN), F.coalesce(differs, F.lit(False)).alias(_DIFFERS))


def winning_rows(ranked: DataFrame, schema: StructType) -> DataFrame:
    """The rows of a prepared batch that the target would hold: each key's winner, unless a
    delete."""
    return ranked.where((F.col(_RN) == 1) & ~F.col(DEL)).select(*[F.col(quote(c)) for c in schema.names])


def _check(ranked: DataFrame, spec: UpsertSpec, where: Where) -> None:
    """One Spark job (the pass that ranks and caches the batch) finding null keys, null or NaN
    sequences and keys whose top rows differ. (Spark ranks NaN above every number within a
    batch, while across batches no comparison with NaN is true: a NaN sequence would order
    events one way now and another later.)"""
    null_key = F.lit(False)
    for k in spec.key:
        null_key = null_key | F.col(quote(k)).isNull()
    null_seq = _null_sequence(ranked, spec.sequence_column) if spec.sequence_column else F.lit(False)
    null_del = F.col(DEL).isNull()
    # Rows equal in every column are one event delivered twice; the first of a key's top rows
    # that differ names the key.
    differ = F.col(_DIFFERS) & (F.col(_RN) == 1)
    kind = (
        F.when(null_key, "null key")
        .when(null_seq, "null sequence")
        .when(null_del, "null delete marker")
        .otherwise("duplicate")
    )
    keys = [F.col(quote(k)) for k in spec.key]
    bad = ranked.where(null_key | null_seq | null_del | differ).select(kind.alias("kind"), *keys)
    found = bad.limit(20).collect()
    kinds = {r["kind"] for r in found}
    if "null key" in kinds:
        raise InputError(
            f"a row has a null in key column(s) {', '.join(spec.key)}; keys must not be null", where
        )
    if "null sequence" in kinds:
        raise InputError(
            f"a row has a null or NaN sequence ({spec.sequence_column}); sequences must be numbers "
            "that order events",
            where,
        )
    if "null delete marker" in kinds:
        raise InputError(
            f"a row has a null delete marker ({spec.delete_column}); say true or false, so that a "
            "delete is never taken for an update",
            where,
        )
    duplicates = [r for r in found if r["kind"] == "duplicate"]
    if duplicates:
        shown = ", ".join(str(tuple(r[k] for k in spec.key)) for r in duplicates[:5])
        why = (
            f"with the same highest {spec.sequence_column} and different values"
            if spec.sequence_column
            else "with different values and no sequence_column to order them"
        )
        raise DuplicateKeyError(f"keys appear more than once in the batch {why}: {shown}", where)


class Upsert:
    """Plans upsert-mode attempts of one epoch (see the module doc)."""

    def __init__(self, ctx: EpochContext, tombstones: Tombstones) -> None:
        self.ctx = ctx
        opts = ctx.opts
        self.spec = UpsertSpec(opts.key, opts.delete_column, opts.sequence_column)
        self.tombstones = tombstones
        """The sink's tombstone sets (with both a sequence and a delete column), else unused."""
        self.ranked: DataFrame | None = None
        self.touched: pa.Table | None = None
        self.attempt: list[DataFrame] = []
        self.made: NewSet | None = None
        """The tombstone set this attempt writes, if any."""
        self.marks: _Marks | None = None

    @property
    def keeps_tombstones(self) -> bool:
        return self.spec.sequence_column is not None and self.spec.delete_column is not None

    @property
    def keeps_history(self) -> bool:
        """The view keeps a history, which records its late events (``late.py``): with a
        sequence column, an event older than what its key holds."""
        return self.spec.sequence_column is not None and self.ctx.opts.history_target is not None

    def plan(self, snap: Snapshot, layout: Layout) -> Plan:
        ctx, schema = self.ctx, layout.struct
        rules = rules_for(snap, ctx.opts, ctx.where)
        with ctx.phase("prepare"):
            if self.ranked is None:
                self.ranked = prepare(ctx.batch, schema, self.spec, ctx.where)
            ctx.enforce(winning_rows(self.ranked, schema), rules)
        self.made = None
        marks = self._marks(snap, layout)
        if not snap.files and self.touched is None and (marks is None or not marks.held):
            return self._first(layout, marks, rules)
        self._release_attempt()
        on_driver = marks is None or marks.held <= tombstones.DRIVER_TOMBSTONES
        if not on_driver or (self.touched is None and ctx.placement(snap) == "distributed"):
            return self._plan_distributed(snap, layout, marks, rules)
        if self.touched is None and not self._collect(layout, rules):  # too big for the driver
            return self._plan_distributed(snap, layout, marks, rules)
        return self._plan_on_driver(snap, layout, marks)

    def _first(self, layout: Layout, marks: _Marks | None, rules: Rules) -> Plan:
        """A first epoch (or one on an emptied target that remembers no delete): the winners,
        written by Spark tasks; the deletes among them, the first tombstones."""
        assert self.ranked is not None
        plan = Plan(checked(winning_rows(self.ranked, layout.struct), rules), None)
        if marks is None:
            return plan
        with self.ctx.phase("tombstones"):
            deletes = self._winners().where(F.col(DEL)).select(*self._held())
            if deletes.limit(1).count() == 0:
                return plan
        return self._with_set(
            plan, marks, tombstones.next_frame(None, deletes, None, self.spec.key, marks.now)
        )

    def _collect(self, layout: Layout, rules: Rules) -> bool:
        """Bring the touched keys' winners to the driver (``touched``), checked against the
        rules and fingerprinted; False if they are too big to (``EpochContext.collect``)."""
        ctx, schema = self.ctx, layout.struct
        with ctx.phase("collect"):
            cols = [F.col(quote(c)) for c in schema.names]
            table = ctx.collect(self._winners().select(*cols, F.col(DEL), rules.broken()))
            if table is None:
                return False
        _refuse_broken(table, ctx.where)  # the rows written are these, checked here
        with ctx.phase("fingerprint"):
            rows = table.select(schema.names).cast(layout.arrow)
            a, b = fingerprints(rows)
            self.touched = (
                rows.append_column(DEL, table.column(DEL))
                .append_column(FP_A, pa.array(a))
                .append_column(FP_B, pa.array(b))
            )
        return True

    def _plan_on_driver(self, snap: Snapshot, layout: Layout, marks: _Marks | None) -> Plan:
        """The plan made on the driver from the collected ``touched`` keys (rule 2 and 3 of
        the module doc): the files that may hold one read, each key decided
        (``_decide_keys``)."""
        ctx, touched = self.ctx, self.touched
        assert touched is not None
        live = None
        if marks is not None:
            with ctx.phase("tombstones"):
                held = self.tombstones.load(
                    snap, ctx.store, ctx.opts.name, ctx.opts.app_id, marks.schema, ctx.where
                )
                live = marks.live(held)
        with ctx.phase("read"):
            files = [snap.files[i] for i in candidate_files(snap, touched, self.spec.key)]
            tables = self._read(files, layout, snap)
            stored = _stored(tables, touched, self.spec)
        with ctx.phase("diff"):
            insert, drop_file, drop_pos, changes, late = _decide_keys(touched, stored, self.spec, live)
        n = int(insert.sum())
        inserts = touched.filter(pa.array(insert)).select(layout.struct.names) if n else None
        rewrites = _rewrites(files, tables, drop_file, drop_pos)
        # The touched keys were collected from the whole batch (in this attempt or an earlier one).
        plan = Plan(inserts, n, rewrites, files_read=len(files), ran_batch=True)
        if self.keeps_history and late.any():
            plan = self._with_late(plan, touched.filter(pa.array(late)).select(layout.struct.names), layout)
        if marks is None or live is None or changes is None or (changes.empty and not marks.expired):
            return plan
        return self._with_set(plan, marks, tombstones.next_set(live, changes, self.spec.key, marks.now))

    def _winners(self) -> DataFrame:
        assert self.ranked is not None
        return self.ranked.where(F.col(_RN) == 1)

    def _held(self) -> list[Column]:
        """The key and sequence columns: what a tombstone holds."""
        assert self.spec.sequence_column is not None
        return [F.col(quote(c)) for c in (*self.spec.key, self.spec.sequence_column)]

    def _marks(self, snap: Snapshot, layout: Layout) -> _Marks | None:
        """Where the view's tombstones stand at ``snap`` (None: this view keeps none)."""
        if not self.keeps_tombstones:
            return None
        assert self.spec.sequence_column is not None
        ctx = self.ctx
        with ctx.phase("tombstones"):
            under = (*self.spec.key, self.spec.sequence_column)
            manifest = self.tombstones.manifest_at(
                snap, ctx.store, ctx.opts.name, ctx.opts.app_id, under, ctx.where
            )
        now = now_ms()
        retention = tombstones.retention_ms(ctx.opts.tombstone_retention, snap.configuration, ctx.where)
        shape = tombstones.schema_of(layout.arrow, self.spec.key, self.spec.sequence_column)
        kept = tombstones.table_retention_ms(snap.configuration)
        self.marks = _Marks(manifest, shape, now, now - retention, kept)
        return self.marks

    def _with_late(self, plan: Plan, rows: pa.Table | DataFrame, layout: Layout) -> Plan:
        """``plan``, writing ``rows`` as the late events its commit met (``late.py``)."""
        made = LateEvents.of(self.ctx.opts.name, rows, layout, self.ctx.where)
        return replace(plan, sides=(*plan.sides, made.side()))

    def _with_set(self, plan: Plan, marks: _Marks, rows: pa.Table | DataFrame) -> Plan:
        """``plan``, writing ``rows`` as the view's next tombstone set."""
        opts = self.ctx.opts
        self.made = tombstones.new_set(opts.name, opts.app_id, rows, marks.schema)
        return replace(plan, sides=(*plan.sides, self.made.side()))

    def _read(self, files: list, layout: Layout, snap: Snapshot) -> list[pa.Table]:  # type: ignore[type-arg]
        store = self.ctx.store
        with ThreadPoolExecutor(IO_THREADS) as pool:
            return list(pool.map(lambda f: store.read(f, layout.arrow, snap.partition_by), files))

    def _plan_distributed(self, snap: Snapshot, layout: Layout, marks: _Marks | None, rules: Rules) -> Plan:
        """The plan made by Spark (``distributed.py``): touched keys are never collected. The
        files that may hold one are read by tasks, their rows of touched keys joined with the
        winners in Spark, and each key decided (``_decide_keys``) in the task its rows hash to."""
        ctx, spec = self.ctx, self.spec
        assert self.ranked is not None
        spark = ctx.batch.sparkSession
        numbers, ran_batch = self._prune(snap)
        winners = with_fingerprints(self._winners(), layout, [StructField(DEL, BooleanType())])
        both, live = self._both_sides(snap, layout, marks, winners, numbers)
        # Nullable, whatever the table says: a retraction carries no row, only its address.
        fields = [StructField(f.name, f.dataType, True, f.metadata) for f in layout.struct.fields]
        out = StructType([*fields, StructField(_KIND, IntegerType()), *_ADDRESS.fields[:2]])
        # Sorted by key within each partition: a task decides its keys a chunk at a time.
        keys = [F.col(quote(k)) for k in spec.key]
        decider = _Decider(spec, layout, marks is not None, DECIDE_CHUNK_ROWS, self.keeps_history)
        decided = map_in_arrow(both.repartition(*keys).sortWithinPartitions(*keys), decider, out)
        decided = decided.persist(KEEP)
        self.attempt.append(decided)
        with ctx.phase("diff"):
            try:
                counts = {r[_KIND]: r["count"] for r in decided.groupBy(_KIND).count().collect()}
            except Exception as exc:
                raise_task_errors(exc, ctx.where)
                raise
        inserted, retracted = counts.get(0, 0), counts.get(1, 0)
        drops = (
            decided.where(F.col(_KIND) == 1)
            .groupBy(F.col(FILE).alias("file_no"))
            .agg(F.array_sort(F.collect_list(POS)).alias("drop"))
            .join(file_frame(spark, snap.files, numbers), "file_no")
        )
        # About a file's worth of rows per write task.
        tasks = max(1, -(-inserted // ctx.opts.max_rows_per_file))
        inserts = decided.where(F.col(_KIND) == 0).select(*[F.col(quote(c)) for c in layout.struct.names])
        plan = Plan(
            checked(inserts, rules).repartition(tasks) if inserted else None,
            inserted,
            TaskRewrites(drops, snap.files, retracted) if retracted else (),
            files_read=len(numbers),
            ran_batch=ran_batch,
        )
        if counts.get(4, 0):
            late = decided.where(F.col(_KIND) == 4).select(*[F.col(quote(c)) for c in layout.struct.names])
            # About a file's worth of late events per write task (not a file per decide task).
            plan = self._with_late(plan, late.coalesce(-(-counts[4] // LATE_ROWS_PER_FILE)), layout)
        if marks is None or (counts.get(2, 0) + counts.get(3, 0) == 0 and not marks.expired):
            return plan
        # The next set, in Spark: never on the driver; about PART_ROWS tombstones a part.
        changed = [decided.where(F.col(_KIND) == k) for k in (2, 3)]
        rows = tombstones.next_frame(
            live, changed[0].select(*self._held()), changed[1].select(*keys), spec.key, marks.now
        )
        parts = -(-(marks.held + counts.get(2, 0)) // tombstones.PART_ROWS)
        return self._with_set(plan, marks, rows.coalesce(max(1, parts)))

    def _prune(self, snap: Snapshot) -> tuple[list[int], bool]:
        """The numbers of the files that may hold a touched key, and whether finding them ran
        the whole batch. At most ``KEY_RANGES`` rows per group of partition values come to the
        driver: a collect that falls back to every file when the driver may not take it
        (``ResultLimit.collect``)."""
        ctx = self.ctx
        with ctx.phase("prune"):
            ranges = ctx.limit.collect(_key_ranges(self._winners(), snap, self.spec))
            if ranges is None:
                return list(range(len(snap.files))), False
            return files_in_ranges(snap, ranges, self.spec.key), True

    def _both_sides(
        self, snap: Snapshot, layout: Layout, marks: _Marks | None, winners: DataFrame, numbers: list[int]
    ) -> tuple[DataFrame, DataFrame | None]:
        """The rows each key is decided from, in one frame, by ``_SIDE``: the winners (0), the
        stored rows of touched keys in the files at ``numbers`` (1, read by tasks), and the
        touched keys' live tombstones (2); and the view's live tombstones (None: none)."""
        ctx, spec = self.ctx, self.spec
        spark = ctx.batch.sparkSession
        keys = [F.col(quote(k)) for k in spec.key]
        held = [*spec.key, *([spec.sequence_column] if spec.sequence_column else [])]
        held_fields = [layout.struct[c] for c in held]
        reader = _KeyReader(ctx.store, layout.arrow, snap.partition_by, tuple(held))
        stored = (
            file_frame(spark, snap.files, numbers)
            .mapInArrow(reader, StructType([*held_fields, *_ADDRESS.fields]))
            .join(winners.select(*keys), list(spec.key), "left_semi")
        )
        both = winners.select(
            "*",
            F.lit(None).cast("long").alias(FILE),
            F.lit(None).cast("long").alias(POS),
            F.lit(0).alias(_SIDE),
        ).unionByName(stored.withColumn(_SIDE, F.lit(1)), allowMissingColumns=True)
        if marks is None or marks.manifest is None or not marks.held:
            return both, None
        # The view's tombstones, read by tasks; those of touched keys join the decision.
        shape = tombstones.schema_of(layout.arrow, spec.key, str(spec.sequence_column))
        struct = StructType([*held_fields, StructField(tombstones.DELETED_AT, LongType())])
        live = tombstones.frame(spark, ctx.store, marks.manifest, shape, struct, marks.since)
        marked = live.drop(tombstones.DELETED_AT).join(winners.select(*keys), list(spec.key), "left_semi")
        return both.unionByName(marked.withColumn(_SIDE, F.lit(2)), allowMissingColumns=True), live

    def _release_attempt(self) -> None:
        release(*self.attempt)
        self.attempt = []

    def committed(self, staged: Staged) -> None:
        if self.made is not None and any(s.writer is self.made for s in staged.sides):
            rows = self.made.rows
            self.tombstones.remember(self.made.number, rows if isinstance(rows, pa.Table) else None)
        marks = self.marks
        if marks is not None and marks.table_retention is not None:
            # Sets this sink's commit left behind go once past the table's retention.
            ctx = self.ctx
            current = self.tombstones.number if self.made is None else None  # a new set is young
            self.tombstones.sweep_once(ctx.store, ctx.opts.name, current, marks.table_retention, ctx.where)

    def close(self) -> None:
        self._release_attempt()
        if self.ranked is not None:
            release(self.ranked)
            self.ranked = None


def _refuse_broken(winners: pa.Table, where: Where) -> None:
    """``InputError`` if a winner the view would store (not a delete) breaks a rule: the rows
    collected are the rows written, whatever Spark computed when it checked them before."""
    broken = pc.and_(winners.column(RULE).is_valid(), pc.invert(winners.column(DEL)))
    if pc.any(broken).as_py():
        rows = winners.filter(broken)
        rule = rows.column(RULE)[0].as_py()
        raise broken_error(rule, rows.slice(0, 3).drop_columns([RULE, DEL]).to_pylist(), where)


def _rewrites(
    files: list[DataFile], tables: list[pa.Table], drop_file: I64, drop_pos: I64
) -> tuple[Rewrite, ...]:
    """The read files (``tables``: their rows) holding rows to drop, at (file number,
    position) pairs, each with its positions sorted."""
    if not len(drop_file):
        return ()
    order = np.lexsort((drop_pos, drop_file))
    drop_file, drop_pos = drop_file[order], drop_pos[order]
    bounds = np.flatnonzero(np.diff(drop_file)) + 1
    rewrites = []
    for numbers, positions in zip(np.split(drop_file, bounds), np.split(drop_pos, bounds), strict=True):
        k = int(numbers[0])
        rewrites.append(Rewrite(files[k], tables[k], positions.astype(np.int64)))
    return tuple(rewrites)


def _stored(tables: list[pa.Table], touched: pa.Table, spec: UpsertSpec) -> pa.Table | None:
    """The rows of the read files whose key was touched: key, sequence, address, fingerprint."""
    keys = touched.select(list(spec.key))
    parts = []
    seq = [spec.sequence_column] if spec.sequence_column else []
    for k, rows in enumerate(tables):
        if rows.num_rows == 0:
            continue
        # Join on the keys alone (Arrow joins carry no nested columns), then take whole rows.
        addressed = rows.select([*spec.key, *seq]).append_column(
            POS, pa.array(np.arange(rows.num_rows, dtype=np.int64))
        )
        hit = addressed.join(keys, list(spec.key), join_type="left semi")
        if hit.num_rows == 0:
            continue
        a, b = fingerprints(rows.take(hit.column(POS)))
        parts.append(
            hit.select([*spec.key, *seq, POS])
            .append_column(FILE, pa.array(np.full(hit.num_rows, k, dtype=np.int64)))
            .append_column(FP_A, pa.array(a))
            .append_column(FP_B, pa.array(b))
        )
    return pa.concat_tables(parts) if parts else None


def _decide_keys(
    touched: pa.Table, stored: pa.Table | None, spec: UpsertSpec, tombs: pa.Table | None = None
) -> tuple[npt.NDArray[np.bool_], I64, I64, Changes | None, npt.NDArray[np.bool_]]:
    """Per touched key (rule 3 of the module doc), vectorised: which batch rows to insert, the
    stored rows to drop as (file number, position), given the touched keys' tombstones
    (``tombstones.py``) what happens to them (None: the view keeps none), and which batch rows
    are late events (``late.py``)."""
    n = touched.num_rows
    wanted = _Wanted(
        touched.column(FP_A).to_numpy().copy(),
        touched.column(FP_B).to_numpy().copy(),
        ~touched.column(DEL).to_numpy(zero_copy_only=False).astype(bool),
        np.ones(n, dtype=bool),
        np.zeros(n, dtype=bool),
    )
    z = np.zeros(0, dtype=np.int64)
    # Tie each stored row to its touched key (``_TI``).
    index = touched.select(list(spec.key)).append_column(_TI, pa.array(np.arange(n, dtype=np.int64)))
    held = _KeyRows.of(stored, index, spec.key)
    changes = None
    if spec.sequence_column:
        changes = _newest_wins(touched, held, index, tombs, spec, wanted)
    if held is None:
        return wanted.row & wanted.from_batch, z, z, changes, wanted.late
    ti, starts = held.ti, held.starts
    match = wanted.row[ti] & (held.a == wanted.a[ti]) & (held.b == wanted.b[ti])
    seen = np.cumsum(match)
    before_group = np.repeat(seen[starts] - match[starts], np.diff(np.append(starts, len(ti))))
    kept = match & (seen - before_group == 1)
    has_kept = np.zeros(n, dtype=bool)
    has_kept[ti[kept]] = True
    insert = wanted.row & wanted.from_batch & ~has_kept
    drop = pa.array(~kept)
    return (
        insert,
        held.rows.column(FILE).filter(drop).to_numpy().astype(np.int64),
        held.rows.column(POS).filter(drop).to_numpy(),
        changes,
        wanted.late,
    )


@dataclass
class _Wanted:
    """What each touched key should hold (``_decide_keys``), numpy arrays by touched row."""

    a: I64
    b: I64
    """The fingerprint of the row the key should hold."""
    row: npt.NDArray[np.bool_]
    """Whether the key should hold a row at all (not deleted)."""
    from_batch: npt.NDArray[np.bool_]
    """Whether that row is the batch's (else a stored one, or nothing, stays)."""
    late: npt.NDArray[np.bool_]
    """Whether the batch's row is a late event: a row (not a delete) older than what its key
    holds, a stored row or a tombstone (``late.py``)."""


@dataclass(frozen=True)
class _KeyRows:
    """The stored rows of touched keys, ordered by key, file and position, so the earliest
    stored copy equal to the wanted row is the one kept."""

    rows: pa.Table
    ti: I64
    """Each row's touched key (row of ``touched``)."""
    a: I64
    b: I64
    """Each row's fingerprint."""
    starts: I64
    """Where each key's rows begin."""

    @staticmethod
    def of(stored: pa.Table | None, index: pa.Table, key: Sequence[str]) -> _KeyRows | None:
        if stored is None or not stored.num_rows:
            return None
        rows = stored.join(index, list(key), join_type="inner")
        if not rows.num_rows:
            return None
        rows = rows.take(pc.sort_indices(rows, [(_TI, "ascending"), (FILE, "ascending"), (POS, "ascending")]))
        ti = rows.column(_TI).to_numpy()
        starts = np.flatnonzero(np.concatenate([[True], ti[1:] != ti[:-1]]))
        return _KeyRows(rows, ti, rows.column(FP_A).to_numpy(), rows.column(FP_B).to_numpy(), starts)


def _newest_wins(
    touched: pa.Table,
    held: _KeyRows | None,
    index: pa.Table,
    tombs: pa.Table | None,
    spec: UpsertSpec,
    wanted: _Wanted,
) -> Changes | None:
    """With a sequence column: the newest of what the table holds for a key wins over an
    older (not an equal) event: its newest stored row stays, or its tombstone keeps it deleted
    (a tombstone wins a tie with a stored row); rows with a null sequence are older than any.
    Updates ``wanted``; returns the changes to the touched keys' tombstones (None: the view
    keeps none)."""
    assert spec.sequence_column is not None
    seq, n = spec.sequence_column, touched.num_rows
    newest_of = np.full(n, -1, dtype=np.int64)
    if held is not None:
        by_seq = pc.sort_indices(
            held.rows,
            [(_TI, "ascending"), (seq, "descending", "at_end"), (FILE, "ascending"), (POS, "ascending")],
        ).to_numpy()
        newest_of[held.ti[held.starts]] = by_seq[held.starts]
        stored_seq = held.rows.column(seq).take(pa.array(newest_of, mask=newest_of < 0))
    else:
        stored_seq = pa.nulls(n, touched.schema.field(seq).type)
    event = touched.column(seq)
    tomb = _per_key(tombs, index, seq, event.type) if tombs is not None else pa.nulls(n, event.type)
    stored_newer = _true(pc.greater(stored_seq, event))
    tomb_newer = _true(pc.greater(tomb, event)) & ~_true(pc.greater(stored_seq, tomb))
    k = np.flatnonzero(stored_newer & ~tomb_newer)
    if len(k):
        assert held is not None
        r = newest_of[k]
        wanted.a[k], wanted.b[k], wanted.row[k], wanted.from_batch[k] = held.a[r], held.b[r], True, False
    wanted.row[tomb_newer], wanted.from_batch[tomb_newer] = False, False
    deletes = touched.column(DEL).to_numpy(zero_copy_only=False).astype(bool)
    wanted.late[:] = (stored_newer | tomb_newer) & ~deletes
    if tombs is None:
        return None
    deleted = wanted.from_batch & ~wanted.row  # the batch's delete is the newest event of its key
    none = pa.scalar(None, event.type)
    after = pc.if_else(pa.array(tomb_newer), tomb, pc.if_else(pa.array(deleted), event, none))
    had, has = _true(pc.is_valid(tomb)), _true(pc.is_valid(after))
    moved = has & ~(had & _true(pc.equal(after, tomb)))
    keys = touched.select(list(spec.key))
    return Changes(
        keys.filter(pa.array(moved)).append_column(seq, after.filter(pa.array(moved))),
        keys.filter(pa.array(had & ~has)),
    )


def _true(mask: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """A boolean Arrow result as numpy, null as false."""
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _per_key(tombs: pa.Table, index: pa.Table, seq: str, kind: pa.DataType) -> pa.Array:
    """The tombstone sequence of each touched key (null: none), in ``index`` order."""
    n = index.num_rows
    hit = tombs.select([*index.column_names[:-1], seq]).join(
        index, index.column_names[:-1], join_type="inner"
    )
    at = np.full(n, -1, dtype=np.int64)
    at[hit.column(_TI).to_numpy()] = np.arange(hit.num_rows, dtype=np.int64)
    return hit.column(seq).cast(kind).combine_chunks().take(pa.array(at, mask=at < 0))


def _key_ranges(winners: DataFrame, snap: Snapshot, spec: UpsertSpec) -> DataFrame:
    """Touched keys as at most ``KEY_RANGES`` ranges per group of keys sharing their partition
    key values (as the log writes them): the least and greatest value of each other key
    column per range (``prune.files_in_ranges``). The keys are range-partitioned by Spark, so
    each range holds neighbouring keys and a range rarely spans untouched files."""
    # A partition key prunes only if Spark's string of it is the log's (not timestamps, not
    # floats): otherwise it is left out, and files of every partition value are candidates.
    types = {f.name: f.dataType for f in winners.schema.fields}
    text = (StringType, IntegerType, LongType, ShortType, ByteType, DateType, BooleanType)
    part_keys = [k for k in spec.key if k in snap.partition_by and isinstance(types[k], text)]
    others = [k for k in spec.key if k not in snap.partition_by]
    groups = [F.col(quote(k)).cast("string").alias(k) for k in part_keys]
    if not others:
        return winners.groupBy(*groups).count()
    ranged = winners.repartitionByRange(KEY_RANGES, *[F.col(quote(k)) for k in others])
    aggs = [F.min(quote(k)).alias(f"lo.{k}") for k in others] + [
        F.max(quote(k)).alias(f"hi.{k}") for k in others
    ]
    return ranged.groupBy(*groups, F.spark_partition_id().alias(_RANGE)).agg(*aggs)


@dataclass(frozen=True)
class _KeyReader:
    """Runs in a Spark task: each file's rows as (key and sequence columns, address,
    fingerprint)."""

    store: Store
    schema: pa.Schema
    partition_by: tuple[str, ...]
    held: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for row, file in task_files(batches):
            with in_task(f"reading {file.path}"):
                rows = self.store.read(file, self.schema, self.partition_by)
                a, b = fingerprints(rows)
            n = rows.num_rows
            if n == 0:
                continue
            address = [np.full(n, row["file_no"], dtype=np.int64), np.arange(n, dtype=np.int64), a, b]
            held = rows.select(list(self.held)).columns
            yield from pa.Table.from_arrays(
                [*held, *map(pa.array, address)], schema=self._schema()
            ).to_batches()

    def _schema(self) -> pa.Schema:
        return pa.schema(
            [self.schema.field(c) for c in self.held]
            + [pa.field(n, pa.int64()) for n in (FILE, POS, FP_A, FP_B)]
        )


@dataclass(frozen=True)
class _Decider:
    """Runs in a Spark task over rows of both sides sorted by key, so each key's rows are
    contiguous: decides them (rule 3 of the module doc, ``_decide_keys``) a chunk of whole keys at
    a time, and emits the rows to insert (kind 0) and the stored rows to drop (kind 1, by file
    number and position). A task holds about ``DECIDE_CHUNK_ROWS`` rows (or one key's rows,
    if more) however many its partition has."""

    spec: UpsertSpec
    layout: Layout
    tombstoned: bool = False
    """The view keeps tombstones: they come as side 2 (key and sequence), and the changes to
    them go out as kind 2 (a key's new tombstone) and kind 3 (a key's tombstone cleared)."""
    chunk_rows: int = DECIDE_CHUNK_ROWS
    """Rows decided at a time."""
    late: bool = False
    """The view keeps a history: its late events go out as kind 4 (the event's row)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunk = self.chunk_rows
        pending: list[pa.RecordBatch] = []
        held = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            pending.append(batch)
            held += batch.num_rows
            if held < chunk:
                continue
            table = pa.Table.from_batches(pending)
            cut = _last_key_start(table, self.spec.key)
            if cut == 0:
                continue  # one key's rows so far: they are decided together
            yield from self._decide_chunk(table.slice(0, cut))
            rest = table.slice(cut)
            pending, held = rest.to_batches(), rest.num_rows
        if pending:
            yield from self._decide_chunk(pa.Table.from_batches(pending))

    def _decide_chunk(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        """Decide ``table``: every row of each of its keys."""
        schema, spec = self.layout.arrow, self.spec
        side = table.column(_SIDE).to_numpy(zero_copy_only=False)
        touched_rows = table.filter(pa.array(side == 0))
        touched = (
            touched_rows.select(schema.names)
            .cast(schema)
            .append_column(DEL, touched_rows.column(DEL))
            .append_column(FP_A, touched_rows.column(FP_A))
            .append_column(FP_B, touched_rows.column(FP_B))
        )
        seq = [spec.sequence_column] if spec.sequence_column else []
        stored_side = table.filter(pa.array(side == 1))
        stored = pa.table(
            {
                **{c: stored_side.column(c).cast(schema.field(c).type) for c in [*spec.key, *seq]},
                POS: stored_side.column(POS),
                FILE: stored_side.column(FILE),
                FP_A: stored_side.column(FP_A),
                FP_B: stored_side.column(FP_B),
            }
        )
        tombs = None
        if self.tombstoned:
            marked = table.filter(pa.array(side == 2))
            tombs = pa.table({c: marked.column(c).cast(schema.field(c).type) for c in [*spec.key, *seq]})
        with in_task("deciding touched keys"):
            insert, drop_file, drop_pos, changes, late = _decide_keys(
                touched, stored if stored.num_rows else None, spec, tombs
            )
        out = pa.schema(
            [*schema, pa.field(_KIND, pa.int32()), pa.field(FILE, pa.int64()), pa.field(POS, pa.int64())]
        )
        ins = touched.filter(pa.array(insert)).select(schema.names)
        n, m = ins.num_rows, len(drop_file)
        if n:
            yield from _out(ins, 0, out)
        if m:
            dropped = pa.table({FILE: pa.array(drop_file, pa.int64()), POS: pa.array(drop_pos, pa.int64())})
            yield from _out(dropped, 1, out)
        if changes is not None:
            yield from _out(changes.set, 2, out)
            yield from _out(changes.cleared, 3, out)
        if self.late and late.any():
            yield from _out(touched.filter(pa.array(late)).select(schema.names), 4, out)


def _last_key_start(table: pa.Table, key: Sequence[str]) -> int:
    """Where the rows of ``table``'s last key begin (rows are sorted by key)."""
    last = table.slice(table.num_rows - 1)
    same = np.ones(table.num_rows, dtype=bool)
    for k in key:
        same &= _true(pc.equal(table.column(k), last.column(k)[0]))
    other = np.flatnonzero(~same)
    return int(other[-1]) + 1 if len(other) else 0


def _out(rows: pa.Table, kind: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``rows`` as rows of ``schema`` of ``kind``: its columns as they are, the others null."""
    if rows.num_rows == 0:
        return
    n = rows.num_rows
    columns = [
        pa.array(np.full(n, kind, np.int32))
        if f.name == _KIND
        else rows.column(f.name).cast(f.type)
        if f.name in rows.column_names
        else pa.nulls(n, f.type)
        for f in schema
    ]
    yield from pa.Table.from_arrays(columns, schema=schema).to_batches()
