"""An upsert view's late events, kept for its history: written with the epoch's files, read
through their manifest, kept while the view's log can name their version, then swept."""

from __future__ import annotations

import os
import shutil
import time

import pyarrow as pa
import pytest

from mvsink import failpoints
from mvsink.compat import to_arrow
from mvsink.errors import Where
from mvsink.plan import late
from mvsink.table.layout import Layout
from mvsink.table.schema import target_schema_json
from mvsink.table.storage import Store
from tests.helpers import KEYED, keyed, late_folders, lifetimes

pytestmark = pytest.mark.usefixtures("engine")

SCHEMA = KEYED


def test_events_written_on_the_driver_and_by_tasks_read_back_through_the_manifest(spark, tmp_path):
    frame = spark.createDataFrame([(i, f"v{i}", i, False) for i in range(50)], SCHEMA).repartition(4)
    layout = Layout(target_schema_json(frame.schema), frame.schema, ())
    store = Store(str(tmp_path), {})
    for rows in (to_arrow(frame), frame):  # on the driver, and by Spark tasks
        events = late.LateEvents.of("keyed", rows, layout, Where("keyed", str(tmp_path)))
        written = events.write(store)
        parts = late.parts(store, "keyed", events.number)
        assert parts is not None and written == [*parts, f"{late.folder('keyed', events.number)}/late.json"]
        got = pa.concat_tables([late.read(store, p, layout.arrow) for p in parts])
        assert sorted(got.column("id").to_pylist()) == list(range(50))
        assert events.side().commits and events.side().folder == late.folder("keyed", events.number)
    assert late.parts(store, "keyed", 12345) is None  # no such folder


def test_only_the_parts_the_attempt_reported_are_read(spark, tmp_path):
    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history, "distributed")
    sink(spark.createDataFrame([(1, "a", 5, False), (2, "b", 5, False)], SCHEMA), 0)
    with failpoints.armed({"after_commit": "raise"}, view="keyed"), pytest.raises(failpoints.InjectedFault):
        sink(spark.createDataFrame([(1, "old", 4, False), (2, "older", 3, False)], SCHEMA), 1)
    # A failed task attempt's file beside the reported ones (a re-run task writes another).
    (name,) = late_folders(target)
    folder = os.path.join(target, "_mvsink", "keyed", "late", name)
    part = next(f for f in os.listdir(folder) if f.endswith(".parquet"))
    shutil.copy(os.path.join(folder, part), os.path.join(folder, "part-left-by-a-failed-task.parquet"))
    keyed(target, history)(spark.createDataFrame([(3, "c", 1, False)], SCHEMA), 2)
    late = sorted(r["v"] for r in lifetimes(history) if r["opened_by"] == "late")
    assert late == ["old", "older"]


def test_late_folders_past_their_keeping_are_swept(spark, tmp_path):
    from mvsink.plan import late
    from mvsink.table.storage import Store

    target, history = str(tmp_path / "t"), str(tmp_path / "h")
    sink = keyed(target, history)
    sink(spark.createDataFrame([(1, "a", 5, False)], SCHEMA), 0)
    sink(spark.createDataFrame([(1, "old", 4, False)], SCHEMA), 1)
    store = Store(target, {})
    assert late.sweep(store, "keyed") == 0 and len(late_folders(target)) == 1
    assert late.sweep(store, "keyed", now_ms=int(time.time() * 1000) + late.KEEP_MS + 60_000) == 1
    assert late_folders(target) == []
