"""Change files for a table with Change Data Feed.

An attempt that rewrites files also stages change files under ``<folder>/_change_data/``:
exactly the rows it retracts (``_change_type`` ``delete``) and inserts (``insert``), never the
kept rows of a rewritten file. Delta's feed then reads the commit from them instead of from
its whole added and removed files. An attempt that only adds files needs none: the feed reads
its added files as inserts.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from mvsink.table.storage import Written

CHANGE_DIR = "_change_data"
"""The staged change files' folder inside an attempt's folder (Delta's own name for them)."""
CHANGE_TYPE = "_change_type"
"""The change files' column saying what happened to each row."""


def with_change_type(rows: pa.Table, kind: str) -> pa.Table:
    """``rows`` as a change file holds them: with ``CHANGE_TYPE`` = ``kind`` (``delete``,
    ``insert``)."""
    return rows.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(kind, pa.string()), rows.num_rows))


def split_changes(folder: str, written: Sequence[Written]) -> tuple[list[Written], list[Written]]:
    """Files staged under ``folder`` as (data files, change files)."""
    prefix = f"{folder}/{CHANGE_DIR}/"
    data = [w for w in written if not w.file.path.startswith(prefix)]
    return data, [w for w in written if w.file.path.startswith(prefix)]
