"""Verify: does the target equal desired, as a multiset? Computed once, by Spark.

Independent of the sink's own bookkeeping: the target's data files are read and hashed again
(the stored index is not consulted), desired is evaluated once, and both sides are compared by
row fingerprint (mvsink's row equality: null-safe, NaN equal to NaN, maps order-free) in one
Spark aggregation, so nothing row-sized comes to the driver but the samples. Given the view's
name, it also checks the view's stored index: every entry the sink would trust must hold its
file's fingerprints (tasks read the files a second time for that).

``desired_of_job`` runs a job's streaming query once from a fresh checkpoint. A view whose
clock is ``source_offsets`` has committed known offsets: for Kafka sources, the fresh query is
run to them (its offset log seeded with them as batch 0's end, which Spark runs as an
uncommitted batch; what comes after is read but not kept), from where the view's query started
(its checkpoint's initial offsets, seeded too), so a view that merely trails its topic verifies
equal, and the result says how far behind the topic's end it is (``Position``).
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.compat import KEEP, logical_plan, release
from mvsink.epoch.clock import (
    RecordedOffsets,
    committed_offsets,
    kafka_initial,
    kafka_initial_file,
    last_offsets,
)
from mvsink.errors import ConfigError, InputError, Where, first_line
from mvsink.ops.history import HistoryCheck, check_history
from mvsink.plan.distributed import mismatched_entries, stored_rows, with_fingerprints
from mvsink.plan.rules import rules_for
from mvsink.table.catalog import locate
from mvsink.table.delta import Snapshot, load_snapshot
from mvsink.table.fingerprint import FP_A, FP_B
from mvsink.table.index import StoredIndex
from mvsink.table.layout import Layout
from mvsink.table.record import app_id
from mvsink.table.schema import check_fits, check_supported, stored_struct, target_struct
from mvsink.table.storage import Store
from mvsink.table.tasks import raise_task_errors

FORMAT = 1


@dataclass(frozen=True)
class Position:
    """Where ``verify --job`` computed desired of a view under ``clock = "source_offsets"``,
    against where the view is."""

    view_offsets: tuple[Any, ...] | None
    """The view's committed offsets, one per source of its query, as its checkpoint spells
    them (Kafka: topic -> partition -> next offset); None where they are not known."""
    at_view: bool
    """Desired was computed at the view's offsets (else over what the sources hold now)."""
    behind: dict[str, int] | None = None
    """Kafka, desired computed at the view's offsets: per ``topic/partition``, how many
    offsets (records) the topic held past the view's when verify ran; None where not known."""
    reason: str | None = None
    """Why desired was not computed at the view's offsets; or, computed at them (``at_view``),
    why it did not start where the view's query started (None: it did)."""

    @property
    def records_behind(self) -> int | None:
        """All of ``behind``: how many records the view has not read yet."""
        return None if self.behind is None else sum(self.behind.values())

    def describe(self) -> list[str]:
        """What the text of a verification says about it, indented."""
        at = (
            f"the view is at offsets {_spelled(self.view_offsets)}"
            if self.view_offsets is not None
            else "the view's offsets are not known"
        )
        if not self.at_view:
            return [
                f"  {at}; desired was computed over what its sources hold now, not at them "
                f"({self.reason}): a view that trails its sources differs by what it has not read yet"
            ]
        start = (
            [f"  but desired did not start where the view's query started: {self.reason}"]
            if self.reason is not None
            else []
        )
        total = self.records_behind
        if total is None:
            return [f"  {at}, where desired was computed; its sources may hold more", *start]
        if total == 0:
            return [f"  {at}, where desired was computed: its sources hold nothing past them", *start]
        parts = ", ".join(f"{p} {n:,}" for p, n in sorted(self.behind.items()) if n) if self.behind else ""
        return [
            f"  {at}, where desired was computed; it is {total:,} record(s) behind its sources' "
            f"end ({parts}), which the next epochs read",
            *start,
        ]


def _spelled(offsets: tuple[Any, ...]) -> str:
    """Sources' offsets as the text says them: one source's JSON alone, several as a list."""
    text = [json.dumps(o, separators=(",", ":"), sort_keys=True) for o in offsets]
    return text[0] if len(text) == 1 else f"[{', '.join(text)}]"


@dataclass(frozen=True)
class Verification:
    """The outcome of ``verify``: ``equal`` when no row is missing or extra."""

    target: str
    view: str | None
    table_version: int | None
    desired_rows: int
    target_rows: int
    missing: int
    """Rows desired holds more often than the target (counted with multiplicity)."""
    extra: int
    """Rows the target holds more often than desired."""
    missing_sample: tuple[dict[str, Any], ...]
    """Up to ``sample`` distinct missing rows."""
    extra_sample: tuple[dict[str, Any], ...]
    """Up to ``sample`` distinct extra rows."""
    index_mismatches: tuple[str, ...] = ()
    """With a view name: data files whose index entry (which the sink trusts, as its path,
    size and row count match the log) does not hold the file's rows, e.g. a file replaced in
    place by one of the same size. The sink would compute wrong corrections from them: delete
    their entries (``_mvsink/<view>/index/``) and it recomputes them."""
    position: Position | None = None
    """``verify --job`` of a view under ``clock = "source_offsets"``: where desired was
    computed (at the view's committed offsets, for Kafka sources) and how far behind its
    sources the view is."""
    history: HistoryCheck | None = None
    """With a view name, of a view keeping a history: whether its open lifetimes are the
    table's rows (``ops/history.py``)."""

    @property
    def equal(self) -> bool:
        """No row missing or extra (whatever the index says)."""
        return self.missing == 0 and self.extra == 0

    @property
    def ok(self) -> bool:
        """Equal, no index entry contradicts its file, and the history (if any) is the table."""
        return self.equal and not self.index_mismatches and (self.history is None or self.history.equal)

    def to_json(self) -> dict[str, Any]:
        out = {"format": FORMAT, "equal": self.equal, **asdict(self)}
        if self.position is not None:
            out["position"]["records_behind"] = self.position.records_behind
        return out

    def __str__(self) -> str:
        head = f"{self.target} (view {self.view}, version {self.table_version})"
        desired = "desired at the view's offsets" if self.position and self.position.at_view else "desired"
        stale = [
            f"  index entry contradicts its data file (delete the entry; the sink recomputes it): {p}"
            for p in self.index_mismatches
        ]
        where = self.position.describe() if self.position is not None else []
        if self.history is not None:
            stale.append(str(self.history))
        if self.equal:
            return "\n".join([f"{head} equals {desired}: {self.target_rows:,} rows", *where, *stale])
        lines = [
            f"{head} differs from {desired}: {self.missing:,} row(s) missing, {self.extra:,} extra "
            f"(target {self.target_rows:,} rows, desired {self.desired_rows:,})",
            *where,
        ]
        for label, sample in (("missing", self.missing_sample), ("extra", self.extra_sample)):
            lines += [f"  {label}: {json.dumps(r, default=str, sort_keys=True)}" for r in sample]
        return "\n".join([*lines, *stale])


def verify(
    desired: DataFrame,
    target: str,
    name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    sample: int = 20,
    position: Position | None = None,
) -> Verification:
    """Compare the Delta table at ``target`` with ``desired`` (a batch DataFrame) as multisets;
    ``position``, where ``desired_of_job`` computed desired, goes into the result."""
    options = dict(storage_options or {})
    where = Where(name, target)
    target = locate(target, where, desired.sparkSession)
    check_supported(desired.schema, where)
    stored = stored_struct(desired.schema, None)
    snap = load_snapshot(
        target, app_id(name or ""), options, where, writing=False, spark=desired.sparkSession
    )
    if not snap.exists or snap.schema_json is None:
        raise ConfigError("there is no Delta table to verify (check the path)", where)
    snap.require_rows(where)
    check_fits(
        stored,
        snap.schema_json,
        where,
        advice="Desired is compared with the table as it is: select and cast the view's columns in "
        "the --sql query, or give the job file the view runs (--job).",
    )
    layout = Layout(snap.schema_json, target_struct(snap.schema_json), snap.partition_by)
    want = with_fingerprints(desired, layout).persist(KEEP)  # evaluated once
    fp = [FP_A, FP_B]
    spark = desired.sparkSession
    have = stored_rows(spark, snap, Store(snap.root, options), layout) if snap.files else None
    counts = want.groupBy(*fp).agg(F.count(F.lit(1)).alias("d")).withColumn("t", F.lit(0))
    if have is not None:
        held = have.groupBy(*fp).agg(F.count(F.lit(1)).alias("t")).withColumn("d", F.lit(0))
        counts = counts.unionByName(held).groupBy(*fp).agg(F.sum("d").alias("d"), F.sum("t").alias("t"))
    counts = counts.withColumn("n", F.col("d") - F.col("t")).persist(KEEP)
    try:
        result = _compare(snap, name, target, want, have, counts, sample)
        if name and snap.files:
            index = StoredIndex.of(Store(snap.root, options), name, layout.arrow)
            result = replace(result, index_mismatches=tuple(mismatched_entries(spark, snap, index, layout)))
        if name:
            assert snap.version is not None
            history = check_history(spark, target, name, snap.version, have, layout, options)
            result = replace(result, history=history)
        return replace(result, position=position)
    except Exception as exc:
        raise_task_errors(exc, where)  # an mvsink error inside a task (e.g. a file unreadable)
        raise
    finally:
        release(counts, want)


def _compare(
    snap: Snapshot,
    name: str | None,
    target: str,
    want: DataFrame,
    have: DataFrame | None,
    counts: DataFrame,
    sample: int,
) -> Verification:
    """Totals and samples of the cached ``counts`` (fingerprint, desired, held, difference)."""
    totals = counts.agg(
        F.sum("d").alias("desired"),
        F.sum("t").alias("held"),
        F.sum(F.greatest(F.col("n"), F.lit(0))).alias("missing"),
        F.sum(F.greatest(-F.col("n"), F.lit(0))).alias("extra"),
    ).first()
    figures = {k: int(v or 0) for k, v in (totals.asDict() if totals else {}).items()}
    missing, extra = figures.get("missing", 0), figures.get("extra", 0)
    missing_rows = _sample(want, counts.where("n > 0"), sample) if missing else ()
    extra_rows = _sample(have, counts.where("n < 0"), sample) if extra and have is not None else ()
    return Verification(
        target=target,
        view=name,
        table_version=snap.version,
        desired_rows=figures.get("desired", 0),
        target_rows=figures.get("held", 0),
        missing=missing,
        extra=extra,
        missing_sample=missing_rows,
        extra_sample=extra_rows,
    )


def _sample(rows: DataFrame, keys: DataFrame, n: int) -> tuple[dict[str, Any], ...]:
    """Up to ``n`` distinct rows of ``rows`` whose fingerprints are among ``keys``'."""
    picked = rows.join(F.broadcast(keys.select(FP_A, FP_B).limit(n)), [FP_A, FP_B], "left_semi")
    picked = picked.dropDuplicates([FP_A, FP_B])
    return tuple(_plain(r.asDict(recursive=True)) for r in picked.drop(FP_A, FP_B).limit(n).collect())


def _plain(value: Any) -> Any:
    """A sample row as JSON can hold it: map keys as strings, NaN and infinities as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# Sources whose rows exist only as a query reads them: a fresh query never sees the ones the
# view read. Keyed by what their relation is called in a logical plan.
_GENERATED = {
    "RateStreamProvider": "Spark's rate source, which makes rows as time passes",
    "RatePerMicroBatchProvider": "Spark's rate-micro-batch source, which makes rows batch by batch",
    "TextSocketSourceProvider": "a socket source, which keeps nothing it delivered",
    "MemoryStream": "a memory stream, which lives in the query's process",
}
# Sources that start where they are told: (name, option, its default, what to set instead).
# Delta's own source is not among them: Spark's plan does not show a V1 source's options, so
# its startingVersion cannot be seen here (docs/operations.md).
_STARTS = {
    "KafkaSourceProvider": (
        "Kafka",
        "startingOffsets",
        "latest",  # a stream's default
        "set startingOffsets to earliest in the job's query (while the topic keeps every record "
        "since the view began)",
    ),
    "mvsink-delta": (
        "mvsink-delta",
        "startingVersion",
        "0",
        "give startingVersion a version number in the job's query",
    ),
}


def _option(line: str, option: str) -> str | None:
    """The value of ``option`` in a plan line's options (``key=value`` or ``key -> value``),
    a JSON object whole."""
    found = re.search(rf"(?i)\b{option}\s*(?:=|->)\s*", line)
    if found is None:
        return None
    rest = line[found.end() :]
    if not rest.startswith("{"):
        return re.split(r"[,\])}\s]", rest, maxsplit=1)[0]
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[: i + 1]
    return rest


def _from_latest(value: str) -> bool:
    """``latest``, or Kafka offsets as JSON naming -1 (latest) for some partition."""
    if value.lower() == "latest":
        return True
    try:
        offsets = json.loads(value)
    except ValueError:
        return False
    return isinstance(offsets, dict) and any(
        offset == -1
        for partitions in offsets.values()
        if isinstance(partitions, dict)
        for offset in partitions.values()
    )


def replay_refusal(plan: str) -> str | None:
    """Why a fresh run of the streaming query whose logical plan is ``plan`` cannot compute
    again what its view read, or None when its sources replay it (as far as the plan shows)."""
    for line in plan.splitlines():
        if "StreamingRelation" not in line and "StreamingDataSourceV2" not in line:
            continue
        for marker, what in _GENERATED.items():
            if marker in line:
                return f"its query reads {what}"
        for marker, (name, option, default, instead) in _STARTS.items():
            if marker not in line:
                continue
            by_time = re.search(r"(?i)\bstarting(timestamp|offsetsbytimestamp)\b", line)
            if _from_latest(_option(line, option) or default) and not by_time:
                return (
                    f"its query reads {name} from {option} latest, where the query was when it "
                    f"first started, so a fresh run sees none of what the view read; {instead} to "
                    "verify it with --job"
                )
    return None


class Desired(NamedTuple):
    """Desired of a job (``desired_of_job``), and where it was computed (None: over what its
    sources hold now, as for a view without a shared clock)."""

    rows: DataFrame
    position: Position | None


def desired_of_job(spark: Any, job: Any, scratch: str) -> Desired:
    """Desired of a complete-mode job file's view, computed once: its streaming query run over
    what its sources hold now (a fresh checkpoint in a new folder under ``scratch``, a local
    folder, where desired stays while the result is used), the last batch kept.

    A view under ``clock = "source_offsets"`` reading Kafka: its query run from where the
    view's query started to the view's committed offsets instead (``_seed``), batch 0 kept;
    ``verify`` reports where desired was computed and how far behind its topic the view is
    (``Position``)."""
    if job.job.output_mode != "complete" or job.sink.mode != "complete":
        raise ConfigError(
            "verify --job needs a complete-mode job (a batch of an upsert or append query is not "
            "the whole view); give the view's query with --sql instead",
            Where(job.sink.name, job.sink.target),
        )
    # A folder of its own each call: a checkpoint left in a reused scratch folder would have
    # committed batch 0 already, and its desired would be another call's.
    run = os.path.join(scratch, f"desired-{uuid.uuid4().hex}")
    out, checkpoint = f"{run}/desired", f"{run}/checkpoint"
    where = Where(job.sink.name, job.sink.target)
    stream = job.job.query_of(spark)
    refusal = replay_refusal(logical_plan(stream))
    if refusal is not None:
        raise ConfigError(
            f"verify --job cannot know desired: {refusal}. --sql takes the view's query over data "
            "that holds everything the view read",
            where,
        )
    view, why_not = _view_offsets(spark, job, where)
    seeded = view is not None and why_not is None
    initial: list[Any] = []
    if view is not None and seeded:
        initial = _seed(checkpoint, view, job.sink, where)

    def keep(batch: DataFrame, batch_id: int) -> None:
        if not seeded or batch_id == 0:
            batch.write.mode("overwrite").parquet(out)
        else:  # past the view's offsets: run (a stateful query's state must commit), not kept
            batch.write.format("noop").mode("overwrite").save()

    try:
        query = (
            stream.writeStream.outputMode("complete")
            .foreachBatch(keep)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except Exception as exc:
        raise InputError(f"the job's query failed: {first_line(exc)}", where) from None
    position = None
    if view is not None and seeded:
        behind = _behind(query, checkpoint, view, initial, where)
        position = Position(
            tuple(view.sources), True, behind, _not_from_start(checkpoint, initial, job.sink, where)
        )
    elif why_not is not None:
        position = Position(tuple(view.sources) if view is not None else None, False, reason=why_not)
    if not os.path.exists(out):  # no batch ran: the sources hold nothing yet
        empty: DataFrame = spark.createDataFrame([], stream.schema)
        result = empty
    else:
        result = spark.read.parquet(out)
    if job.sink.on_error == "table":  # error rows belong in the errors table, not the view
        target = locate(job.sink.target, where, spark)
        snap = load_snapshot(target, job.sink.app_id, job.sink.storage_options, where, writing=False)
        rules = rules_for(snap, job.sink, where)
        result = result.where(rules.broken().isNull())
    return Desired(result, position)


def _view_offsets(spark: Any, job: Any, where: Where) -> tuple[RecordedOffsets | None, str | None]:
    """Under ``clock = "source_offsets"``: the view's committed offsets as its query's
    checkpoint spells them, and why desired cannot be computed at them (None: it can). Both
    None under another clock, or without a table (``verify`` says so)."""
    opts = job.sink
    if opts.clock != "source_offsets" or not opts.checkpoint:
        return None, None
    snap = load_snapshot(
        locate(opts.target, where, spark), opts.app_id, opts.storage_options, where, writing=False
    )
    if not snap.exists:
        return None, None
    try:
        view = committed_offsets(snap, opts, where)
    except ConfigError as exc:
        return None, f"its query's checkpoint could not tell the view's offsets: {exc}"
    if view is None:
        return None, (
            f"its query's checkpoint {opts.checkpoint} holds no batch that ended at the view's "
            "committed offsets"
        )
    if not view.kafka:
        return view, "only a query whose sources are all Kafka is run to a view's offsets"
    return view, None


def _seed(checkpoint: str, view: RecordedOffsets, opts: Any, where: Where) -> list[Any]:
    """Make ``checkpoint`` a query's whose batch 0 ended at the view's offsets and never
    committed: Spark runs such a batch again to exactly those offsets, from each source's
    initial offsets (``sources/<i>/0``), here the view's query's own, copied from its
    checkpoint; a source whose initial offsets that checkpoint lacks starts where a fresh query
    starts (its ``startingOffsets``, resolved now). The offsets' metadata is the view's batch's
    but for its watermark, 0 as a query's first batch has it (a watermark drops rows older than
    it, which batch 0 reads); and the checkpoint's metadata (the query's id): Spark 4 refuses
    an offset log without it. Returns each source's initial offsets seeded (None: not)."""
    version, metadata, *sources = view.text.splitlines()
    try:
        fields = json.loads(metadata)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise InputError(f"the view's offsets carry batch metadata mvsink does not know: {metadata}", where)
    fields["batchWatermarkMs"] = 0
    os.makedirs(f"{checkpoint}/offsets", exist_ok=True)
    with open(f"{checkpoint}/metadata", "w") as fh:
        fh.write(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    with open(f"{checkpoint}/offsets/0", "w") as fh:
        fh.write("\n".join([version, json.dumps(fields, separators=(",", ":")), *sources]))
    initial = [kafka_initial(opts.checkpoint, opts.storage_options, i, where) for i in range(len(sources))]
    for i, offsets in enumerate(initial):
        if offsets is not None:
            os.makedirs(f"{checkpoint}/sources/{i}", exist_ok=True)
            with open(f"{checkpoint}/sources/{i}/0", "wb") as fb:
                fb.write(kafka_initial_file(offsets))
    return initial


def _not_from_start(checkpoint: str, initial: list[Any], opts: Any, where: Where) -> str | None:
    """Why desired (run from ``checkpoint``, seeded with ``initial``) did not start where the
    view's query started, or None: it did."""
    missing = [i for i, offsets in enumerate(initial) if offsets is None]
    if not missing:
        return None
    used = [kafka_initial(checkpoint, {}, i, where) for i in missing]  # what Spark resolved
    names = ", ".join(f"sources/{i}/0" for i in missing)
    return (
        f"its query's checkpoint {opts.checkpoint} holds no initial offsets ({names}), so "
        f"desired read {'that source' if len(missing) == 1 else 'those sources'} from the job's "
        f"startingOffsets as they resolve now ({_spelled(tuple(used))}): it may differ from the view "
        "by what lies between the two starts"
    )


def _first_batch(recent: Any, wanted: list[Any], initial: list[Any], where: Where) -> None:
    """Make sure batch 0, as Spark's progress of it (``recent``: the query's recentProgress)
    says, ended at the view's offsets (``wanted``) and started at the ``initial`` offsets
    seeded where Spark says where it started (it does not for a query's first batch: its start
    is the source's initial offsets, ``sources/<i>/0``, which ``_seed`` wrote)."""
    found = [p for p in recent if p["batchId"] == 0]
    if not found:
        raise InputError(
            "verify --job ran the job's query to the view's offsets, but its progress holds none "
            "of its first batch (Spark keeps the last spark.sql.streaming.numRecentProgressUpdates "
            "batches'): whether that batch ran to the view's offsets is not known, nor desired there",
            where,
        )
    sources = found[-1]["sources"]
    ends = [_json(source["endOffset"]) for source in sources]
    if ends != wanted:
        raise InputError(
            f"verify --job seeded the job's query with the view's offsets {_spelled(tuple(wanted))}, "
            f"but its first batch ended at {_spelled(tuple(ends))}: desired is not known there",
            where,
        )
    starts = [_json(source["startOffset"]) for source in sources]
    for i, (start, seeded) in enumerate(zip(starts, initial, strict=True)):
        if start is not None and seeded is not None and start != seeded:
            raise InputError(
                f"verify --job seeded the job's query to start source {i} where the view's query "
                f"started, {_spelled((seeded,))}, but its first batch started at "
                f"{_spelled((start,))}: desired is not known there",
                where,
            )


def _behind(
    query: Any, checkpoint: str, view: RecordedOffsets, initial: list[Any], where: Where
) -> dict[str, int]:
    """Make sure batch 0 ran to the view's offsets from the initial offsets seeded
    (``_first_batch``), and count, per Kafka topic partition, how far the last batch (the
    topic's end when the query started) went past them."""
    wanted = view.sources
    _first_batch(query.recentProgress, wanted, initial, where)
    if not os.path.exists(f"{checkpoint}/commits/0"):
        raise InputError(
            "verify --job seeded the job's query with the view's offsets, but its first batch did "
            "not run: desired is not known there",
            where,
        )
    last = last_offsets(checkpoint, {}, where)
    ends = last.sources if last is not None else wanted
    behind: dict[str, int] = {}
    for at, end in zip(wanted, ends, strict=True):
        for topic, partitions in end.items():
            for partition, offset in partitions.items():
                behind[f"{topic}/{partition}"] = offset - at.get(topic, {}).get(partition, 0)
    return behind


def _json(value: Any) -> Any:
    """An offset in a query's progress: JSON text (Spark 4; ``null`` where there is none) or
    already parsed (3.5)."""
    return json.loads(value) if isinstance(value, str) else value
