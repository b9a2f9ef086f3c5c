"""A version's lifetimes carried in Spark tasks (``history/tasks.py``): for a view planned there,
every version exact whatever its rows' types and files; each stage's task pairs the same rows
however its input arrives (a task run again writes the same lifetimes)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from mvsink import MVSink
from mvsink.errors import Where
from mvsink.history.keep import mirror
from mvsink.history.lifetimes import Change, history_struct
from mvsink.history.tasks import FILE, POS, _Carry, _pack, _unpack
from mvsink.ops.compact import compact
from mvsink.table.delta import DataFile
from mvsink.table.schema import arrow_schema, target_struct
from mvsink.table.storage import Store
from tests.helpers import added, commit_info, frame, history_frontier, lifetimes, target_table


def _canonical_rows(rows: pa.Table) -> list[str]:
    return [json.dumps(r, sort_keys=True, default=str) for r in rows.to_pylist()]


def _canonical(rows: list[dict]) -> Counter:
    """Rows as a multiset, whatever their types (maps and lists too), NaN equal to NaN."""
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def test_a_view_planned_in_spark_tasks_has_its_history_carried_there(spark, tmp_path):
    """Placement 'distributed': a version's lifetimes are carried in Spark tasks
    (history/tasks.py), its rows shuffled by fingerprint, so equal rows meet wherever their
    files were (duplicates, NaN, structs, arrays, maps), and each carry task writes the
    lifetimes it closes (a file each, where the driver writes one)."""
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    schema = "id long, x double, s struct<a:int,b:string>, l array<int>, m map<string,int>"

    def rows(ids: range, tag: str) -> list[tuple]:
        made = [(i, float("nan") if i % 5 == 0 else i / 2, (i, tag), [i, i + 1], {"k": i}) for i in ids]
        return made + made[:6]  # rows held twice

    sink = MVSink(target, "v", history_target=history, placement="distributed", max_rows_per_file=9)
    sink(frame(spark, rows(range(40), "a"), schema), 0)
    sink(frame(spark, rows(range(40), "a")[:30] + rows(range(30, 44), "b"), schema), 1)
    sink(frame(spark, rows(range(44), "c"), schema), 2)  # a whole rewrite: every lifetime closes
    assert compact(target, "v", max_rows_per_file=100).version is not None
    sink(frame(spark, rows(range(44), "c"), schema), 3)  # completes the history over the compaction
    newest = DeltaTable(target).version()
    assert history_frontier(history, "v") == newest + 1
    held = lifetimes(history)
    view = ["id", "x", "s", "l", "m"]
    for version in range(newest + 1):
        want = _canonical(target_table(target, version).to_pylist())
        got = _canonical(
            [
                {c: r[c] for c in view}
                for r in held
                if r["opened_version"] <= version
                and (r["closed_version"] is None or r["closed_version"] > version)
            ]
        )
        assert got == want, f"version {version}"
    whole = DeltaTable(history)
    rewrite = next(
        v for v in range(whole.version() + 1) if commit_info(history, v).get("mvsink.view_version") == "2"
    )
    closed_files = [p for p in added(history, rewrite) if os.path.basename(p).startswith("c-")]
    assert len(closed_files) >= 2
    assert sum(1 for r in held if r["closed_version"] == 2) == 50  # all of version 1
    # Each mirror's rows are its view file's, in the file's order (as the driver writes them).
    for path in DeltaTable(target).file_uris():
        name = f"o-{mirror(DataFile(os.path.relpath(path, target), 0, None, {}, None))}.parquet"
        (found,) = [p for p in DeltaTable(history).file_uris() if os.path.basename(p) == name]
        assert _canonical_rows(pq.read_table(found).select(view)) == _canonical_rows(pq.read_table(path))
    # The compaction moved rows and changed no lifetime: none opened or closed at its version.
    assert not [r for r in held if newest in (r["opened_version"], r["closed_version"])]


def test_a_carry_task_pairs_the_same_rows_however_its_chunks_arrive(tmp_path):
    """Rows held several times, their lifetimes of several ages (two removed files), against
    the rows of two added files: whichever order the shuffle delivers the chunks in, the task
    gives each added row the same lifetime and closes the same ones (Spark may run a task
    again, and a mirror written from its first run must agree with the rest)."""
    view = target_struct(
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
    )
    schema = arrow_schema(history_struct(view, Where("v", "t")))

    def lifetimes_of(ids: list[int], opened: list[int | None]) -> pa.Table:
        n = len(ids)
        columns = {c: pa.nulls(n, schema.field(c).type) for c in schema.names}
        columns["id"] = pa.array(ids, pa.int64())
        columns["opened_version"] = pa.array(opened, pa.int64())
        return pa.table(columns, schema=schema)

    gone = lifetimes_of([i % 3 for i in range(12)], list(range(12)))  # id 0 opened at 0, 3, 6, 9 ...
    adds = lifetimes_of([0, 1, 0, 2, 0, 0, 1, 1], [None] * 8)
    tagged = pa.concat_tables([gone, adds])
    tagged = tagged.append_column(FILE, pa.array([0] * 6 + [1] * 6 + [2] * 4 + [3] * 4, pa.int64()))
    tagged = tagged.append_column(POS, pa.array([*range(6), *range(6), *range(4), *range(4)], pa.int64()))
    runs = []
    for seed in range(4):
        os.makedirs(tmp_path / f"h{seed}")
        rows = tagged.take(pa.array(random.Random(seed).sample(range(tagged.num_rows), tagged.num_rows)))
        chunks = [{"key": 1, "chunk": _pack(rows.slice(i, 5)), "written": None} for i in range(0, 20, 5)]
        task = _Carry(
            schema,
            2,
            Change(20, 2_000_000, 5, "epoch"),
            Store(str(tmp_path / f"h{seed}"), {}),
            "f/c-{}.parquet",
        )
        out = [r for b in task(iter([pa.RecordBatch.from_pylist(chunks)])) for r in b.to_pylist()]
        kept = {
            r["key"]: [(x["id"], x["opened_version"]) for x in _unpack([r["chunk"]]).to_pylist()]
            for r in out
            if r["key"] >= 0
        }
        (written,) = [json.loads(r["written"]) for r in out if r["key"] < 0]
        closed = pq.read_table(os.path.join(tmp_path, f"h{seed}", written["path"])).to_pylist()
        runs.append((kept, sorted((x["id"], x["opened_version"], x["closed_version"]) for x in closed)))
    assert all(run == runs[0] for run in runs)
    kept, closed = runs[0]
    # The added files' rows (numbered from 0 among the added), in place order, each with the
    # oldest lifetime of its value still free.
    assert kept == {0: [(0, 0), (1, 1), (0, 3), (2, 2)], 1: [(0, 6), (0, 9), (1, 4), (1, 7)]}
    assert closed == [(1, 10, 20), (2, 5, 20), (2, 8, 20), (2, 11, 20)]
