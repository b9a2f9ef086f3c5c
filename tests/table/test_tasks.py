"""Spark tasks' side of staging: how a task's mvsink error reaches the driver, and how a
snapshot's file is described to a task."""

from __future__ import annotations

import json

import pytest

from mvsink.errors import InputError, InvariantViolation, StorageError, Where
from mvsink.table.tasks import in_task, raise_task_errors, task_file

WHERE = Where("v", "/t", 4)


def raised_in_task(error: BaseException) -> Exception:
    with pytest.raises(ValueError) as info, in_task("writing under f"):
        raise error
    return info.value


def test_an_mvsink_error_in_a_task_is_raised_again_on_the_driver() -> None:
    with pytest.raises(InputError, match="bad rows") as info:
        raise_task_errors(raised_in_task(InputError("bad rows")), WHERE)
    assert info.value.where == WHERE


def test_a_storage_error_in_a_task_names_what_the_task_did() -> None:
    with pytest.raises(StorageError, match="writing under f: disk full"):
        raise_task_errors(raised_in_task(OSError("disk full")), WHERE)


def test_an_mvsink_error_of_another_kind_comes_back_as_an_invariant_violation() -> None:
    from mvsink.errors import SchemaMismatchError

    with pytest.raises(InvariantViolation, match="odd"):
        raise_task_errors(raised_in_task(SchemaMismatchError("odd")), WHERE)


def test_an_error_that_is_not_a_tasks_mvsink_error_is_left_alone() -> None:
    raise_task_errors(ValueError("something else"), WHERE)  # raises nothing
    with pytest.raises(KeyError), in_task("x"):
        raise KeyError("not ours")


def test_a_task_rebuilds_the_file_its_row_describes() -> None:
    row = {"path": "p=1/a.parquet", "size": 10, "rows": 3, "partition_values": json.dumps({"p": "1"})}
    file = task_file({**row, "deletion_vector": None})
    assert (file.path, file.size, file.num_records, dict(file.partition_values)) == (
        "p=1/a.parquet",
        10,
        3,
        {"p": "1"},
    )
    assert file.deletion_vector is None
    vector = {"storageType": "u", "sizeInBytes": 4}
    assert task_file({**row, "deletion_vector": json.dumps(vector)}).deletion_vector == vector
