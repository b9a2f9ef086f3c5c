"""Promotion and the frontier, outside any epoch: what operators (and the CLI) call.

``promote`` records in the target which writer of a view is active (``epoch/lineage.py``,
``Writers``); ``frontier`` reads the view's frontier.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from mvsink.config import SinkOptions
from mvsink.epoch.lineage import Writers
from mvsink.errors import ConfigError, Where
from mvsink.table.catalog import locate
from mvsink.table.commit import compare_and_append
from mvsink.table.delta import Snapshot, load_snapshot, read_frontier
from mvsink.table.record import app_id, promote_metadata
from mvsink.table.storage import Store

log = logging.getLogger(__name__)


def promote(target: str, name: str, writer: str, storage_options: Mapping[str, str] | None = None) -> int:
    """Record in the target that ``writer`` is view ``name``'s active writer; returns the
    version that says so. One strict commit: of two promotions at once exactly one lands, the
    other raises ``ConflictError`` (promote again if it should still win)."""
    options = SinkOptions.build(
        target=target, name=name, writer=writer, storage_options=dict(storage_options or {})
    )
    where = Where(name, target)
    snap = load_snapshot(
        locate(target, where), options.app_id, options.storage_options, where, engine=options.engine
    )
    return promote_on(snap, options, where)


def promote_on(snap: Snapshot, options: SinkOptions, where: Where) -> int:
    """``promote`` against a given snapshot (the commit lands only on top of it)."""
    if not snap.exists or snap.schema_json is None:
        raise ConfigError("there is no Delta table at the target yet: start a writer first", where)
    writers = Writers.read(snap, options.app_id, options.writer)
    version = compare_and_append(
        snap,
        Store(snap.root, snap.storage_options),
        adds=(),
        removes=(),
        app_id=options.app_id,
        upper=None,
        attempt_id=uuid.uuid4().hex,
        metadata=promote_metadata(options.name, str(options.writer)),
        schema_json=snap.schema_json,
        partition_by=snap.partition_by,
        where=where,
        transactions=writers.promotion(),
    )
    log.warning("%s: writer %s promoted to active writer in version %d", where, options.writer, version)
    return version


def frontier(target: str, name: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The frontier (upper) of view ``name`` in the Delta table at ``target``, or None."""
    return read_frontier(locate(target, Where(name, target)), app_id(name), storage_options or {})
