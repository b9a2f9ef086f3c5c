"""What mvsink records in a Delta table's log, and reads back: the one place that spells it.

Two kinds of records, both written in the same commit as the data they describe:

* **App transactions** (``txn`` actions: an app id and a number, kept in every snapshot and
  checkpoint), all under the view's app id ``mvsink:<view>`` (``Keys``):

  ======================================  ====================================================
  ``mvsink:<view>``                       the frontier: the upper of the view's last epoch
  ``mvsink:<view>#at``                    when the view last committed (ms since 1970)
  ``mvsink:<view>#compacted``             the frontier the last compaction ran at
  ``mvsink:<view>#owner``                 the generation of the lineage owning the view
  ``mvsink:<view>#gen@<L>``               the generation lineage ``L`` took the view at
  ``mvsink:<view>@<L>``                   the upper of lineage ``L``'s last commit
  ``mvsink:<view>#active``                the number of the last promotion of a writer
  ``mvsink:<view>#writer@<W>``            the promotion that made writer ``W`` active
  ``mvsink:<view>#tombstones``            the number of the view's current tombstone set
  ``mvsink:<view>#clock-taken@<L>``       lineage ``L`` committed with ``take_over`` naming the
                                          view under a shared clock (``decide.py``)
  ``mvsink:<view>#origin~<part>``         complete mode: where the query that built the view
                                          started reading, and ``#origin#parts``
  ``mvsink:<view>#schema@<S>``            the version at which the view's table left schema
                                          ``S`` (``schema.schema_digest``), never to go back
  ``mvsink:<view>#key``                   an upsert view's identity (``Identity``): its key
                                          and sequence columns, as a digest
  ``mvsink:<view>~<part>``                a part of the committed clock time, and ``~#parts``,
                                          ``~#by``, ``~#upper``, ``~names`` (``epoch/clock.py``)
  ======================================  ====================================================

  (``<L>`` and ``<W>`` are digests of the lineage's and the writer's names.) One more key
  names no view: ``mvsink#holder``, the view that holds the table (``holder_tag``), recorded
  by every epoch's commit. A table holds one view; a sink of another view is refused.

* **The history's app transactions** (in the history table, ``history_target``), under
  ``mvsink-history:<view>`` (``HistoryKeys``):

  ======================================  ====================================================
  ``mvsink-history:<view>``               the history's frontier: the first version of the
                                          view's table not yet in the history
  ``mvsink-history:<view>#table``         the view's table (a digest of its id; 0: not yet
                                          known), so a table made again is seen
  ``mvsink-history:<view>#time``          the time given the last version it holds (ms)
  ``mvsink-history:<view>#epoch``         the view's last epoch commit it holds (version + 1)
  ``mvsink-history:<view>#foreign``       the last foreign write that changed rows (version
                                          + 1): the epoch after it repairs
  ``mvsink-history:<view>#began``         a history begun on a view's table that held rows:
                                          its time (ms), before which it knows nothing
  ``mvsink-history:<view>#since``         ... and its version + 1
  ======================================  ====================================================

* **Commit metadata**: ``mvsink.*`` keys of the commit info (delta-rs writes them at its top
  level, the JVM Delta into its ``tags``; ``table/log.commit_info`` reads either), one set
  per kind of commit: an epoch (``EpochRecord``), a compaction (``compact_metadata``), a
  promotion (``promote_metadata``), each naming its view (``VIEW``). ``ATTEMPT`` names the
  attempt that made a commit, so a commit whose outcome was unknown can be found.

Readers (``ops/status.py``, ``ops/metrics.py``, ``ops/verify.py``, ``ops/vacuum.py``,
``ops/compact.py``, ``ops/promote.py``, the JVM engine) parse through here as well: a new key is a
change in this module only.
"""

from __future__ import annotations

import hashlib
import json
import time as _time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PREFIX = "mvsink:"
"""Every app id mvsink records starts so; ``PREFIX`` alone names no view (``ops/vacuum``)."""

VIEW = "mvsink.view"
"""Commit metadata: the view a commit belongs to (every mvsink commit records it)."""
EPOCH = "mvsink.epoch"
"""Commit metadata of an epoch's commit: its epoch (tells an epoch from other commits)."""
ATTEMPT = "mvsink.attempt"
"""Commit metadata: the id of the attempt that made the commit (``table/delta.py``)."""
MODE = "mvsink.mode"
"""Commit metadata of an epoch's commit: the sink's mode (the JVM engine's output mode)."""
LINEAGE = "mvsink.lineage"
"""Commit metadata of an epoch's commit: its lineage (the JVM engine's query id)."""
IDENTITY = "mvsink.identity"
"""Commit metadata of an epoch's commit: its view's identity as JSON (``Identity.spelled``)."""
TAKEOVER = "mvsink.took_over"
"""Commit metadata of an epoch's commit that took the table from its holder: whom from."""
PROMOTED = "mvsink.promoted"
"""Commit metadata of a promotion: the writer made active."""
HISTORY = "mvsink.history"
"""Commit metadata of an epoch's commit: where the view's history is kept (``history_target``)."""
HISTORY_OF = "mvsink.history_of"
"""Commit metadata of a history table's commit: the view whose history it is."""
_PREFIX_META = "mvsink."


def app_id(view: str) -> str:
    """The app id of ``view``: its frontier's key, and the stem of every other key of it."""
    return f"{PREFIX}{view}"


def metrics_app_id(view: str, root: str) -> str:
    """The app id under which the metrics table records the last version of ``view`` (in the
    table at ``root``) that it holds rows of."""
    return f"mvsink-metrics:{view}@{digest(root)}"


def digest(name: str) -> str:
    """A lineage's or a writer's name as it appears in a key."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


HISTORY_PREFIX = "mvsink-history:"


def table_tag(table_id: str) -> int:
    """A table's id as an app transaction's version: a positive 60-bit digest."""
    return int(hashlib.sha256(table_id.encode()).hexdigest()[:15], 16)


@dataclass(frozen=True)
class HistoryKeys:
    """The app transactions of one view's history table (the second table in the module doc)."""

    view: str

    @property
    def frontier(self) -> str:
        return f"{HISTORY_PREFIX}{self.view}"

    @property
    def table(self) -> str:
        return f"{self.frontier}#table"

    @property
    def time(self) -> str:
        return f"{self.frontier}#time"

    @property
    def epoch(self) -> str:
        return f"{self.frontier}#epoch"

    @property
    def foreign(self) -> str:
        return f"{self.frontier}#foreign"

    @property
    def began(self) -> str:
        return f"{self.frontier}#began"

    @property
    def since(self) -> str:
        return f"{self.frontier}#since"


def history_metadata(view: str, version: int, by: str, opened: int, closed: int) -> dict[str, str]:
    """The commit metadata of the history commit that holds version ``version`` of ``view``'s
    table (``by``: what made that version, ``history/lifetimes.py``)."""
    return {
        "userMetadata": (
            f"mvsink history of view {view}: version {version} ({by}), "
            f"{opened} lifetime(s) opened, {closed} closed"
        ),
        HISTORY_OF: view,
        "mvsink.view_version": str(version),
        "mvsink.by": by,
        "mvsink.opened": str(opened),
        "mvsink.closed": str(closed),
    }


def tidy_metadata(view: str, removed: int, added: int, dropped: int) -> dict[str, str]:
    """The commit metadata of a compaction of ``view``'s history (``History.tidy``): it holds
    the same versions of the view, less ``dropped`` lifetimes past the history's retention."""
    return {
        "userMetadata": (
            f"mvsink history of view {view}: compacted {removed} file(s) of closed lifetimes into "
            f"{added}, {dropped} lifetime(s) past the retention dropped"
        ),
        HISTORY_OF: view,
        "mvsink.by": "compact",
        "mvsink.dropped": str(dropped),
    }


HOLDER = "mvsink#holder"
"""The app transaction naming the view that holds the table, by ``holder_tag``."""


def holder_tag(view: str) -> int:
    """``view``'s name as the version of the ``HOLDER`` app transaction: a positive 60-bit
    digest (an app transaction records a number, not a name; the name is in the commit info)."""
    return int(hashlib.sha256(view.encode()).hexdigest()[:15], 16)


@dataclass(frozen=True)
class Identity:
    """What an upsert view's rows mean beyond their columns, recorded in every upsert epoch's
    commit so that a redeployment that changes it is seen (``Keys.identity``): the key and
    sequence columns. A complete or append sink has the empty identity (tag 0) and
    records none: its rows are whole rows, not versions of keys."""

    key: tuple[str, ...] = ()
    """The key's columns, sorted (their order means nothing)."""
    sequence: str | None = None

    @property
    def empty(self) -> bool:
        return not self.key

    def spelled(self) -> str:
        """The identity as JSON (commit metadata ``IDENTITY``)."""
        return json.dumps({"key": list(self.key), "sequence": self.sequence})

    @staticmethod
    def parse(text: str) -> Identity | None:
        try:
            doc = json.loads(text)
            return Identity(tuple(doc["key"]), doc.get("sequence"))
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def tag(self) -> int:
        """The version of ``Keys.identity``: 0 for the empty identity, else a positive digest."""
        return 0 if self.empty else int(hashlib.sha256(self.spelled().encode()).hexdigest()[:15], 16)

    def __str__(self) -> str:
        if self.empty:
            return "no key (a complete or append view)"
        return f"key {list(self.key)}, sequence_column {self.sequence!r}"


def now_ms() -> int:
    """The time recorded under ``Keys.at``: milliseconds since 1970."""
    return int(_time.time() * 1000)


@dataclass(frozen=True)
class Keys:
    """The app transactions of one view (the table in the module doc)."""

    app_id: str

    @staticmethod
    def of(view: str) -> Keys:
        return Keys(app_id(view))

    @property
    def frontier(self) -> str:
        return self.app_id

    @property
    def at(self) -> str:
        return f"{self.app_id}#at"

    @property
    def compacted(self) -> str:
        return f"{self.app_id}#compacted"

    @property
    def owner(self) -> str:
        return f"{self.app_id}#owner"

    def generation(self, lineage: str) -> str:
        return f"{self.app_id}#gen@{digest(lineage)}"

    def lineage_frontier(self, lineage: str) -> str:
        return f"{self.app_id}@{digest(lineage)}"

    @property
    def active(self) -> str:
        return f"{self.app_id}#active"

    def writer(self, writer: str) -> str:
        return f"{self.app_id}#writer@{digest(writer)}"

    @property
    def tombstones(self) -> str:
        return f"{self.app_id}#tombstones"

    @property
    def late(self) -> str:
        """Set by a commit of an upsert view keeping a history that met late events: the
        number of their folder (``plan/late.py``)."""
        return f"{self.app_id}#late"

    def clock_taken(self, lineage: str) -> str:
        """Set by every commit of lineage ``L`` under a shared clock with ``take_over`` naming
        the view: ``L`` may take the committed time as its own at its first epoch only, never
        after it committed (``decide.py``)."""
        return f"{self.app_id}#clock-taken@{digest(lineage)}"

    def origin(self, part: str) -> str:
        """Complete mode: where, in part ``part`` of the sources' offsets, the query that built
        the view started reading (``decide._check_start``)."""
        return f"{self.app_id}#origin~{part}"

    @property
    def origins(self) -> str:
        """How many parts the view's origin has (set: the origin is recorded)."""
        return f"{self.app_id}#origin#parts"

    @property
    def identity(self) -> str:
        return f"{self.app_id}#key"

    def retired_schema(self, schema_digest: str) -> str:
        return f"{self.app_id}#schema@{schema_digest}"

    def clock(self, part: str) -> str:
        """A part of the committed clock time (and the clock's own entries, whose names start
        with ``#``, and the legacy ``names`` tags)."""
        return f"{self.app_id}~{part}"


def metadata_int(value: Any) -> int | None:
    """An integer of commit metadata (the JVM Delta keeps tags as strings); None if absent or
    not one."""
    try:
        return None if value in (None, "") else int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class EpochRecord:
    """What an epoch's commit records of itself, for people (``userMetadata``, shown by
    ``DESCRIBE HISTORY``) and tools (the ``mvsink.*`` keys)."""

    view: str
    mode: str
    epoch: int
    lower: int | None
    upper: int
    lineage: str
    writer: str
    inserted: int
    retracted: int
    files_added: int
    files_removed: int
    attempts: int
    seconds: float
    phases: Mapping[str, float]
    deletion_vectors: int = 0
    """Files of ``files_added`` that are existing files with a new deletion vector."""
    whole: bool = False
    """The epoch wrote desired whole instead of correcting file by file."""
    time: Mapping[str, int] | None = None
    """The epoch's clock time (a shared clock only)."""
    takeover: int | None = None
    """The generation a lineage took the view over at, in this commit."""
    identity: Identity = Identity()
    """The view's identity (``Keys.identity`` records its tag in the same commit)."""
    took_over: str | None = None
    """Whom this commit took the table from (``take_over``): a view, or a foreign table."""
    history: str | None = None
    """Where the view's history is kept (``history_target``), if anywhere."""

    def metadata(self) -> dict[str, str]:
        """The commit metadata: ``userMetadata`` and the ``mvsink.*`` keys."""
        vectors = f" ({self.deletion_vectors} with new deletion vectors)" if self.deletion_vectors else ""
        summary = (
            f"mvsink view {self.view} epoch {self.epoch}: +{self.inserted} -{self.retracted} rows, "
            f"files +{self.files_added} -{self.files_removed}{vectors}, "
            f"frontier {self.upper}, lineage {self.lineage}, writer {self.writer}"
        )
        if self.took_over is not None:
            summary += f"; took the table over from {self.took_over}"
        return {
            "userMetadata": summary,
            **({"mvsink.takeover": str(self.takeover)} if self.takeover is not None else {}),
            **({TAKEOVER: self.took_over} if self.took_over is not None else {}),
            **({HISTORY: self.history} if self.history is not None else {}),
            **({IDENTITY: self.identity.spelled()} if not self.identity.empty else {}),
            LINEAGE: self.lineage,
            **({"mvsink.time": json.dumps(dict(self.time), sort_keys=True)} if self.time is not None else {}),
            VIEW: self.view,
            MODE: self.mode,
            EPOCH: str(self.epoch),
            "mvsink.lower": "" if self.lower is None else str(self.lower),
            "mvsink.upper": str(self.upper),
            "mvsink.writer": self.writer,
            "mvsink.inserted": str(self.inserted),
            "mvsink.retracted": str(self.retracted),
            "mvsink.files_added": str(self.files_added),
            **({"mvsink.deletion_vectors": str(self.deletion_vectors)} if self.deletion_vectors else {}),
            "mvsink.files_removed": str(self.files_removed),
            **({"mvsink.whole": "true"} if self.whole else {}),
            "mvsink.attempts": str(self.attempts),
            "mvsink.seconds": f"{self.seconds:.3f}",
            "mvsink.phases": json.dumps({k: round(v, 3) for k, v in self.phases.items()}, sort_keys=True),
        }


@dataclass(frozen=True)
class EpochCommit:
    """An epoch's commit as read back from the log (``EpochRecord``'s keys, parsed leniently:
    a field a commit lacks, or an older mvsink did not write, is None)."""

    version: int
    timestamp: int | None
    view: str
    epoch: int | None
    mode: str | None
    lineage: str | None
    writer: str | None
    inserted: int | None
    retracted: int | None
    files_added: int | None
    files_removed: int | None
    attempts: int | None
    seconds: float | None
    phases: str
    """The phases as recorded: a JSON object."""
    time: dict[str, int] | None

    @staticmethod
    def parse(info: Mapping[str, Any]) -> EpochCommit | None:
        """The epoch commit ``info`` records (a commit info as ``table/log.commit_info``
        gives it), or None if it is not an epoch's commit."""
        if VIEW not in info or EPOCH not in info:
            return None
        seconds = info.get("mvsink.seconds")
        try:
            secs = float(seconds) if seconds is not None else None
        except ValueError:
            secs = None
        try:  # one malformed commit must not hide every view's status
            time = json.loads(info["mvsink.time"]) if info.get("mvsink.time") else None
        except ValueError:
            time = None
        return EpochCommit(
            version=int(info["version"]),
            timestamp=metadata_int(info.get("timestamp")),
            view=str(info[VIEW]),
            epoch=metadata_int(info.get(EPOCH)),
            mode=info.get(MODE),
            lineage=info.get(LINEAGE),
            writer=info.get("mvsink.writer"),
            inserted=metadata_int(info.get("mvsink.inserted")),
            retracted=metadata_int(info.get("mvsink.retracted")),
            files_added=metadata_int(info.get("mvsink.files_added")),
            files_removed=metadata_int(info.get("mvsink.files_removed")),
            attempts=metadata_int(info.get("mvsink.attempts")),
            seconds=secs,
            phases=str(info.get("mvsink.phases") or json.dumps({})),
            time=time,
        )


def views_of(infos: Sequence[Mapping[str, Any]]) -> set[str]:
    """The views that commits ``infos`` belong to."""
    return {str(c[VIEW]) for c in infos if VIEW in c}


def promotions(infos: Sequence[Mapping[str, Any]], view: str) -> list[Mapping[str, Any]]:
    """The commits of ``infos`` that promoted a writer of ``view``."""
    return [c for c in infos if c.get(VIEW) == view and PROMOTED in c]


ROWS_PER_FILE = "mvsink.max_rows_per_file"
"""A compaction's ``max_rows_per_file``: ``mvsink status`` judges small files by it."""


def compact_metadata(view: str, removed: int, added: int, max_rows_per_file: int) -> dict[str, str]:
    """The commit metadata of a compaction of ``view``'s files into files of up to
    ``max_rows_per_file`` rows."""
    return {
        "userMetadata": f"mvsink compact view {view}: files -{removed} +{added}, no row changed",
        VIEW: view,
        "mvsink.operation": "compact",
        "mvsink.files_removed": str(removed),
        "mvsink.files_added": str(added),
        ROWS_PER_FILE: str(max_rows_per_file),
    }


def compacted_rows_per_file(info: Mapping[str, Any], views: Sequence[str]) -> int | None:
    """The ``max_rows_per_file`` that commit ``info`` compacted one of ``views`` to; None if it
    is no such compaction, or one that recorded none (made before it was recorded)."""
    if info.get(VIEW) not in views:
        return None
    rows = metadata_int(info.get(ROWS_PER_FILE))
    return rows if rows is not None and rows > 0 else None


def schema_metadata(view: str, epoch: int, change: str) -> dict[str, str]:
    """The commit metadata of a commit that only adds columns to ``view``'s table, just before
    epoch ``epoch``'s (``table/delta.add_columns``)."""
    return {
        "userMetadata": f"mvsink view {view}: schema change for epoch {epoch}: {change}",
        VIEW: view,
        "mvsink.operation": "schema",
        "mvsink.schema_change": change,
    }


def promote_metadata(view: str, writer: str) -> dict[str, str]:
    """The commit metadata of a promotion of ``writer``."""
    return {
        "userMetadata": f"mvsink promote view {view}: writer {writer} is active",
        VIEW: view,
        PROMOTED: writer,
    }


def tags(info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``mvsink.*`` keys of a commit's tags (the JVM Delta keeps custom metadata there)."""
    return {k: v for k, v in info.items() if k.startswith(_PREFIX_META)}
