"""Table properties (``mvsink/table/properties.py``): parsed once, as Delta reads them. Pure."""

from __future__ import annotations

from mvsink.table.properties import DEFAULT_RETENTION_US, TableProperties, table_retention_us

HOUR = 3_600_000_000


def test_an_empty_configuration_is_delta_s_defaults():
    assert TableProperties.parse({}) == TableProperties()
    props = TableProperties()
    assert not (props.change_feed or props.deletion_vectors or props.append_only)
    assert props.column_mapping == "none" and props.checkpoint_interval == 100
    assert props.expired_log_cleanup and props.retention_us == DEFAULT_RETENTION_US == 168 * HOUR
    assert props.transaction_retention is None


def test_flags_are_read_in_any_case_and_only_true_is_true():
    props = TableProperties.parse(
        {
            "delta.enableChangeDataFeed": "TRUE",
            "delta.enableDeletionVectors": "true",
            "delta.appendOnly": "True",
            "delta.enableExpiredLogCleanup": "false",
            "delta.columnMapping.mode": "Name",
        }
    )
    assert props.change_feed and props.deletion_vectors and props.append_only
    assert not props.expired_log_cleanup and props.column_mapping == "name"
    no = TableProperties.parse({"delta.enableChangeDataFeed": "yes", "delta.appendOnly": None})
    assert not no.change_feed and not no.append_only
    # Log cleanup is on unless set, and set to anything but true (empty included) is off.
    assert not TableProperties.parse({"delta.enableExpiredLogCleanup": ""}).expired_log_cleanup


def test_the_checkpoint_interval_falls_back_to_100_when_unread():
    read = lambda text: TableProperties.parse({"delta.checkpointInterval": text}).checkpoint_interval  # noqa: E731
    assert read("10") == 10 and read("0") == 0
    assert read("ten") == read("") == 100


def test_retention_and_transaction_retention():
    props = TableProperties.parse(
        {
            "delta.deletedFileRetentionDuration": "interval 36 hours",
            "delta.setTransactionRetentionDuration": "interval 1 days",
        }
    )
    assert props.retention_us == 36 * HOUR and props.transaction_retention == "interval 1 days"
    assert TableProperties.parse({"delta.deletedFileRetentionDuration": "1 month"}).retention_us is None
    assert TableProperties.parse({"delta.setTransactionRetentionDuration": ""}).transaction_retention is None


def test_retention_reads_spark_s_interval_syntax():
    read = lambda text: table_retention_us({"delta.deletedFileRetentionDuration": text})  # noqa: E731
    assert read("30 days") == read("INTERVAL 30 DAYS") == 720 * HOUR
    assert read("interval 1 day 12 hours") == 36 * HOUR and read("interval 1.5 seconds") == 1_500_000
    assert read("interval -1 days") == -24 * HOUR
    for unread in ("interval seven days", "interval 1.5 days", "interval 1e2 hours", "7 dayss", "interval"):
        assert read(unread) is None, unread
