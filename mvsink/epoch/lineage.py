"""Lineage: which run of a query an epoch belongs to, and which lineage owns the view.

An epoch number means something only within one lineage: one streaming query's checkpoint
(Spark's query id, stable across restarts from it and new for a new checkpoint), or, for
direct calls ``sink(df, epoch)``, the ``lineage`` option (``"direct"`` by default).

The target records, as Delta app transactions (cheap, kept in every snapshot and checkpoint):

* ``mvsink:<view>``: the frontier, as before (the upper of the last commit, any lineage);
* ``mvsink:<view>#owner``: the generation of the lineage that owns the view;
* ``mvsink:<view>#gen@<L>``: the generation lineage ``L`` took the view at;
* ``mvsink:<view>@<L>``: the upper of ``L``'s last commit (its own frontier).

(``<L>`` is a digest of the lineage id.) A lineage owns the view while its generation is the
owner's. Then:

* the owner mints as always, against its own frontier (a replay is a replay);
* a lineage that owned the view once and was superseded is **fenced**: its epochs write
  nothing, whatever their numbers, so an old job left running can never move the view back;
* a lineage never seen is **new**: it takes the view over (``on_new_lineage = "adopt"``: the
  next generation, recorded in the same commit as its first epoch, with a WARNING), or is
  refused with a ``LineageError`` (``"fail"``). Its epochs are never taken for replays of
  another lineage's.

Independently of lineages, the target may name the **active writer** (``promote``): a
promotion records ``mvsink:<view>#active`` = n and ``mvsink:<view>#writer@<W>`` = n in one
strict commit, so of two promotions at once exactly one lands. Once any promotion exists, only
the writer promoted last commits (even if started ``read_only``); every other sink of the view
reports ``"fenced"``. With no promotion ever recorded, every replica writes (active-active).

A target written before lineages were recorded has no owner: its first lineage-recording commit
claims generation 1 and continues from the frontier (the old behaviour, with a WARNING if the
epoch is below it).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mvsink.errors import ConfigError, LineageError, Where
from mvsink.table.record import Keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from mvsink.config import SinkOptions
    from mvsink.table.delta import Snapshot

log = logging.getLogger(__name__)

DIRECT = "direct"
"""The lineage of direct calls when the ``lineage`` option is not given."""


def lineage_of(batch: DataFrame, query: str | None, opts: SinkOptions, where: Where) -> str:
    """The lineage of an epoch: the ``lineage`` option; else the streaming query running the
    batch (``query``: its id from ``epoch.query``, else from the ``checkpoint`` option's
    metadata, as under Spark Connect, where the driver's properties are out of reach); else
    ``"direct"``.

    A ``checkpoint`` that cannot be read, or that names another query than the one running,
    is an error, never a silent ``"direct"``: a wrong lineage would take the view over."""
    if opts.lineage:
        return opts.lineage
    if opts.checkpoint:
        recorded = _checkpoint_query_id(opts, where)
        if query and recorded != query:
            raise ConfigError(
                f"option 'checkpoint' ({opts.checkpoint}) belongs to query {recorded}, but query "
                f"{query} runs this batch: pass the query's own checkpoint location",
                where,
            )
        query = recorded
    if not query and _in_connect_foreach_batch(batch):
        raise ConfigError(
            "under Spark Connect the sink cannot see which streaming query runs the batch, so a "
            "new checkpoint would be taken for a replay and its batches skipped: pass option "
            "'checkpoint' (the query's checkpointLocation) or 'lineage'",
            where,
        )
    return f"query:{query}" if query else DIRECT


def _in_connect_foreach_batch(batch: DataFrame) -> bool:
    """The batch is a Spark Connect ``foreachBatch`` call: the server runs the function in a
    Python worker it points at itself with ``SPARK_CONNECT_LOCAL_URL``."""
    remote = type(batch.sparkSession).__module__.startswith("pyspark.sql.connect")
    return remote and bool(os.environ.get("SPARK_CONNECT_LOCAL_URL"))


def _checkpoint_query_id(opts: SinkOptions, where: Where) -> str:
    """The query id a streaming checkpoint records (``<checkpoint>/metadata``)."""
    from mvsink.epoch.clock import read_checkpoint_file

    assert opts.checkpoint is not None
    text = read_checkpoint_file(opts.checkpoint, "metadata", opts.storage_options, where)
    try:
        return str(json.loads(text)["id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"checkpoint {opts.checkpoint} has no query id in its metadata: {exc}", where
        ) from None


@dataclass(frozen=True)
class Lineage:
    """One lineage's standing in a snapshot of the target."""

    name: str
    app_id: str
    owner: int | None
    """The owning generation (None: no lineage ever recorded)."""
    generation: int | None
    """This lineage's generation (None: never owned the view)."""
    frontier: int | None
    """The upper of this lineage's last commit."""

    @staticmethod
    def read(snap: Snapshot, app_id: str, name: str) -> Lineage:
        keys = Keys(app_id)
        return Lineage(
            name,
            app_id,
            snap.transaction(keys.owner),
            snap.transaction(keys.generation(name)),
            snap.transaction(keys.lineage_frontier(name)),
        )

    @property
    def owns(self) -> bool:
        return self.owner is not None and self.generation == self.owner

    @property
    def fenced(self) -> bool:
        """Owned the view once, and another lineage took it since."""
        return self.owner is not None and self.generation is not None and self.generation != self.owner

    @property
    def new(self) -> bool:
        """Never owned a view that some lineage owns."""
        return self.owner is not None and self.generation is None

    def transactions(self, upper: int) -> dict[str, int]:
        """The app transactions a commit of this lineage at ``upper`` records (besides the
        frontier): its own frontier, and, unless it owns the view, the next generation."""
        keys = Keys(self.app_id)
        # (Tables whose app transactions expire are refused: delta.TRANSACTION_RETENTION.)
        generation = self.owner if self.owns and self.owner is not None else (self.owner or 0) + 1
        return {
            keys.lineage_frontier(self.name): upper,
            keys.owner: generation,
            keys.generation(self.name): generation,
        }

    def refuse_new(self, mode: str, where: Where) -> None:
        raise LineageError(
            f"epochs of a new lineage ({self.name}) arrive at a view another lineage owns: a new "
            "or moved checkpoint, a redeploy, or a second query. In "
            f"{mode} mode the batches the old lineage wrote and this one did not would be lost "
            "or doubled, so nothing was written. To take the view over from this lineage's "
            "first epoch, set on_new_lineage='adopt'; to resume the old lineage, restart from "
            "its checkpoint (or pass its lineage).",
            where,
        )


@dataclass(frozen=True)
class Writers:
    """Which writer the target names active for a view (``promote``), as ``writer`` sees it."""

    app_id: str
    writer: str | None
    active: int | None
    """The number of the last promotion (None: never promoted: every replica writes)."""
    mine: int | None
    """The promotion that made ``writer`` active, if any."""

    @staticmethod
    def read(snap: Snapshot, app_id: str, writer: str | None) -> Writers:
        keys = Keys(app_id)
        mine = None if writer is None else snap.transaction(keys.writer(writer))
        return Writers(app_id, writer, snap.transaction(keys.active), mine)

    @property
    def is_active(self) -> bool:
        """``writer`` is the one promoted last."""
        return self.active is not None and self.mine == self.active

    @property
    def may_write(self) -> bool:
        return self.active is None or self.is_active

    def restamp(self) -> dict[str, int]:
        """What a commit of the active writer records again, so the promotion never expires."""
        if not self.is_active or self.writer is None or self.active is None:
            return {}
        keys = Keys(self.app_id)
        return {keys.active: self.active, keys.writer(self.writer): self.active}

    def promotion(self) -> dict[str, int]:
        """The app transactions that make ``writer`` the active writer."""
        if self.writer is None:
            raise ValueError("a promotion needs a writer name")
        n = (self.active or 0) + 1
        keys = Keys(self.app_id)
        return {keys.active: n, keys.writer(self.writer): n}
