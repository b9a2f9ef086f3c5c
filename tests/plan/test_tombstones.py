"""A view's tombstones (upsert mode with a sequence and a delete column): how long they are
kept, what an epoch makes of them, and a set as storage holds it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mvsink.errors import ConfigError, InvariantViolation, Where
from mvsink.plan import tombstones
from mvsink.plan.tombstones import DELETED_AT, Changes, Manifest, NewSet, next_set
from mvsink.table.storage import Store

WHERE = Where("v", "/t", 1)
SCHEMA = pa.schema([("k", pa.int64()), ("seq", pa.int64()), (DELETED_AT, pa.int64())])


def test_tombstones_are_kept_for_the_option_else_the_tables_retention() -> None:
    assert tombstones.retention_ms("2h", {}, WHERE) == 2 * 3600 * 1000
    assert tombstones.retention_ms(None, {}, WHERE) == 7 * 24 * 3600 * 1000
    week = {"delta.deletedFileRetentionDuration": "interval 1 day"}
    assert tombstones.retention_ms(None, week, WHERE) == 24 * 3600 * 1000
    with pytest.raises(ConfigError, match="tombstone_retention"):
        tombstones.retention_ms(None, {"delta.deletedFileRetentionDuration": "soon"}, WHERE)


def test_the_next_set_keeps_untouched_tombstones_and_replaces_changed_ones() -> None:
    live = pa.table({"k": [1, 2, 3], "seq": [10, 20, 30], DELETED_AT: [5, 5, 5]}, schema=SCHEMA)
    keys = pa.schema([("k", pa.int64())])
    changes = Changes(
        pa.table({"k": [2, 4], "seq": [21, 40]}),
        pa.table({"k": [3]}, schema=keys),
    )
    after = next_set(live, changes, ["k"], now_ms=99)
    assert sorted(zip(*(after.column(c).to_pylist() for c in SCHEMA.names), strict=True)) == [
        (1, 10, 5),
        (2, 21, 99),
        (4, 40, 99),
    ]
    assert Changes(changes.set.slice(0, 0), changes.cleared.slice(0, 0)).empty and not changes.empty


def test_a_set_written_on_the_driver_is_read_back_from_its_manifest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    rows = pa.table({"k": [1, 2], "seq": [10, 20], DELETED_AT: [7, 3]}, schema=SCHEMA)
    made = NewSet(4, "v", "app", rows, SCHEMA)
    paths = made.write(store)
    manifest = Manifest.read(store, "v", 4)
    assert (manifest.rows, manifest.oldest, manifest.under) == (2, 3, ("k", "seq"))
    assert paths == [*manifest.parts, f"{tombstones.folder('v', 4)}/{tombstones.MANIFEST}"]
    side = made.side()
    assert side.folder == tombstones.folder("v", 4) and dict(side.transactions) == {
        tombstones.record("app"): 4
    }
    with pytest.raises(InvariantViolation, match="missing"):
        Manifest.read(store, "v", 5, WHERE)
