"""Holder: which view a table belongs to, and what that view's rows mean.

A view owns its table. Every epoch's commit records, in the version it makes
(``table/record.py``):

* ``mvsink#holder``: the view holding the table (``record.holder_tag`` of its name);
* ``mvsink:<view>#key``: an upsert view's identity (``record.Identity``): its key and
  sequence columns. Complete and append commits leave it as it is (a complete epoch of the
  full view may reconcile an upsert view: docs/modes.md).

Before anything is staged, a sink about to commit checks both (``check``), in this order:

1. The table is the view's: the holder is this view; or no holder is recorded and the table
   records this view's frontier (a table written before holders were recorded), or holds no
   row and no other view's frontier. Otherwise it is another view's (a renamed job, a second
   view) or a foreign table (rows another tool wrote): ``TableHeldError``, unless the option
   ``take_over`` names that holder; then this commit takes it, and says so.
2. An upsert sink's identity is the one the table records for the view, or none is
   recorded. A different key or sequence would make the stored rows versions of another key
   (re-keyed by ``v`` after ``id``, an upsert deletes every row sharing a ``v``):
   ``IdentityChangedError`` naming both, unless ``take_over`` names this view (a deliberate
   re-keying).

A sink that only skips (a replay, a standby, a fenced lineage) never checks: it writes nothing.
Two views racing for a table that neither holds both pass here, and the strict commit lets one
land; the other's next attempt, on the new snapshot, finds the table held (invariant I2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mvsink.config import SinkOptions
from mvsink.errors import IdentityChangedError, TableHeldError, Where
from mvsink.table.delta import Snapshot
from mvsink.table.log import LogFiles, history
from mvsink.table.record import (
    HOLDER,
    IDENTITY,
    VIEW,
    Identity,
    Keys,
    app_id,
    holder_tag,
    views_of,
)

log = logging.getLogger(__name__)

FOREIGN = "foreign"
"""``take_over``'s name for a table holding rows that no mvsink view wrote."""
HISTORY = 100
"""Versions read back to put names to a holder's and an identity's tags (only when a sink
does not hold its table: never on a steady epoch)."""


def identity_of(opts: SinkOptions) -> Identity:
    """The identity the sink's options give its view: the key's columns (in any order) and
    the sequence column decide what a stored row is a version of; the delete column does not
    (turning deletes on or off changes no stored row's meaning)."""
    if opts.mode != "upsert":
        return Identity()
    return Identity(tuple(sorted(opts.key)), opts.sequence_column)


@dataclass(frozen=True)
class Holding:
    """What a commit of this sink records of the table's holder and the view's identity."""

    identity: Identity
    took_over: str | None = None
    """Whom the commit takes the table from (None: the view holds it already)."""

    def transactions(self, view: str) -> dict[str, int]:
        """The holder, and an upsert view's identity (a complete or append commit leaves the
        recorded one as it is: a complete epoch reconciling an upsert view keeps its key)."""
        held = {HOLDER: holder_tag(view)}
        return held if self.identity.empty else {**held, Keys.of(view).identity: self.identity.tag}


def check(snap: Snapshot, opts: SinkOptions, log_files: LogFiles, where: Where) -> Holding:
    """What this sink's commit against ``snap`` records, or the refusal (see the module doc)."""
    identity = identity_of(opts)
    took_over = _check_holder(snap, opts, log_files, where)
    recorded = snap.transaction(Keys(opts.app_id).identity)
    if took_over is None and not identity.empty and recorded not in (None, 0, identity.tag):
        if opts.take_over != opts.name:
            old = _spelled(snap, opts.name, recorded, log_files)
            raise IdentityChangedError(
                f"the view's table records {old}, but this sink has {identity}: its rows are versions "
                "of the recorded key, and this sink would take them for another's (an upsert by a new "
                "key deletes every stored row sharing it). Nothing was written. Run the view with its "
                "recorded options; to re-key it, rebuild the view into a new table, or set "
                f"take_over={opts.name!r} for one deployment to keep the rows as they are under the "
                "new key (docs/modes.md, 'Changing a view's key')",
                where,
            )
        took_over = f"view {opts.name} under {_spelled(snap, opts.name, recorded, log_files)}"
        log.warning("%s: the view is re-keyed: %s gives way to %s", where, took_over, identity)
    return Holding(identity, took_over)


def holds(snap: Snapshot, view: str) -> bool:
    """Whether ``view`` holds the table ``snap`` is of: its holder, or (a table written before
    holders were recorded) none is recorded and the view's frontier is."""
    tag = snap.transaction(HOLDER)
    return tag == holder_tag(view) or (tag is None and snap.frontier is not None)


def _check_holder(snap: Snapshot, opts: SinkOptions, log_files: LogFiles, where: Where) -> str | None:
    """Condition 1: None when the view holds the table (or may make it its own quietly), else
    whom ``take_over`` takes it from; refused otherwise."""
    if not snap.exists or holds(snap, opts.name):
        return None
    tag = snap.transaction(HOLDER)
    infos = history(log_files, snap.version or 0, HISTORY)
    if tag is not None:
        named = _name(tag, infos)
        holder = named or "<its name>"
        what = f"view {named}" if named else f"a view not named in the last {HISTORY} versions (tag {tag})"
        if opts.take_over is not None and holder_tag(opts.take_over) == tag:
            log.warning("%s: taking the table over from view %s (option take_over)", where, opts.take_over)
            return f"view {opts.take_over}"
    else:
        others = sorted(v for v in views_of(infos) if snap.transaction(app_id(v)) is not None)
        if others:
            holder, what = others[0], f"view {others[0]}"
        elif not _holds_rows(snap):
            return None  # an empty table (made by a platform, say): the view's from its first commit
        else:
            holder, what = FOREIGN, "rows no mvsink view wrote (a foreign table)"
    if tag is None and opts.take_over == holder:
        log.warning("%s: taking the table over from %s (option take_over)", where, what)
        return what
    raise TableHeldError(
        f"the target holds {what}; this view ({opts.name}) never writes a table another view or "
        "tool holds, so nothing was written. If this view was renamed, run it under its old name; "
        "if the table is no longer that one's, take it over explicitly with "
        f"take_over={holder!r} (one version, recorded as a takeover: the view replaces what the "
        "table holds, in complete mode every row), or point the view at another table",
        where,
    )


def _holds_rows(snap: Snapshot) -> bool:
    """Whether any file of the snapshot holds (or may hold: count unknown) a row."""
    return any(f.num_records is None or f.num_records > 0 for f in snap.files)


def _name(tag: int, infos: Sequence[Mapping[str, Any]]) -> str | None:
    """The view among the commits ``infos`` whose holder tag is ``tag``."""
    return next((v for v in sorted(views_of(infos)) if holder_tag(v) == tag), None)


def _spelled(snap: Snapshot, view: str, tag: int, log_files: LogFiles) -> str:
    """The identity whose tag is ``tag``, as the newest commit of ``view`` that recorded it
    spells it (within the last ``HISTORY`` versions)."""
    for info in history(log_files, snap.version or 0, HISTORY):
        if info.get(VIEW) != view or not info.get(IDENTITY):
            continue
        found = Identity.parse(str(info[IDENTITY]))
        if found is not None and found.tag == tag:
            return str(found)
    return f"an identity whose commit is older than the last {HISTORY} versions (tag {tag})"
