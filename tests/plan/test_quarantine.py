"""Error rows: the view's rules, on_error = "fail" and the errors table."""

from __future__ import annotations

import os
import shutil

import pytest

from mvsink import ConfigError, InputError, MVSink, frontier, promote
from tests.helpers import assert_equal_to, frame, multiset, target_table, versions

RULES = {"not_null": ["name"], "checks": ["x >= 0"]}


def batch(spark, rows):
    return frame(spark, rows)


def test_on_error_fail_names_the_rule_the_rows_and_the_epoch_and_writes_nothing(spark, local_target):
    sink = MVSink(local_target, "v", **RULES)
    sink(batch(spark, [(1, "a", 1.0), (2, "b", 2.0)]), 0)
    with pytest.raises(InputError, match=r"NOT NULL name.*'id': 3") as caught:
        sink(batch(spark, [(1, "a", 1.0), (3, None, 2.0)]), 1)
    assert caught.value.epoch == 1 and "errors table" in str(caught.value)
    with pytest.raises(InputError, match=r"CHECK check_1 \(x >= 0\)"):
        sink(batch(spark, [(1, "a", -1.0)]), 1)
    assert versions(local_target) == [0] and frontier(local_target, "v") == 1


def test_error_rows_go_to_an_errors_table_kept_equal_to_them_across_a_restart(spark, local_target):
    errors = local_target + "_errors"
    options = {**RULES, "on_error": "table", "heartbeat": 0}
    sink = MVSink(local_target, "v", **options)
    rows0 = [(1, "a", 1.0), (2, None, 2.0), (3, "c", -3.0), (4, "d", 4.0)]
    report = sink(batch(spark, rows0), 0)
    assert report.outcome == "committed"
    assert_equal_to(local_target, batch(spark, [(1, "a", 1.0), (4, "d", 4.0)]))
    assert multiset(target_table(errors)) == {
        (2, None, 2.0, "NOT NULL name"): 1,
        (3, "c", -3.0, "CHECK check_1 (x >= 0)"): 1,
    }
    assert frontier(errors, "v") == frontier(local_target, "v") == 1

    # Row 2 is fixed upstream, row 5 breaks a rule: the errors table follows, after a restart.
    again = MVSink(local_target, "v", **options)
    rows1 = [(1, "a", 1.0), (2, "b", 2.0), (3, "c", -3.0), (5, None, 5.0)]
    again(batch(spark, rows1), 1)
    assert_equal_to(local_target, batch(spark, [(1, "a", 1.0), (2, "b", 2.0)]))
    assert multiset(target_table(errors)) == {
        (3, "c", -3.0, "CHECK check_1 (x >= 0)"): 1,
        (5, None, 5.0, "NOT NULL name"): 1,
    }
    assert frontier(errors, "v") == frontier(local_target, "v") == 2
    # A replayed epoch writes nothing to either table.
    before = (versions(local_target), versions(errors))
    assert again(batch(spark, rows1), 1).outcome == "replay"
    assert (versions(local_target), versions(errors)) == before


def test_append_mode_appends_each_epochs_error_rows_once(spark, local_target):
    errors = local_target + "_errors"
    sink = MVSink(local_target, "log", mode="append", on_error="table", checks=["x >= 0"])
    sink(batch(spark, [(1, "a", 1.0), (2, "b", -2.0)]), 0)
    sink(batch(spark, [(1, "a", 1.0), (2, "b", -2.0)]), 0)  # replayed: nothing twice
    sink(batch(spark, [(3, "c", -3.0)]), 1)
    assert multiset(target_table(local_target)) == {(1, "a", 1.0): 1}
    assert multiset(target_table(errors), ["id"]) == {(2,): 1, (3,): 1}


def test_bad_rules_and_options_are_config_errors_and_write_nothing(spark, local_target):
    rows = batch(spark, [(1, "a", 1.0)])
    with pytest.raises(ConfigError, match=r"option 'checks'.*not an SQL expression"):
        MVSink(local_target, "v", checks=["nope >"])(rows, 0)
    with pytest.raises(ConfigError, match=r"option 'checks'.*not boolean"):
        MVSink(local_target, "v", checks=["x + 1"])(rows, 0)
    with pytest.raises(ConfigError, match="on_error"):
        MVSink(local_target, "v", mode="upsert", key=["id"], on_error="table")
    with pytest.raises(ConfigError, match="errors_target"):
        MVSink(local_target, "v", errors_target=local_target + "_e")
    with pytest.raises(ConfigError, match="inside it"):
        MVSink(local_target, "v", on_error="table", errors_target=local_target + "/errors")
    with pytest.raises(ConfigError, match="inside it"):
        MVSink(local_target, "v", metrics_table=local_target)
    with pytest.raises(ConfigError, match=r"'not_null': 'nope'"):
        MVSink(local_target, "v", not_null=["nope"])(rows, 0)
    with pytest.raises(ConfigError, match=r"'not_null': 'name.first'.*struct name"):
        MVSink(local_target, "v", not_null=["name.first"])(rows, 0)
    assert not os.path.exists(local_target)


@pytest.mark.parametrize(
    "spelling",
    [
        "file://{t}/errors",  # a URI of the same folder
        "{parent}/x/../view/errors",  # a path through '..'
        "{t}//errors/",  # doubled and trailing slashes
        "{relative}/errors",  # relative to the working directory
    ],
)
def test_a_table_inside_the_view_is_refused_however_it_is_spelled(local_target, spelling, monkeypatch):
    """An errors or metrics table inside the view's folder would be deleted by the view's
    vacuum (which takes its log and files for unreferenced files): every spelling of such a
    location is refused, not only the one the target is spelled in."""
    parent = os.path.dirname(local_target)
    monkeypatch.chdir(os.path.dirname(parent))
    relative = os.path.join(os.path.basename(parent), "view")
    other = spelling.format(t=local_target, parent=parent, relative=relative)
    for target in (local_target, relative):
        with pytest.raises(ConfigError, match="inside it"):
            MVSink(target, "v", on_error="table", errors_target=other)
        with pytest.raises(ConfigError, match="inside it"):
            MVSink(target, "v", metrics_table=other)
    # A sibling that only shares a prefix is not inside.
    MVSink(local_target, "v", metrics_table=local_target + "_metrics")


def test_object_store_spellings_of_one_folder_are_one_table():
    from mvsink.table.uris import nested

    assert nested("s3://lake/view", "s3a://lake/view/errors")
    assert nested("s3://Lake/view/", "s3://lake//view/./errors")
    assert nested("abfss://c@acct.dfs.core.windows.net/v", "abfs://c@acct.dfs.core.windows.net/v/m")
    assert nested("az://c/v", "abfss://c@acct.blob.core.windows.net/v/m")
    assert nested("s3://lake/my view", "s3://lake/my%20view/errors")
    assert not nested("s3://lake/view", "s3://lake/view_errors")
    assert not nested("s3://lake/view", "gs://lake/view/errors")
    with pytest.raises(ConfigError, match="inside it"):
        MVSink("s3://lake/view", "v", metrics_table="s3a://LAKE/view/metrics")


def test_the_errors_table_follows_the_view_through_a_takeover_and_a_fenced_writer(spark, local_target):
    errors = local_target + "_errors"
    options = {**RULES, "on_error": "table", "heartbeat": 0}
    old = MVSink(local_target, "v", lineage="old", **options)
    old(batch(spark, [(1, "a", 1.0), (2, None, 2.0)]), 0)
    new = MVSink(local_target, "v", lineage="new", **options)  # a new checkpoint takes over
    new(batch(spark, [(1, "a", 1.0), (3, None, 3.0)]), 0)
    assert multiset(target_table(errors), ["id"]) == {(3,): 1}
    before = versions(errors)
    # The old job, still running, is fenced on the view: it writes no error rows either.
    assert old(batch(spark, [(1, "a", 1.0), (4, None, 4.0)]), 1).outcome == "fenced"
    assert versions(errors) == before and multiset(target_table(errors), ["id"]) == {(3,): 1}


def test_a_standby_or_a_writer_promoted_away_never_writes_the_errors_table(spark, local_target):
    """A replay is the errors table's chance to catch up after a crash, but only for a sink
    that may write the view: a read-only standby, or a writer another was promoted over,
    writes nothing beside the view either."""
    errors = local_target + "_errors"
    options = {**RULES, "on_error": "table", "heartbeat": 0, "clock": lambda batch, epoch: {"src": epoch}}
    rows = [(1, "a", 1.0), (2, None, 2.0)]
    MVSink(local_target, "v", writer="a", **options)(batch(spark, rows), 5)
    shutil.rmtree(errors)  # as if the errors commit was lost in a crash
    standby = MVSink(local_target, "v", writer="c", read_only=True, **options)
    assert standby(batch(spark, rows), 5).outcome == "replay"
    assert not os.path.exists(errors)
    promote(local_target, "v", "c")
    fenced = MVSink(local_target, "v", writer="a", **options)
    assert fenced(batch(spark, rows), 5).outcome == "fenced"
    assert not os.path.exists(errors)
    # The promoted standby's replay brings the errors table up.
    assert standby(batch(spark, rows), 5).outcome == "replay"
    assert multiset(target_table(errors), ["id"]) == {(2,): 1}
