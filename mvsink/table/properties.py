"""A Delta table's properties (its ``configuration``) as mvsink reads them, parsed once.

``TableProperties.parse`` reads the ``delta.*`` settings mvsink acts on; a ``Snapshot``
carries the result (``Snapshot.properties``). Pure: no engine is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

CHANGE_FEED = "delta.enableChangeDataFeed"
DELETION_VECTORS = "delta.enableDeletionVectors"
COLUMN_MAPPING = "delta.columnMapping.mode"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"
APPEND_ONLY = "delta.appendOnly"
RETENTION = "delta.deletedFileRetentionDuration"
TRANSACTION_RETENTION = "delta.setTransactionRetentionDuration"

DEFAULT_CHECKPOINT_INTERVAL = 100
_US_PER_HOUR = 3_600_000_000
DEFAULT_RETENTION_US = 7 * 24 * _US_PER_HOUR
_UNIT_US = {
    "week": 7 * 24 * _US_PER_HOUR,
    "day": 24 * _US_PER_HOUR,
    "hour": _US_PER_HOUR,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}


def _flag(configuration: Mapping[str, str | None], key: str, default: str = "false") -> bool:
    """A boolean property as Delta reads it: ``true`` in any case."""
    return str(configuration.get(key) or default).lower() == "true"


@dataclass(frozen=True)
class TableProperties:
    """The table properties mvsink acts on."""

    change_feed: bool = False
    """Change Data Feed is on (``delta.enableChangeDataFeed``)."""
    deletion_vectors: bool = False
    """The table turns deletion vectors on (``delta.enableDeletionVectors``)."""
    column_mapping: str = "none"
    """``delta.columnMapping.mode``, lower case: ``none``, ``name`` or ``id``."""
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    """Versions between checkpoints (``delta.checkpointInterval``; 100 when unset or unread)."""
    expired_log_cleanup: bool = True
    """Whether checkpointing also cleans up expired log files (``delta.enableExpiredLogCleanup``)."""
    append_only: bool = False
    """``delta.appendOnly``: the table takes no removes."""
    retention_us: int | None = DEFAULT_RETENTION_US
    """``delta.deletedFileRetentionDuration`` in microseconds (``table_retention_us``); None for
    a value Delta does not read as a duration."""
    transaction_retention: str | None = None
    """``delta.setTransactionRetentionDuration`` as set (mvsink refuses a table that sets it)."""

    @classmethod
    def parse(cls, configuration: Mapping[str, str | None]) -> TableProperties:
        try:
            interval = int(configuration.get(CHECKPOINT_INTERVAL) or DEFAULT_CHECKPOINT_INTERVAL)
        except ValueError:
            interval = DEFAULT_CHECKPOINT_INTERVAL
        return cls(
            change_feed=_flag(configuration, CHANGE_FEED),
            deletion_vectors=_flag(configuration, DELETION_VECTORS),
            column_mapping=str(configuration.get(COLUMN_MAPPING) or "none").lower(),
            checkpoint_interval=interval,
            # Set but empty is off, as Delta's own reader takes it; unset is on.
            expired_log_cleanup=str(configuration.get(EXPIRED_LOG_CLEANUP, "true")).lower() == "true",
            append_only=_flag(configuration, APPEND_ONLY, ""),
            retention_us=table_retention_us(configuration),
            transaction_retention=configuration.get(TRANSACTION_RETENTION) or None,
        )


def table_retention_us(configuration: Mapping[str, str | None]) -> int | None:
    """The table's ``delta.deletedFileRetentionDuration`` in microseconds, read as the JVM
    Delta reads it (Spark's interval syntax: an optional ``interval``, then whole numbers with
    units from weeks to microseconds, a fraction on seconds only, any case; 7 days when
    unset), or None for a value it does not read so (months and years included). delta-rs
    reads only some of these forms (``30 days``, say, is 7 days to it): ``vacuum`` always
    hands delta-rs the retention read here."""
    text = (configuration.get(RETENTION) or "").strip().lower()
    if not text:
        return DEFAULT_RETENTION_US
    words = text.split()
    if words[0] == "interval":
        words = words[1:]
    if not words or len(words) % 2:
        return None
    total = 0
    for amount, word in zip(words[::2], words[1::2], strict=True):
        unit = word[:-1] if word.endswith("s") and word[:-1] in _UNIT_US else word
        found = re.fullmatch(r"([+-]?)(\d+)(?:\.(\d{1,6}))?", amount)
        if unit not in _UNIT_US or found is None or (found.group(3) and unit != "second"):
            return None
        sign, whole, fraction = found.groups()
        value = int(whole) * _UNIT_US[unit] + int((fraction or "").ljust(6, "0"))
        total += -value if sign == "-" else value
    return total
