"""The ``mvsink-delta`` source's options (``mvsink.sources.options``), parsed and checked before
anything is read. No Spark: Spark hands the source these options as a mapping."""

from __future__ import annotations

import os
import re

import pytest

from mvsink import ConfigError
from mvsink.sources.options import REWRITE_ROWS_PER_TASK, SourceOptions, parse


def test_only_a_path_gives_the_defaults_at_the_tables_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse({"path": "t/"}) == SourceOptions(root=os.path.join(str(tmp_path), "t"))
    got = parse({"path": "s3://b/t"})
    assert (got.root, got.mode, got.starting_version, got.starting_snapshot) == (
        "s3://b/t",
        "appends",
        None,
        None,
    )
    assert (got.max_versions_per_trigger, got.rewrite_rows_per_task, dict(got.storage)) == (
        None,
        REWRITE_ROWS_PER_TASK,
        {},
    )


def test_names_are_taken_in_any_case_as_spark_hands_them_over_lower_cased():
    got = parse(
        {
            "PATH": "/t",
            "mode": "CHANGES",
            "startingversion": " LATEST ",
            "maxversionspertrigger": "3",
            "rewriteRowsPerTask": "+10",
        }
    )
    assert (got.root, got.mode, got.starting_version) == ("/t", "changes", "latest")
    assert (got.max_versions_per_trigger, got.rewrite_rows_per_task) == (3, 10)
    assert parse({"path": "/t", "startingSnapshot": "0"}).starting_snapshot == 0
    assert parse({"path": "/t", "startingVersion": "12"}).starting_version == 12


def test_storage_options_go_with_the_prefix_and_as_bare_cloud_keys_and_the_prefix_wins():
    got = parse(
        {
            "path": "s3://b/t",
            "storage.timeout": "30s",
            "storage.AWS_REGION": "eu-west-1",
            "AWS_REGION": "us-east-1",
            "AZURE_STORAGE_ACCOUNT_NAME": "acct",
            "google_service_account": "sa",
        }
    )
    assert dict(got.storage) == {
        "timeout": "30s",
        "AWS_REGION": "eu-west-1",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "google_service_account": "sa",
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs option 'path'"),
        ({"path": ""}, "needs option 'path'"),
        ({"path": "/t", "maxVersionPerTrigger": "1"}, "has no option 'maxVersionPerTrigger'"),
        ({"path": "/t", "timeout": "30s"}, "pass a storage option as 'storage.<key>'"),
        ({"path": "/t", "storage.": "x"}, "has no option 'storage.'"),
        ({"path": "/t", "mode": "upserts"}, "'mode' is one of ('appends', 'changes'), not 'upserts'"),
        ({"path": "/t", "startingVersion": "-1"}, "'startingVersion' is a Delta version"),
        ({"path": "/t", "startingVersion": "1.5"}, "not '1.5'"),
        ({"path": "/t", "startingSnapshot": "first"}, "or 'latest', not 'first'"),
        ({"path": "/t", "startingVersion": "0", "startingSnapshot": "0"}, "not both"),
        ({"path": "/t", "startingVersion": "latest", "startingSnapshot": "latest"}, "not both"),
        (
            {"path": "/t", "maxVersionsPerTrigger": "0"},
            "'maxVersionsPerTrigger' is a positive number of versions",
        ),
        ({"path": "/t", "maxVersionsPerTrigger": "two"}, "not 'two'"),
        ({"path": "/t", "rewriteRowsPerTask": "-5"}, "'rewriteRowsPerTask' is a positive number of rows"),
    ],
)
def test_a_wrong_option_is_a_config_error_naming_it(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(options)


def test_a_config_error_is_a_value_error():
    with pytest.raises(ValueError, match="mvsink-delta"):
        parse({"path": "/t", "mode": "x"})
