"""The delta-spark engine's pure parts (``mvsink/table/jvm_delta.py``): the actions it hands
the JVM, the Hadoop paths, the tested pairs and the local commit turn. Its commits through a
real JVM Delta: tests/interop/test_delta_jvm.py and tests/interop/test_jvm_commit_store.py."""

from __future__ import annotations

import json

import pytest

from mvsink.errors import EngineRefused, EngineUnavailable
from mvsink.table import jvm_delta
from mvsink.table.jvm_delta import (
    add_action,
    cdc_action,
    commit_turn,
    jvm_path,
    pair_problem,
    readd_action,
    remove_action,
    txn_action,
)


def test_actions_are_the_logs_json():
    add = add_action("a%20b.parquet", 10, {"day": "1"}, '{"numRecords":2}', True)["add"]
    assert (add["path"], add["size"], add["partitionValues"], add["dataChange"]) == (
        "a%20b.parquet",
        10,
        {"day": "1"},
        True,
    )
    held = {
        **add,
        "tags": None,
        "deletionVector": {"storageType": "u", "pathOrInlineDv": "x", "cardinality": 1},
    }
    remove = remove_action(held, False)["remove"]
    assert remove["path"] == "a%20b.parquet" and remove["deletionVector"] == held["deletionVector"]
    assert "tags" not in remove and remove["dataChange"] is False and remove["extendedFileMetadata"]
    assert cdc_action("c.parquet", 5, {})["cdc"]["dataChange"] is False
    txn = txn_action("mvsink:v", 3)["txn"]
    assert (txn["appId"], txn["version"]) == ("mvsink:v", 3)


def test_a_file_added_again_keeps_everything_but_its_vector_and_tight_bounds():
    held = {"path": "f.parquet", "size": 9, "stats": json.dumps({"numRecords": 4, "tightBounds": True})}
    again = readd_action(held, {"cardinality": 1}, True)["add"]
    assert again["path"] == "f.parquet" and again["deletionVector"] == {"cardinality": 1}
    assert json.loads(again["stats"])["tightBounds"] is False
    with pytest.raises(Exception, match="no row count"):
        readd_action({"path": "g.parquet", "stats": "{}"}, {}, True)


def test_paths_as_hadoop_names_them():
    assert jvm_path("/lake/t") == "file:///lake/t"
    assert jvm_path("s3://b/t") == "s3a://b/t" and jvm_path("gs://b/t") == "gs://b/t"
    with pytest.raises(EngineUnavailable, match="abfss"):
        jvm_path("az://c/t")


def test_only_tested_pairs_pass():
    for release, tested in jvm_delta.TESTED.items():
        assert pair_problem(f"{release}.0", f"{tested.spark}.1") is None
    problem = pair_problem("4.4.0", "3.5.5")
    assert problem is not None and "Delta 4.4.0 on Spark 3.5.5" in problem


def test_the_commit_turn_is_exclusive(tmp_path, monkeypatch):
    monkeypatch.setattr(jvm_delta, "COMMIT_TURN_TIMEOUT_S", 0.1)
    root = str(tmp_path)
    with commit_turn(root), pytest.raises(EngineRefused, match="held the commit turn"), commit_turn(root):
        pass
    with commit_turn(root):  # released
        pass
