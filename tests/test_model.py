"""Model-based test (issue 34): random histories run against the real sink and against a
reference model written from the docs (``tests/reference_model.py``), compared after every step.

Each history is one view on a fresh local Delta table, driven through ``MVSink`` called
directly (``sink(batch_df, epoch)``) with the suite's Spark session, by a hypothesis state
machine. A history draws its options (partitioned or not, small files, placement, cluster_by,
compact_every, allow_gaps, heartbeat; in upsert mode a key of one or two columns, a delete
and/or a sequence column of type long or double), then its steps:

- an epoch of one of the sinks, after a restart (a new ``MVSink`` object, as from a
  checkpoint) or not: its next epoch, a replay of an old one (the same batch, or another), or
  one past a gap; batches of a few rows with duplicates, nulls, NaN, empty batches and, now and
  then, bad input (which must raise and leave the table unchanged); in upsert mode with a
  sequence, late events for keys the table holds or deleted;
- two sinks of one lineage as replicas, in turn on the same epoch;
- a new lineage (default, adopt or fail policy; from epoch 0 or later, with ``as_of`` or not)
  taking over or refused; a standby (``read_only=True``) of the primary's lineage or its own;
  promotions (``sink.promote()`` or the CLI), failback included; a sink asking for another
  partitioning (``ConfigError``);
- another writer's appends and deletes (delta-rs directly), and compaction (the function or
  the CLI);
- redeployments (docs/modes.md, "A view owns its table"): an upsert view keyed otherwise, a
  query with another schema (refused when they would commit, left alone when they skip), a
  renamed view (refused), then taking the table over on purpose (the old view's sinks
  refused from then on), and a table another tool wrote before the view's first commit,
  refused and then taken over with ``take_over="foreign"``.

After every step the table (delta-rs reading it) must equal the model as a multiset (NaN equal
to NaN, None a value) and the frontier must be the model's. Every epoch's answer (committed,
unchanged, replay, fenced, read_only, before_as_of or an error) must be one the model allows;
a committed epoch makes one version and reports the rows the model inserts and retracts; an
epoch that commits nothing leaves the Delta log as it was.

Runs: ``make test`` runs a short set of histories per profile from fixed seeds (no shrinking:
a failure prints its whole history; ``MVSINK_MODEL_SHRINK=1`` shrinks it). ``make fuzz`` runs a
long one from a random seed it prints (``MVSINK_FUZZ_EXAMPLES``, ``MVSINK_FUZZ_STEPS``;
``MVSINK_FUZZ_SEED`` replays one) and shrinks a failure to a minimal history. Each run prints
how many histories, steps and epochs it ran, by kind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import mvsink
from mvsink import (
    ConfigError,
    IdentityChangedError,
    InputError,
    LineageError,
    MVSink,
    MVSinkError,
    SchemaMismatchError,
    TableHeldError,
    frontier,
)
from mvsink.cli.main import main
from mvsink.compat import to_arrow
from mvsink.ops.compact import compact
from mvsink.ops.history import compact_history
from mvsink.table.record import HistoryKeys
from tests.helpers import commit_info, target_table, versions
from tests.reference_model import Row, Shape, Sink, View

# Commits go through delta-rs here: the Delta line's engine is the other suites' business.
pytestmark = [pytest.mark.single_engine, pytest.mark.newest_line]

NAME = "m"
PROFILES = ("complete", "append", "upsert", "upsert_tombstones")
"""``upsert`` draws one of key only, key + delete column, key + sequence column per history;
``upsert_tombstones`` has both columns (a delete leaves a tombstone)."""

KEYS = st.sampled_from([0, 1, 2, 3, None])  # upsert mode: a null key only as bad input
VALUES = st.sampled_from([1.0, 2.0, math.nan, None])
PARTS = st.sampled_from(["a", "b", None, ""])  # "" only where the target is not partitioned
SEQS = st.integers(0, 5)
ROWS = st.lists(st.tuples(KEYS, VALUES, PARTS, SEQS, st.booleans()), max_size=4)
BAD = st.sampled_from(
    [None] * 10 + ["dup_key", "null_key", "null_seq", "nan_seq", "null_del", "tie", "empty_partition"]
)
"""What spoils a batch (``SinkModel._batch``); a kind that does not apply to the view is None."""
HANDLE = st.integers(0, 7)  # a sink, modulo how many there are
FOREIGN_ROWS = st.lists(st.tuples(KEYS, VALUES, PARTS, st.one_of(st.none(), SEQS)), min_size=1, max_size=3)
FOREIGN_DELETES = st.sampled_from([("k", 0), ("k", 1), ("k", 2), ("k", None), ("p", "a"), ("p", None)])


@dataclass
class Handle:
    """One MVSink object of the history, with what the model knows of it."""

    name: str
    model: Sink
    options: dict[str, Any]
    sink: MVSink
    next: int = 0
    """The epoch this sink's query runs next: an epoch that raised is run again."""


class SinkModel(RuleBasedStateMachine):
    """One history: one view, its sinks, other writers; the real table against ``View``."""

    def __init__(self, spark: Any, base: str, profile: str, tally: Counter[str]) -> None:
        super().__init__()
        self.spark = spark
        self.profile = profile
        self.tally = tally
        tally["histories"] += 1
        self.folder = os.path.join(base, f"h{tally['histories']}")
        self.target = os.path.join(self.folder, "view")
        self.view: View | None = None
        self.handles: list[Handle] = []
        self.batches: dict[tuple[str, int], list[Row]] = {}
        """The batch each (lineage, epoch) committed: what a replay of it runs again."""
        self.last: Handle | None = None
        """The sink that committed last: the one that moves the view on."""
        self.name = NAME
        """The view holding the table (another after a takeover by a second view)."""

    def teardown(self) -> None:
        if self.view is not None:
            self.tally.update(self.view.stats)
        if not os.environ.get("MVSINK_MODEL_KEEP"):
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- set-up -----------------------------------------------------------------------------

    @initialize(
        partitioned=st.sampled_from([False, False, True]),
        small_files=st.booleans(),
        placement=st.sampled_from(["driver", "driver", "distributed"]),
        compact_every=st.sampled_from([None, None, 3]),
        allow_gaps=st.booleans(),
        variant=st.sampled_from(["key", "delete", "sequence"]),
        seq_type=st.sampled_from(["long", "double"]),
        lineage=st.sampled_from([None, "A"]),
        heartbeat=st.sampled_from([None, None, 0, 2]),
        composite=st.booleans(),
        cluster=st.booleans(),
    )
    def configure(
        self,
        partitioned: bool,
        small_files: bool,
        placement: str,
        compact_every: int | None,
        allow_gaps: bool,
        variant: str,
        seq_type: str,
        lineage: str | None,
        heartbeat: int | None,
        composite: bool,
        cluster: bool,
    ) -> None:
        mode = "upsert" if self.profile.startswith("upsert") else self.profile
        tombstones = self.profile == "upsert_tombstones"
        self.shape = Shape(
            mode,
            delete=tombstones or (mode == "upsert" and variant == "delete"),
            sequence=tombstones or (mode == "upsert" and variant == "sequence"),
            partitioned=partitioned,
            composite=mode == "upsert" and composite,
            heartbeat=heartbeat if mode == "complete" else None,
        )
        self.seq_type = seq_type
        self.view = View(self.shape)
        self.compact_every = compact_every
        self.ddl = ", ".join(
            f"{c} {t}"
            for c, t in {"k": "long", "v": "double", "p": "string", "seq": seq_type, "del": "boolean"}.items()
            if c in self.shape.batch_columns
        )
        self.common: dict[str, Any] = {
            "mode": mode,
            "partition_by": ["p"] if partitioned else None,
            "placement": placement,
            "max_rows_per_file": 2 if small_files else 50_000,
            "cluster_by": ["k"] if cluster else [],
            "compact_every": compact_every,
            "allow_gaps": allow_gaps,
            "retry": {"initial_backoff_s": 0},
        }
        if mode == "complete" and heartbeat is not None:
            self.common["heartbeat"] = heartbeat
        if mode == "upsert":
            self.common["key"] = ["k", "p"] if self.shape.composite else ["k"]
            if self.shape.delete:
                self.common["delete_column"] = "del"
            if self.shape.sequence:
                self.common["sequence_column"] = "seq"
        self.primary = self._add("primary", lineage=lineage, writer="w-primary")

    def _add(self, name: str, *, lineage: str | None, writer: str, **extra: Any) -> Handle:
        options = {**self.common, "lineage": lineage, "writer": writer, **extra}
        options["history_target"] = self._history()
        model = Sink(
            lineage=lineage or "direct",
            writer=writer,
            read_only=bool(options.get("read_only")),
            on_new_lineage=options.get("on_new_lineage"),
            allow_gaps=bool(options["allow_gaps"]),
            as_of=int(options.get("as_of", 0)),
        )
        handle = Handle(name, model, options, MVSink(self.target, self.name, **options))
        self.handles.append(handle)
        return handle

    def _handle(self, h: int) -> Handle:
        return self.handles[h % len(self.handles)]

    def _named(self, name: str) -> Handle | None:
        return next((x for x in self.handles if x.name == name), None)

    # --- batches ----------------------------------------------------------------------------

    def _batch(self, raw: list[tuple[Any, ...]], bad: str | None) -> list[Row]:
        """The drawn rows as a batch of the view's columns: well formed, then spoiled by
        ``bad`` where it applies."""
        shape = self.shape
        rows: list[list[Any]] = []
        for k, v, p, seq, gone in raw:
            row = [k, v, "a" if shape.partitioned and p == "" else p]
            if shape.mode == "upsert":
                row[0] = 0 if k is None else k
                if shape.composite and row[2] in (None, ""):
                    row[2] = "b"  # a key column: a null only as bad input
                if shape.sequence:
                    row.append(float(seq) if self.seq_type == "double" else seq)
                if shape.delete:
                    row.append(gone)
            rows.append(row)
        if shape.mode != "upsert":
            if bad == "empty_partition" and shape.partitioned:
                rows.append([1, 1.0, ""])
            return [tuple(r) for r in rows]
        if shape.sequence:  # one winner per key: drop rows tying at a key's highest sequence
            tops: dict[Any, Any] = {}
            for r in rows:
                tops[shape.key(r)] = max(tops.get(shape.key(r), r[3]), r[3])
            kept: list[list[Any]] = []
            for r in rows:
                top = r[3] == tops[shape.key(r)]
                if not (top and any(shape.key(x) == shape.key(r) and x[3] == r[3] for x in kept)):
                    kept.append(r)
            rows = kept
        else:  # one row per key: the last
            rows = list({shape.key(r): r for r in rows}.values())
        if rows:
            first = rows[0]
            same_key = (r for r in rows if shape.key(r) == shape.key(first))
            winner = max(same_key, key=lambda r: r[3] if shape.sequence else 0)
            if bad == "dup_key" and not shape.sequence:
                rows.append([first[0], 2.0 if first[1] != 2.0 else 1.0, *first[2:]])
            elif bad == "tie" and shape.sequence:
                rows.append([winner[0], 2.0 if winner[1] != 2.0 else 1.0, *winner[2:]])
            elif bad == "null_key":
                first[0] = None
            elif bad == "null_seq" and shape.sequence:
                first[3] = None
            elif bad == "nan_seq" and shape.sequence and self.seq_type == "double":
                first[3] = math.nan
            elif bad == "null_del" and shape.delete:
                winner[-1] = None
        return [tuple(r) for r in rows]

    def _stored(self, raw: list[tuple[Any, ...]]) -> list[Row]:
        """Rows another writer appends, in the target's columns."""
        out = []
        for k, v, p, seq in raw:
            row: list[Any] = [k, v, "b" if self.shape.partitioned and p == "" else p]
            if self.shape.sequence:
                row.append(None if seq is None else float(seq) if self.seq_type == "double" else seq)
            out.append(tuple(row))
        return out

    # --- one epoch ----------------------------------------------------------------------------

    def _run(
        self,
        h: Handle,
        epoch: int,
        batch: list[Row],
        *,
        refused: type[Exception] | None = None,
        judged_by: Shape | None = None,
        extra: bool = False,
    ) -> str | BaseException:
        """Run ``epoch`` of ``h`` with ``batch`` (with a column more when ``extra``: a query
        whose schema changed) and check its answer against the model's."""
        view = self._view()
        answers = view.expect(h.model, epoch, batch, refused=refused, judged_by=judged_by)
        before = self._versions()
        if extra:
            df = self.spark.createDataFrame([(*r, "x") for r in batch], self.ddl + ", extra string")
        else:
            df = self.spark.createDataFrame(batch, self.ddl)
        result: str | BaseException
        report = None
        try:
            report = h.sink(df, epoch)
            result = report.outcome
        except MVSinkError as exc:
            result = exc
        self.tally["epochs"] += 1
        self.tally[f"epoch: {_describe(result)}"] += 1
        chosen = next((a for a in answers if a.matches(result)), None)
        assert chosen is not None, (
            f"{h.name} (lineage {h.model.lineage}, writer {h.model.writer}) epoch {epoch} with "
            f"{batch}: the sink answered {_describe(result, full=True)}; the docs allow {answers}"
        )
        after = self._versions()
        if result == "committed":
            grew = len(after) - len(before)
            assert grew == 1 or (grew == 2 and self.compact_every), f"one commit made {grew} versions"
            assert report is not None
            figures = view.correction(batch, whole=report.whole)
            self.tally["epochs written whole"] += report.whole
            if figures is not None:
                assert (report.inserted, report.retracted) == figures, (
                    f"epoch {epoch} reports +{report.inserted} -{report.retracted} rows; the "
                    f"model's correction is +{figures[0]} -{figures[1]}"
                )
            view.commit(h.model, epoch, batch, chosen)
            self.batches[(h.model.lineage, epoch)] = batch
            self.last = h
        else:
            assert after == before, (
                f"{_describe(result)} at epoch {epoch} wrote versions {after[len(before) :]}"
            )
        # replicas.md: a standby's reports show the corrections it would make.
        # (A standby redeployed otherwise plans by its own options, or nothing if its desired
        # does not fit the table: its figures are not the view's.)
        if result == "read_only" and refused is None:
            assert report is not None
            figures = view.correction(batch, whole=report.whole)
            if figures is not None:
                assert (report.inserted, report.retracted) == figures, (
                    f"standby epoch {epoch} reports +{report.inserted} -{report.retracted} rows; "
                    f"the correction it would make is +{figures[0]} -{figures[1]}"
                )
        if not isinstance(result, InputError | LineageError):
            h.next = max(h.next, epoch + 1)
        return result

    def _view(self) -> View:
        assert self.view is not None
        return self.view

    def _history(self) -> str:
        """Where the view holding the table keeps its history: each view its own."""
        return os.path.join(self.folder, f"history-{self.name}")

    def _versions(self) -> list[int]:
        return versions(self.target) if os.path.isdir(os.path.join(self.target, "_delta_log")) else []

    def _restart(self, handle: Handle, restart: bool) -> None:
        """A new MVSink object with the same options: a query restarted from its checkpoint."""
        if restart:
            self.tally["restarts"] += 1
            handle.sink = MVSink(self.target, self.name, **handle.options)
            handle.model.read_only = bool(handle.options.get("read_only"))

    def _step(self, what: str) -> None:
        self.tally["steps"] += 1
        self.tally[f"step: {what}"] += 1

    # --- rules: epochs --------------------------------------------------------------------------

    @rule(rows=ROWS, bad=BAD)
    def writer_runs_its_next_epoch(self, rows: list[tuple[Any, ...]], bad: str | None) -> None:
        self._step("writer's next epoch")
        h = self.last or self.primary
        self._run(h, h.next, self._batch(rows, bad))

    @rule(h=HANDLE, restart=st.booleans(), rows=ROWS, bad=BAD)
    def a_sink_runs_its_next_epoch(
        self, h: int, restart: bool, rows: list[tuple[Any, ...]], bad: str | None
    ) -> None:
        handle = self._handle(h)
        self._restart(handle, restart)
        self._step("a sink's next epoch")
        self._run(handle, handle.next, self._batch(rows, bad))

    @rule(h=HANDLE, restart=st.booleans(), back=st.integers(1, 3), same=st.booleans(), rows=ROWS, bad=BAD)
    def a_sink_replays_an_old_epoch(
        self, h: int, restart: bool, back: int, same: bool, rows: list[tuple[Any, ...]], bad: str | None
    ) -> None:
        """Spark runs a batch again after a restart from its checkpoint (or a replica behind
        runs one): the same batch, or another where the source is not replayable."""
        handle = self._handle(h)
        self._restart(handle, restart)
        self._step("replay")
        epoch = max(0, handle.next - back)
        batch = self.batches.get((handle.model.lineage, epoch)) if same else None
        self._run(handle, epoch, batch if batch is not None else self._batch(rows, bad))

    @rule(h=HANDLE, ahead=st.integers(1, 2), rows=ROWS)
    def a_sink_skips_epochs(self, h: int, ahead: int, rows: list[tuple[Any, ...]]) -> None:
        self._step("gap")
        handle = self._handle(h)
        self._run(handle, handle.next + ahead, self._batch(rows, None))

    @rule(rows=ROWS, other=ROWS, same=st.booleans())
    def replicas_run_one_epoch_in_turn(
        self, rows: list[tuple[Any, ...]], other: list[tuple[Any, ...]], same: bool
    ) -> None:
        """Two sinks of the primary's lineage (one checkpoint, two processes): the second to
        run an epoch finds it written."""
        self._step("replicas in turn")
        replica = self._named("replica") or self._add(
            "replica", lineage=self.primary.options["lineage"], writer="w-replica"
        )
        epoch = max(self.primary.next, replica.next)
        first = self._batch(rows, None)
        self._run(replica, epoch, first)
        self._run(self.primary, epoch, first if same else self._batch(other, None))

    @precondition(lambda self: self.view is not None and bool(self.view.sequenced_keys()))
    @rule(pick=st.integers(0, 7), back=st.integers(0, 3), gone=st.booleans(), v=VALUES, p=PARTS)
    def a_late_event_arrives(self, pick: int, back: int, gone: bool, v: Any, p: Any) -> None:
        """Upsert with a sequence: the writer's next epoch carries one event for a key the table
        has a sequence for (a row or a tombstone), at that sequence or below it."""
        self._step("late event")
        keys = self._view().sequenced_keys()
        key, stored = keys[pick % len(keys)]
        k, p = key if self.shape.composite else (key, p)
        seq = stored - back
        h = self.last or self.primary
        epoch = h.next
        result = self._run(h, epoch, self._batch([(k, v, p, int(seq), gone)], None))
        if back and not gone and result == "committed":
            self._the_history_met_a_late_event(epoch, k, p, int(seq))

    def _the_history_met_a_late_event(self, epoch: int, k: Any, p: Any, seq: int) -> None:
        """docs/history.md: a late event the view did not take is a lifetime of the epoch that
        met it, which closes as it opens (no version or time holds it: ``_the_history_is_the_
        tables`` checks every version still equals the table)."""
        history = self._history()
        late = [
            r
            for r in DeltaTable(history).to_pyarrow_table().to_pylist()
            if r["opened_by"] == "late" and r["opened_epoch"] == epoch and r["k"] == k and r["seq"] == seq
        ]
        assert late, f"epoch {epoch} met a late event (k={k}, seq={seq}) its history does not hold"
        assert all(r["valid_from"] == r["valid_to"] and r["closed_by"] == "late" for r in late)
        if self.shape.composite:
            assert any(r["p"] == p for r in late)
        self.tally["late events the history held"] += 1

    # --- rules: sinks come and go ---------------------------------------------------------------

    @precondition(lambda self: len(self.handles) < 6)
    @rule(
        policy=st.sampled_from([None, "adopt", "fail"]),
        start=st.integers(0, 2),
        as_of=st.booleans(),
        rows=ROWS,
        bad=BAD,
    )
    def a_new_lineage_arrives(
        self, policy: str | None, start: int, as_of: bool, rows: list[tuple[Any, ...]], bad: str | None
    ) -> None:
        """A new checkpoint (a redeploy, a second query), its first epoch ``start`` (its
        ``as_of`` when ``as_of``): it takes the view over or is refused."""
        self._step("new lineage")
        n = sum(1 for x in self.handles if x.name.startswith("L")) + 1
        extra = {"as_of": start} if as_of else {}
        handle = self._add(f"L{n}", lineage=f"L{n}", writer=f"w-L{n}", on_new_lineage=policy, **extra)
        result = self._run(handle, start, self._batch(rows, bad))
        if isinstance(result, LineageError):
            self.handles.remove(handle)  # refused: that job stops

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(h=HANDLE, rows=ROWS)
    def a_sink_asks_for_other_partitions(self, h: int, rows: list[tuple[Any, ...]]) -> None:
        """modes.md: ``partition_by`` must match an existing target's, or ``ConfigError``."""
        self._step("other partitioning")
        handle = self._handle(h)
        options = {**handle.options, "partition_by": ["k"]}
        other = Handle(
            handle.name, handle.model, options, MVSink(self.target, self.name, **options), handle.next
        )
        self._run(other, other.next, self._batch(rows, None), refused=ConfigError)

    # --- rules: redeployments -----------------------------------------------------------------

    @precondition(lambda self: self.view is not None and self.view.exists and self.shape.mode == "upsert")
    @rule(h=HANDLE, rows=ROWS)
    def a_sink_is_redeployed_with_another_key(self, h: int, rows: list[tuple[Any, ...]]) -> None:
        """modes.md: a sink of an upsert view keyed otherwise is refused whenever it would
        commit (``IdentityChangedError``); one that only skips writes nothing."""
        self._step("redeploy: another key")
        handle = self._handle(h)
        options = {**handle.options, "key": ["k"] if self.shape.composite else ["k", "p"]}
        other = Handle(
            handle.name, handle.model, options, MVSink(self.target, self.name, **options), handle.next
        )
        # The batch is judged by the other key: a standby plans by it (a tie under it is bad input).
        by = dataclasses.replace(self.shape, composite=not self.shape.composite)
        self._run(other, other.next, self._batch(rows, None), refused=IdentityChangedError, judged_by=by)

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(h=HANDLE, rows=ROWS)
    def a_sink_is_redeployed_with_another_schema(self, h: int, rows: list[tuple[Any, ...]]) -> None:
        """modes.md: a query with a column more is refused whenever it would commit
        (``schema_changes`` is ``refuse``); one that only skips is left alone."""
        self._step("redeploy: another schema")
        handle = self._handle(h)
        other = Handle(
            handle.name,
            handle.model,
            handle.options,
            MVSink(self.target, self.name, **handle.options),
            handle.next,
        )
        self._run(other, other.next, self._batch(rows, None), refused=SchemaMismatchError, extra=True)

    @precondition(lambda self: self.view is not None and self.view.exists and self.name == NAME)
    @rule(rows=ROWS, old=ROWS)
    def a_second_view_takes_the_table_over(
        self, rows: list[tuple[Any, ...]], old: list[tuple[Any, ...]]
    ) -> None:
        """A renamed view is refused (modes.md: a view never writes a table another view
        holds); taking the table on purpose (``take_over``), its first epoch commits on the
        rows as they are, and every sink of the old view is refused from then on when it would
        commit (a skip writes nothing)."""
        self._step("redeploy: a second view takes over")
        view, old_name = self._view(), self.name
        before = self._versions()
        renamed = {**self.common, "lineage": "T", "writer": "w-T"}
        with pytest.raises(TableHeldError):
            MVSink(self.target, f"{NAME}2", **renamed)(
                self.spark.createDataFrame(self._batch(rows, None), self.ddl), 0
            )
        assert self._versions() == before
        view.handed_over()
        self.name = f"{NAME}2"
        previous = self.handles
        self.handles, self.batches, self.last = [], {}, None
        self.primary = self._add("primary2", lineage="T", writer="w-T", take_over=old_name)
        result = self._run(self.primary, 0, self._batch(rows, None))
        assert result == "committed", f"the takeover answered {_describe(result, full=True)}"
        for h in previous:
            before = self._versions()
            df = self.spark.createDataFrame(self._batch(old, None), self.ddl)
            try:
                outcome: str | BaseException = h.sink(df, h.next).outcome
            except (TableHeldError, LineageError) as exc:
                outcome = exc
            assert isinstance(outcome, BaseException) or outcome in (
                "replay",
                "fenced",
                "read_only",
                "before_as_of",
            ), f"{h.name} of the old view answered {outcome} after the takeover"
            assert self._versions() == before

    @precondition(lambda self: self.view is not None and not self.view.exists and not self._versions())
    @rule(foreign=FOREIGN_ROWS, rows=ROWS)
    def a_foreign_table_is_refused_then_adopted(
        self, foreign: list[tuple[Any, ...]], rows: list[tuple[Any, ...]]
    ) -> None:
        """Another tool wrote a table with the view's columns before the view's first commit:
        the view refuses it (``TableHeldError``), then takes it with ``take_over="foreign"``."""
        self._step("redeploy: a foreign table adopted")
        stored = self._stored(foreign)
        types = {"k": pa.int64(), "v": pa.float64(), "p": pa.string()}
        types["seq"] = pa.float64() if self.seq_type == "double" else pa.int64()
        columns = self.shape.stored_columns
        schema = pa.schema([(c, types[c]) for c in columns])
        write_deltalake(
            self.target,
            pa.Table.from_pylist([dict(zip(columns, r, strict=True)) for r in stored], schema=schema),
            partition_by=["p"] if self.shape.partitioned else None,
        )
        h = self.primary
        batch = self._batch(rows, None)
        before = self._versions()
        with pytest.raises((TableHeldError, LineageError)):
            h.sink(self.spark.createDataFrame(batch, self.ddl), h.next)
        assert self._versions() == before
        self._view().foreign_append(stored)
        h.options = {**h.options, "take_over": "foreign"}
        h.sink = MVSink(self.target, self.name, **h.options)
        if self._run(h, h.next, batch) != "committed":
            shutil.rmtree(self.target)  # not taken: the foreign table goes, as if never made
            self._view().forget_foreign()

    @precondition(lambda self: self._named("standby") is None)
    @rule(same_lineage=st.booleans())
    def a_standby_starts(self, same_lineage: bool) -> None:
        """A read-only replica: of the primary's lineage, or with a checkpoint of its own (then,
        outside complete mode, it may adopt the view late: replicas.md)."""
        self._step("standby")
        extra: dict[str, Any] = {"read_only": True}
        if not same_lineage and self.shape.mode != "complete":
            extra |= {"on_new_lineage": "adopt", "allow_gaps": True}
        lineage = self.primary.options["lineage"] if same_lineage else "S"
        standby = self._add("standby", lineage=lineage, writer="w-standby", **extra)
        if same_lineage:
            standby.next = self.primary.next

    @rule(h=HANDLE, cli=st.booleans())
    def a_writer_is_promoted(self, h: int, cli: bool) -> None:
        self._step("promote")
        handle = self._handle(h)
        writer = handle.model.writer
        view = self._view()
        command = ["promote", self.target, "--name", self.name, "--writer", writer]
        if not view.exists:
            if cli:
                assert main(command) == 2
            else:
                with pytest.raises(ConfigError):
                    handle.sink.promote()
            return
        before = self._versions()
        if cli:
            assert main(command) == 0
        else:
            handle.sink.promote()
            handle.model.read_only = False
            # A sink made again from its options (a restart, a redeployment) is the promoted
            # one, as a deployment promoted this way would run on: not read-only.
            handle.options["read_only"] = False
        assert len(self._versions()) == len(before) + 1
        view.promote(writer)

    # --- rules: others at the table --------------------------------------------------------------

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(rows=FOREIGN_ROWS)
    def another_writer_appends(self, rows: list[tuple[Any, ...]]) -> None:
        self._step("foreign append")
        stored = self._stored(rows)
        schema = pa.schema(DeltaTable(self.target).schema().to_arrow())
        columns = self.shape.stored_columns
        write_deltalake(
            self.target,
            pa.Table.from_pylist([dict(zip(columns, r, strict=True)) for r in stored], schema=schema),
            mode="append",
        )
        self._view().foreign_append(stored)

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(where=FOREIGN_DELETES)
    def another_writer_deletes(self, where: tuple[str, Any]) -> None:
        self._step("foreign delete")
        column, value = where
        predicate = f"{column} IS NULL" if value is None else f"{column} = {value!r}"
        DeltaTable(self.target).delete(predicate)
        self._view().foreign_delete(self.shape.stored_columns.index(column), value)

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(cli=st.booleans())
    def the_table_is_compacted(self, cli: bool) -> None:
        """Merging small files changes no row and leaves the frontier."""
        self._step("compact")
        before = self._versions()
        if cli:
            assert main(["compact", self.target, "--name", self.name, "--max-rows-per-file", "40"]) == 0
        else:
            compact(self.target, self.name, max_rows_per_file=40)
        self.tally["compactions that merged files"] += len(self._versions()) - len(before)

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(pick=st.integers(0, 1000))
    def the_history_drops_what_ended_before_a_past_version(self, pick: int) -> None:
        """docs/history.md: the history's retention drops lifetimes that ended before its start
        (here, a past version's time), never an open one; the history then knows the view from
        past every lifetime it dropped, and whole from there (the invariants check it)."""
        history = self._history()
        if not os.path.isdir(os.path.join(history, "_delta_log")):
            return
        held = [v for v in self._versions() if v < (_held(history, self.name)[1])]
        if not held:
            return
        self._step("history retention")
        cut = _stamp(self.target, held[pick % len(held)])
        opened = sorted(map(str, (r for r in _lifetimes(history) if r["valid_to"] is None)))
        done = compact_history(
            self.target, self.name, retention="1s", history_target=history, now_ms=cut + 1000
        )
        assert sorted(map(str, (r for r in _lifetimes(history) if r["valid_to"] is None))) == opened
        self.tally["lifetimes the retention dropped"] += done.dropped

    # --- after every step --------------------------------------------------------------------------

    @invariant()
    def the_table_is_the_model(self) -> None:
        if self.view is None:
            return
        view = self.view
        if not view.exists:
            assert self._versions() == [], "nothing committed, yet the target has versions"
            return
        columns = list(self.shape.stored_columns)
        table = target_table(self.target)
        got = view.visible(tuple(r[c] for c in columns) for r in table.select(columns).to_pylist())
        want = view.visible(view.rows)
        assert got == want, f"the table differs from the model: extra {got - want}, missing {want - got}"
        assert frontier(self.target, self.name) == view.frontier
        self._the_history_is_the_tables()

    def _the_history_is_the_tables(self) -> None:
        """docs/history.md: the history holds the table at every version since it began (as a
        multiset, lifetimes read with delta-rs), and every version an epoch of the view
        committed right after it (H3); only foreign writes and compactions may wait for the
        next epoch."""
        history = self._history()
        if not os.path.isdir(os.path.join(history, "_delta_log")):
            return
        since, upto = _held(history, self.name)
        table = DeltaTable(history)
        epochs = [v for v in self._versions() if "mvsink.epoch" in commit_info(self.target, v)]
        if epochs and commit_info(self.target, epochs[-1]).get("mvsink.view") == self.name:
            assert upto > epochs[-1], f"the history holds versions up to {upto - 1}, the view {epochs[-1]}"
        lifetimes = table.to_pyarrow_table().to_pylist()
        columns = list(self.shape.stored_columns)
        view = self._view()
        for version in range(since, upto):
            rows = [
                tuple(r[c] for c in columns)
                for r in lifetimes
                if r["opened_version"] <= version
                and (r["closed_version"] is None or r["closed_version"] > version)
            ]
            stored = target_table(self.target, version).select(columns).to_pylist()
            want = view.visible(tuple(r[c] for c in columns) for r in stored)
            got = view.visible(rows)
            assert got == want, f"the history at version {version}: extra {got - want}, missing {want - got}"
        self.tally["versions the history held"] = max(self.tally["versions the history held"], upto)

    @precondition(lambda self: self.view is not None and self.view.exists)
    @rule(pick=st.integers(0, 1000), by_time=st.booleans())
    def the_view_is_read_as_of_a_past_version(self, pick: int, by_time: bool) -> None:
        """``mvsink.as_of`` at a version its history holds (or at that version's commit time)
        is the table at that version."""
        history = self._history()
        if not os.path.isdir(os.path.join(history, "_delta_log")):
            return
        since, upto = _held(history, self.name)
        held = [v for v in self._versions() if since <= v < upto]
        if not held:
            return
        self._step("read as of a past version")
        version = held[pick % len(held)]
        if (
            by_time
            and version + 1 in held
            and _stamp(self.target, version + 1) > _stamp(self.target, version)
        ):
            when = dt.datetime.fromtimestamp(_stamp(self.target, version) / 1000, dt.UTC)
            frame = mvsink.as_of(self.spark, self.target, self.name, when, history_target=history)
        else:
            frame = mvsink.as_of(self.spark, self.target, self.name, version=version, history_target=history)
        columns = list(self.shape.stored_columns)
        view = self._view()
        got = view.visible(tuple(r[c] for c in columns) for r in to_arrow(frame).select(columns).to_pylist())
        stored = target_table(self.target, version).select(columns).to_pylist()
        want = view.visible(tuple(r[c] for c in columns) for r in stored)
        assert got == want, f"as_of version {version}: extra {got - want}, missing {want - got}"


def _held(history: str, view: str) -> tuple[int, int]:
    """The versions of the view's table ``history`` holds whole: ``since .. upto - 1`` (where it
    began, or past what its retention dropped; ``#since`` records the first plus one)."""
    table = DeltaTable(history)
    keys = HistoryKeys(view)
    upto = table.transaction_version(keys.frontier)
    assert upto is not None, "the history records no frontier"
    since = table.transaction_version(keys.since)
    return (0 if since is None else int(since) - 1), int(upto)


def _lifetimes(history: str) -> list[dict[str, Any]]:
    return DeltaTable(history).to_pyarrow_table().to_pylist()


def _stamp(target: str, version: int) -> int:
    """The commit time of ``version`` of ``target``, ms (the time its history gives it, unless
    an earlier version's was later)."""
    info = commit_info(target, version)
    return int(info.get("inCommitTimestamp") or info["timestamp"])


def _describe(result: str | BaseException, *, full: bool = False) -> str:
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {result}" if full else type(result).__name__
    return result


# --- runs ----------------------------------------------------------------------------------------


class Plan(NamedTuple):
    examples: int
    steps: int
    seed: int
    shrink: bool
    fuzz: bool


def _plan(profile: str) -> Plan:
    """The short run (fixed seeds, ``make test``), or a fuzz run (``MVSINK_FUZZ_EXAMPLES``)."""
    offset = PROFILES.index(profile)
    fuzz = os.environ.get("MVSINK_FUZZ_EXAMPLES")
    if fuzz:
        base = int(os.environ.get("MVSINK_FUZZ_SEED") or random.randrange(2**32))
        steps = int(os.environ.get("MVSINK_FUZZ_STEPS", "30"))
        return Plan(int(fuzz), steps, base + offset, True, True)
    # make test runs 3 histories a profile; make soak (by hand) 8 more, other seeds.
    soak = bool(os.environ.get("MVSINK_SOAK"))
    examples = int(os.environ.get("MVSINK_MODEL_EXAMPLES", "8" if soak else "3"))
    steps = int(os.environ.get("MVSINK_MODEL_STEPS", "15"))
    base = 35_000 if soak else 34_000
    return Plan(examples, steps, base + offset, bool(os.environ.get("MVSINK_MODEL_SHRINK")), False)


@pytest.mark.parametrize("profile", PROFILES)
def test_random_histories_match_the_reference_model(
    spark: Any, tmp_path: Any, profile: str, capsys: pytest.CaptureFixture[str], record_property: Any
) -> None:
    from hypothesis.stateful import get_state_machine_test

    plan = _plan(profile)
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if plan.shrink else [])]
    tally: Counter[str] = Counter()
    test = get_state_machine_test(
        lambda: SinkModel(spark, str(tmp_path), profile, tally),
        settings=settings(
            max_examples=plan.examples,
            stateful_step_count=plan.steps,
            deadline=None,
            derandomize=False,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        ),
    )
    started = time.monotonic()
    try:
        seed(plan.seed)(test)()
    finally:
        figures = ", ".join(f"{k} {n}" for k, n in sorted(tally.items()) if k not in ("histories", "steps"))
        line = (
            f"model [{profile}] seed {plan.seed}{' (fuzz)' if plan.fuzz else ''}: {tally['histories']} "
            f"histories, {tally['steps']} steps in {time.monotonic() - started:.0f}s ({figures})"
        )
        record_property("model", line)
        with capsys.disabled():
            print(f"\n{line}")
