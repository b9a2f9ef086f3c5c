"""Late events: the events an upsert view does not take because its table holds a newer one
for their key (a stored row, or a tombstone: ``upsert._newest_wins``), kept for the view's
history (``history_target``) and for nothing else.

An epoch that meets late events, in a view keeping a history, writes them with its attempt's
files (``staging.stage``, on the driver or by Spark tasks) as a folder of the table's hidden
folder::

    _mvsink/<view>/late/<number>/part-<n>.parquet ...   the view's columns, logical names
    _mvsink/<view>/late/<number>/late.json              its parts (the files written, listed
                                                        once every task reported; a failed
                                                        task attempt's file is not among them)

and names it in its commit by the app transaction ``mvsink:<view>#late`` = ``<number>``
(``record.Keys.late``), so the events and the version that met them land together or not at
all; such an epoch commits even when it changes no row. The history reads them, a part at a
time, when it follows that version, as lifetimes that close as they open
(``history/keep.py``). A folder is kept as long as the view's log can name it (``KEEP_MS``:
any history of the view may follow that version until then) and swept after (``sweep``),
with the folders of attempts that never landed.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame

from mvsink.errors import Where
from mvsink.table.delta import DataFile
from mvsink.table.index import HIDDEN
from mvsink.table.layout import Layout
from mvsink.table.plan import SideFiles
from mvsink.table.record import Keys
from mvsink.table.schema import target_schema_json, target_struct
from mvsink.table.storage import Store
from mvsink.table.tasks import write_frame

ROWS_PER_FILE = 1_000_000
MANIFEST = "late.json"
KEEP_MS = 31 * 86_400_000
"""How long a late folder is kept: the log retention Delta keeps a version's entry by default
(``delta.logRetentionDuration``, 30 days), and a day. A history that lags the view by more
cannot be completed from the log anyway (``History._follow``)."""
SWEEP_EVERY = 100
"""A sink's history commits between sweeps (its first sweeps)."""


def folder(view: str, number: int) -> str:
    return f"{HIDDEN}/{view}/late/{number:016x}"


@dataclass(frozen=True)
class LateEvents:
    """The late events an attempt met: its rows (the view's columns) on the driver or in Spark."""

    number: int
    view: str
    rows: pa.Table | DataFrame
    layout: Layout
    where: Where

    @staticmethod
    def of(view: str, rows: pa.Table | DataFrame, layout: Layout, where: Where) -> LateEvents:
        return LateEvents(random.SystemRandom().randrange(1, 1 << 62), view, rows, layout, where)

    def side(self) -> SideFiles:
        return SideFiles(folder(self.view, self.number), self, {Keys.of(self.view).late: self.number}, True)

    def write(self, store: Store) -> list[str]:
        """Write the events, plain (logical names, no partition folders); the paths written."""
        base, plain = folder(self.view, self.number), _plain(self.layout)
        if isinstance(self.rows, pa.Table):
            rows = self.rows.select(plain.struct.names).cast(plain.arrow)
            parts = [store.write_file(f"{base}/part-{uuid.uuid4().hex}.parquet", rows).path]
        else:
            written = write_frame(
                self.rows,
                store,
                base,
                plain,
                max_rows_per_file=ROWS_PER_FILE,
                cluster_by=(),
                index=None,
                where=self.where,
            )
            parts = [w.file.path for w in written]
        store.put(f"{base}/{MANIFEST}", json.dumps({"parts": parts}).encode())
        return [*parts, f"{base}/{MANIFEST}"]


def _plain(layout: Layout) -> Layout:
    """``layout``'s columns without their metadata (a column-mapped table's physical names) or
    partitions: what a late events file holds."""
    struct = target_struct(target_schema_json(layout.struct))
    return Layout(target_schema_json(struct), struct, ())


def parts(store: Store, view: str, number: int) -> list[str] | None:
    """The part files of late folder ``number`` (its manifest's); None when it is gone."""
    data = store.get(f"{folder(view, number)}/{MANIFEST}")
    return None if data is None else [str(p) for p in json.loads(data.to_pybytes())["parts"]]


def read(store: Store, path: str, schema: pa.Schema) -> pa.Table:
    """The late events of one part, in the view's columns ``schema`` (plain)."""
    return store.read(DataFile(path, 0, None, {}, None), schema, ())


def sweep(store: Store, view: str, now_ms: int | None = None) -> int:
    """Delete the view's late folders written more than ``KEEP_MS`` ago; how many."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    root = f"{HIDDEN}/{view}/late"
    written: dict[str, float] = {}
    for p, (_, mtime) in store.listing(root).items():
        name = p.removeprefix(root + "/").split("/", 1)[0]
        written[name] = max(written.get(name, 0.0), mtime * 1000)
    gone = [name for name, at in written.items() if at < now - KEEP_MS]
    for name in gone:
        store.delete_folder(f"{root}/{name}")
    return len(gone)
