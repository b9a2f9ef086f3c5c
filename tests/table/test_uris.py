"""Table locations (``mvsink.table.uris``): local paths and object store URIs, their roots, and
when two spellings name one folder. Pure: no Spark, no storage."""

from __future__ import annotations

import os

import pytest

from mvsink.table.uris import REMOTE_SCHEMES, is_local, location, nested, table_root


@pytest.mark.parametrize("target", ["view", "./a/view", "/tmp/view", "file:///tmp/view"])
def test_paths_and_file_uris_are_local(target):
    assert is_local(target)


@pytest.mark.parametrize("scheme", REMOTE_SCHEMES)
def test_object_store_uris_are_not_local(scheme):
    assert not is_local(f"{scheme}://bucket/view")


def test_a_local_root_is_absolute_normalised_and_unescaped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert table_root("a/../view/") == os.path.join(str(tmp_path), "view")
    assert table_root("file:///tmp/my%20view/") == "/tmp/my view"
    assert table_root("/") == "/"


def test_a_remote_root_keeps_its_spelling_without_the_trailing_slash():
    assert table_root("s3://Bucket/a//view/") == "s3://Bucket/a//view"
    assert table_root("az://container/view") == "az://container/view"


def test_spellings_of_one_local_folder_are_one_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    want = ("file", "", os.path.join(str(tmp_path), "view"))
    assert location("view") == want
    assert location("./x/../view/") == want
    assert location(f"file://{tmp_path}/view") == want


def test_spellings_of_one_bucket_folder_are_one_location():
    want = ("s3", "bucket", "/a/view")
    for spelling in (
        "s3://bucket/a/view",
        "s3a://BUCKET/a//view/",
        "s3n://bucket/a/b/../view",
        "s3://bucket/a/%76iew",
    ):
        assert location(spelling) == want, spelling


def test_azure_uris_are_compared_by_container():
    assert location("abfss://data@account.dfs.core.windows.net/t") == ("az", "data", "/t")
    assert location("az://data/t") == ("az", "data", "/t")
    assert location("azure://Data/t/") == ("az", "data", "/t")
    assert location("abfss://other@account.dfs.core.windows.net/t") != location("az://data/t")


def test_gcs_aliases_and_other_buckets():
    assert location("gcs://b/t") == location("gs://b/t")
    assert location("gs://b/t") != location("gs://c/t")
    assert location("gs://b/t") != location("s3://b/t")


@pytest.mark.parametrize(
    ("a", "b", "inside"),
    [
        ("s3://b/t", "s3://b/t", True),
        ("s3://b/t", "s3a://b/t/inner", True),
        ("s3://b/t/inner", "s3://b/t", True),
        ("s3://b/t", "s3://b/t2", False),  # a common prefix is not a common folder
        ("s3://b/t", "s3://c/t/inner", False),
        ("s3://b/t", "gs://b/t/inner", False),
        ("/data/t", "file:///data/t/inner", True),
        ("/data/t", "/data/u", False),
    ],
)
def test_nested_is_one_location_inside_the_other_either_way(a, b, inside):
    assert nested(a, b) is inside
    assert nested(b, a) is inside
