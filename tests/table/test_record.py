"""What mvsink records in the Delta log (``table/record.py``): the spellings are a format that
tables already hold, so each is pinned here, and what is written parses back."""

from __future__ import annotations

import hashlib

from mvsink.table.record import (
    EpochCommit,
    EpochRecord,
    Keys,
    app_id,
    compact_metadata,
    metrics_app_id,
    promote_metadata,
    promotions,
    views_of,
)


def _d(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def test_the_app_transactions_keep_their_spellings() -> None:
    keys = Keys.of("orders")
    assert app_id("orders") == keys.frontier == keys.app_id == "mvsink:orders"
    assert keys.at == "mvsink:orders#at"
    assert keys.compacted == "mvsink:orders#compacted"
    assert keys.owner == "mvsink:orders#owner"
    assert keys.generation("q1") == f"mvsink:orders#gen@{_d('q1')}"
    assert keys.lineage_frontier("q1") == f"mvsink:orders@{_d('q1')}"
    assert keys.active == "mvsink:orders#active"
    assert keys.writer("w1") == f"mvsink:orders#writer@{_d('w1')}"
    assert keys.tombstones == "mvsink:orders#tombstones"
    assert keys.clock("0.kafka.3") == "mvsink:orders~0.kafka.3"
    assert metrics_app_id("orders", "/t") == f"mvsink-metrics:orders@{_d('/t')}"


def test_an_epochs_record_parses_back() -> None:
    record = EpochRecord(
        view="orders",
        mode="upsert",
        epoch=7,
        lower=7,
        upper=8,
        lineage="q1",
        writer="host:1",
        inserted=3,
        retracted=2,
        files_added=2,
        files_removed=1,
        attempts=2,
        seconds=1.23456,
        phases={"diff": 0.12345},
        deletion_vectors=1,
        whole=True,
        time={"0.kafka.0": 41},
        takeover=3,
    )
    meta = record.metadata()
    assert meta["userMetadata"].startswith("mvsink view orders epoch 7: +3 -2 rows, files +2 -1 (1 with new")
    assert meta["mvsink.whole"] == "true" and meta["mvsink.takeover"] == "3" and meta["mvsink.lower"] == "7"
    parsed = EpochCommit.parse({**meta, "version": 12, "timestamp": 99})
    assert parsed is not None
    assert (parsed.version, parsed.timestamp, parsed.view, parsed.epoch, parsed.mode) == (
        12,
        99,
        "orders",
        7,
        "upsert",
    )
    assert (parsed.inserted, parsed.retracted, parsed.files_added, parsed.files_removed) == (3, 2, 2, 1)
    assert (parsed.attempts, parsed.seconds, parsed.lineage, parsed.writer) == (2, 1.235, "q1", "host:1")
    assert parsed.phases == '{"diff": 0.123}' and parsed.time == {"0.kafka.0": 41}


def test_other_commits_are_not_epochs() -> None:
    compaction = {**compact_metadata("orders", 4, 1, 100), "version": 3}
    promotion = {**promote_metadata("orders", "w1"), "version": 4}
    foreign = {"version": 5, "operation": "DELETE"}
    commits = [compaction, promotion, foreign]
    assert [EpochCommit.parse(c) for c in commits] == [None, None, None]
    assert views_of(commits) == {"orders"}
    assert promotions(commits, "orders") == [promotion] and promotions(commits, "other") == []
    # A commit written by an older mvsink, or tags mangled: fields it lacks are None.
    old = EpochCommit.parse(
        {"version": 9, "mvsink.view": "orders", "mvsink.epoch": "2", "mvsink.seconds": "x"}
    )
    assert old is not None and old.epoch == 2 and old.seconds is None and old.inserted is None
