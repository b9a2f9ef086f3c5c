"""Decide: what one attempt of an epoch does, given the snapshot it read.

Every attempt reads a fresh snapshot and asks ``decide`` once. The answer is either a
``Commit`` at a batch description ``(lower, upper)``, or a ``Skip`` naming why nothing is
written. Each reason is decided here, once, in this order:

1. ``before_as_of``: the epoch precedes the ``as_of`` option (``mint.py``).
2. ``replay``: the epoch is already reflected in its lineage's frontier, or, under a shared
   clock, its time is behind, equal to or incomparable with the committed time. Writing
   would move the view back (invariant I1, ``mvsink.epoch``).
3. ``fenced``: the epoch's lineage was superseded (``lineage.py``), or another writer was
   promoted to active writer (then whatever the epoch's time: even a replay is ``fenced``,
   so nothing beside the view, such as its errors table, is written for it either). An old
   job left running never writes again.
4. ``read_only``: a standby. It still plans and reports the correction, but never commits.
5. ``between_refreshes``: ``refresh_every`` is set and no refresh is due. Complete mode
   only; a commit that must land (see ``Commit.always``) is never held back.
6. A gap: in upsert or append mode, epochs between the frontier and this one that never
   committed would lose their rows; under a shared clock, so would a batch that starts past
   the committed time, or whose start is unknown (``clock.batch_start``). That raises
   ``LineageError``, or with ``allow_gaps`` logs a WARNING and commits (an unknown start
   also with ``on_new_lineage = "adopt"``, which accepts the loss knowingly).
7. A late start: in complete mode a batch is the query's whole state, so a query that
   started reading its sources after the query that built the view did (Kafka's
   ``startingOffsets = latest``, a topic whose retention dropped records since) would replace
   the view by an aggregate that lacks what came before its start. The view's first commit
   records where its query started (its **origin**, ``record.Keys.origin``); a new lineage
   taking the view over, or any commit under a shared clock, whose query's start is known
   (``clock.query_start``) and past the origin in some part raises ``LineageError``, unless
   ``allow_late_start`` (which records the new start as the origin). A view committed before
   origins were recorded counts from 0, except for the query that continues it.

Under the source offsets clock, before any of these, a batch that ends before it starts in
some part is an offset reset within the query (a topic deleted and made again, read with
``failOnDataLoss = false``): ``LineageError`` at its first such epoch, since every later
epoch would be taken for a replay of the old offsets. The way on is a new checkpoint with
``take_over`` naming the view: its first epoch, behind or incomparable, takes the committed
time as its own. Every commit of a lineage with that option records so
(``record.Keys.clock_taken``), so the lineage never takes it again; a new checkpoint started
with the option left on would, which is why the docs say to remove it.

A ``Commit`` says whether it lands even with an empty correction (``always``). Otherwise an
empty correction writes no version when no heartbeat is due: the report says ``unchanged``.

The cadence (``config.Cadence``: a number of epochs or a duration) is counted since the view's
last commit, read from the target, never kept in memory, so a restart or a replica sees the
same: in epochs, ``epoch + 1 - frontier`` of the epoch's lineage; in time, the app transaction
``#at`` every commit records (``table/record.py``). ``heartbeat`` lets a quiet complete-mode
view make a version only that often (the frontier still moves often enough for replay
detection and app-transaction retention); ``refresh_every`` advances the view only when a
refresh is due, and a due refresh commits even when nothing changed. What must land always
commits: a view's first commit, a lineage taking the view over or recording itself for the
first time. Upsert and append mode commit every epoch: there a version is the proof that an
epoch was applied (only a complete batch repairs everything, so only complete mode skips).

Whatever the answer, the micro-batch still runs to its end (``EpochContext.drain``). Spark
fails a stateful ``foreachBatch`` whose batch did not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mvsink.config import Cadence, SinkOptions
from mvsink.epoch.clock import (
    Time,
    Verdict,
    committed_time,
    compare,
    continues,
    skips,
    went_back,
)
from mvsink.epoch.lineage import Lineage, Writers
from mvsink.epoch.mint import BatchDescription, mint
from mvsink.errors import ConfigError, LineageError, Where
from mvsink.table.delta import Snapshot
from mvsink.table.record import Keys

log = logging.getLogger(__name__)

Reason = Literal["before_as_of", "replay", "fenced", "read_only", "between_refreshes"]


@dataclass(frozen=True)
class Clocked:
    """Where the epoch's time stood under a shared clock (``clock.py``), for the stall watch."""

    verdict: Verdict
    committed: Time | None


@dataclass(frozen=True)
class Skip:
    """Write nothing this attempt, for ``reason``."""

    reason: Reason
    entitled: bool = True
    """Whether this sink may write the view at all (False: a standby not promoted). Only a
    sink that may writes the errors table for an epoch the view already holds
    (``quarantine.py``)."""

    @property
    def plans(self) -> bool:
        """A read-only sink still plans its correction, to report it."""
        return self.reason == "read_only"


@dataclass(frozen=True)
class Commit:
    """Plan, stage and commit at ``desc``, recording ``lineage`` and ``writers``."""

    desc: BatchDescription
    lineage: Lineage
    writers: Writers
    always: bool
    """Commit even with an empty correction. True in these cases:
    - upsert and append mode: there a version proves the epoch was applied, and the gap
      check takes a missing one for a lost epoch;
    - creating the table;
    - taking the view over, or recording the lineage for the first time;
    - a refresh or a heartbeat is due (a time-based heartbeat is checked here, before the
      correction is planned, not after: at worst one epoch later than it could have been)."""
    takes_clock: bool = False
    """Under a shared clock, the commit makes its time the view's whatever the committed time
    was (``take_over`` naming the view, at the lineage's first epoch)."""
    origin: Time | None = None
    """Complete mode: where the epoch's query started, to record as the view's origin (reason
    7); None: the recorded one stands."""


Decision = Commit | Skip


def decide(
    snap: Snapshot,
    epoch: int,
    opts: SinkOptions,
    *,
    lineage: str,
    time: Time | None,
    read_only: bool,
    batch_start: Callable[[], Time | None],
    where: Where,
    on_clock: Callable[[Clocked], None] | None = None,
    query_start: Callable[[], Time | None] = lambda: None,
) -> Decision:
    """What this attempt of ``epoch`` does against ``snap`` (see the module doc). ``lineage``
    is the epoch's lineage; ``time`` its time under a shared clock (None: no clock);
    ``batch_start`` gives the time the batch starts at, asked only by the gap check under a
    shared clock; ``query_start`` where the batch's query started reading (asked only by the
    late-start check, 7). Under a shared clock, ``on_clock`` hears where the epoch's time
    stands (the stall watch, ``clock.Stall``) before any reason but a fenced writer is decided.
    Raises ``LineageError`` for an offset reset, a gap (6) or a late start (7), or for a new
    lineage that may not take the view over (``mint``)."""
    held = Lineage.read(snap, opts.app_id, lineage)
    writers = Writers.read(snap, opts.app_id, opts.writer)
    clock = None
    takes_clock = False
    if time is not None:
        _check_not_reset(epoch, time, opts, batch_start, where)
        committed = committed_time(snap, opts.app_id, time)
        verdict = compare(time, committed)
        taken = snap.transaction(Keys(opts.app_id).clock_taken(lineage)) is not None
        takes_clock = (
            opts.take_over == opts.name
            and epoch == 0
            and not taken
            and not read_only
            and verdict in ("behind", "incomparable")
        )
        if takes_clock:
            log.warning(
                "%s: lineage %s takes the view's committed time %s as its own at %s (option take_over)",
                where,
                lineage,
                committed,
                time,
            )
        clock = Clocked("ahead" if takes_clock else verdict, committed)
    try:
        desc = mint(
            epoch,
            snap.frontier,
            held,
            as_of=opts.as_of,
            # A standby that the target names active writer writes from its next epoch.
            read_only=read_only and not writers.is_active,
            adopt=opts.new_lineage_policy == "adopt",
            mode=opts.mode,
            where=where,
            verdict=None if clock is None else clock.verdict,
            active_writer=writers.is_active,
        )
    except LineageError:
        if writers.may_write:
            raise
        return _not_active(opts, where)  # a refused new lineage, where another writer is active
    if (isinstance(desc, BatchDescription) or desc == "replay") and not writers.may_write:
        return _not_active(opts, where)
    if clock is not None and on_clock is not None:
        on_clock(clock)
    if not isinstance(desc, BatchDescription):
        if desc == "fenced":
            log.warning(
                "%s: lineage %s was superseded by another that took the view over; this epoch "
                "writes nothing (stop this job, or restart it with a new checkpoint to take the "
                "view back)",
                where,
                lineage,
            )
        return Skip(desc, entitled=desc != "fenced" and not (read_only and not writers.is_active))
    always = _always(snap, desc, held, opts)
    if not always and opts.refresh is not None:
        if not _due(opts.refresh, snap, desc, held, opts):
            return Skip("between_refreshes")
        always = True  # a refresh commits even when nothing changed: the next one counts from it
    _check_gap(
        desc,
        epoch,
        opts,
        clock,
        batch_start,
        lambda: continues(snap, opts.app_id, lineage, opts.writer, epoch),
        where,
    )
    origin = _check_start(
        desc,
        snap,
        opts,
        query_start,
        lambda: continues(snap, opts.app_id, lineage, opts.writer, epoch),
        where,
    )
    always = always or takes_clock or _due(opts.heartbeat_cadence, snap, desc, held, opts)
    return Commit(desc, held, writers, always, takes_clock, origin)


def _not_active(opts: SinkOptions, where: Where) -> Skip:
    """Another writer was promoted: this sink writes nothing, whatever its epoch (reason 3)."""
    log.warning(
        "%s: writer %s is not the view's active writer (another was promoted); this epoch writes nothing",
        where,
        opts.writer,
    )
    return Skip("fenced", entitled=False)


def _always(snap: Snapshot, desc: BatchDescription, lineage: Lineage, opts: SinkOptions) -> bool:
    """Whether the epoch must commit even with nothing to change (``Commit.always``), before
    any cadence: every epoch in upsert and append mode; in complete mode, one that creates the
    table, takes the view over or records its lineage for the first time."""
    if opts.mode != "complete" or not snap.exists:
        return True
    return desc.takeover or (lineage.owner is None and not desc.clocked)


def _due(
    cadence: Cadence, snap: Snapshot, desc: BatchDescription, lineage: Lineage, opts: SinkOptions
) -> bool:
    """Whether ``cadence`` is due: counted in epochs since the lineage's last commit (not
    known under a shared clock, or before the lineage committed: due), or in time since the
    view's last commit."""
    own = lineage.frontier if lineage.owns else None
    since = None if desc.clocked or own is None else desc.upper - own
    return cadence.due(epochs_since=since, last_at_ms=snap.transaction(Keys(opts.app_id).at))


def _check_gap(
    desc: BatchDescription,
    epoch: int,
    opts: SinkOptions,
    clock: Clocked | None,
    batch_start: Callable[[], Time | None],
    continued: Callable[[], bool],
    where: Where,
) -> None:
    """Reason 6. A complete batch repairs everything its query read. In upsert or append
    mode, epochs of this lineage between the frontier and this one that were never written
    would be missing rows. That is a ``LineageError`` unless ``allow_gaps`` (then a WARNING).
    This is also why the heartbeat thins complete mode only: elsewhere a version is the proof
    that an epoch was applied. In complete mode under the source offsets clock, a query's
    first batch known to start past the committed time is one too: the query's state lacks
    what came between (a replica started from later offsets), so its view would drop it."""
    if opts.mode == "complete":
        return  # (a complete query's own start: ``_check_start``)
    if desc.takeover and epoch > opts.as_of:
        message = (
            f"a new lineage takes the view over at its epoch {epoch}, not its first: in "
            f"{opts.mode} mode the rows of its earlier epochs would be missing"
        )
    elif desc.clocked:
        # The batch covers (its start, its end]: rows between the committed time and its
        # start were never written by anyone. A start not known is the committed time when
        # that is this writer's commit of the batch before (``clock.continues``).
        committed = None if clock is None else clock.committed
        if committed is None:
            return
        start = batch_start()
        if start is None and continued():
            return
        if start is None:
            message = (
                f"this batch's start is unknown (a query's first batch whose sources did not "
                f"record where it started, or a callable clock's first batch in this process), so "
                f"it cannot prove it covers the committed time {committed}: in {opts.mode} mode the "
                "rows in between could be missing. Start the query from the committed offsets "
                "(mvsink status shows them: Kafka's startingOffsets, mvsink-delta's "
                "startingVersion), or set on_new_lineage='adopt' to accept that loss knowingly"
            )
            if opts.new_lineage_policy == "adopt":
                log.warning("%s: %s; adopted", where, message)
                return
        elif not skips(start, committed):
            return
        else:
            message = (
                f"this batch starts at {start}, past the committed source offsets {committed}: in "
                f"{opts.mode} mode the rows in between would be missing (a replica that skipped "
                "batches, a standby that started late, or a new checkpoint started from later "
                "offsets)"
            )
    elif desc.lower is None or desc.takeover or desc.upper <= desc.lower + 1:
        return
    else:
        message = (
            f"epochs {desc.lower}..{desc.upper - 2} were never committed to the target; in "
            f"{opts.mode} mode their rows would be missing (was the table restored, a "
            "standby promoted late, or the checkpoint replaced?)"
        )
    if not opts.allow_gaps:
        raise LineageError(message + ". Nothing was written; set allow_gaps=True to go on.", where)
    log.warning("%s: %s", where, message)


def _check_not_reset(
    epoch: int, time: Time, opts: SinkOptions, batch_start: Callable[[], Time | None], where: Where
) -> None:
    """A batch whose source offsets go back from where the batch before it ended (see the
    module doc). Only a later batch of a query is checked (a first batch starts where it
    starts), and only under ``source_offsets``: a callable clock's parts are its own."""
    if epoch == 0 or opts.clock != "source_offsets":
        return
    try:
        start = batch_start()
    except ConfigError:
        return  # the batch before's offsets are gone: nothing to compare
    back = {} if start is None else went_back(start, time)
    if not back:
        return
    shown = ", ".join(f"{part}: {was} -> {now}" for part, (was, now) in back.items())
    raise LineageError(
        f"the query's source offsets went back between its batches ({shown}): its source was "
        "reset under it (a Kafka topic deleted and made again, or its offsets reset, read with "
        "failOnDataLoss=false). The view's committed offsets are those of what the source held "
        "before, so every later batch would be taken for a replay and the view would stop "
        f"moving{' (its events read and never applied)' if opts.mode == 'upsert' else ''}. "
        "Nothing was written. To go on from the source as it is now: start the query from a new "
        f"checkpoint at its beginning (Kafka's startingOffsets=earliest) with take_over={opts.name!r} "
        "for that deployment, whose first commit makes its offsets the view's (docs/replicas.md)",
        where,
    )


def _check_start(
    desc: BatchDescription,
    snap: Snapshot,
    opts: SinkOptions,
    query_start: Callable[[], Time | None],
    continued: Callable[[], bool],
    where: Where,
) -> Time | None:
    """Reason 7, in complete mode: a query does not replace a view whose origin its start
    skips (past it in some part): a new lineage taking the view over, or any commit under a
    shared clock. Returns the start to record as the origin: the view's first commit's, a
    view's without one (recorded before origins were), a late start taken knowingly. A start
    not known (no checkpoint in reach, a source that does not say where its query started,
    a query whose first offsets Spark cleaned up) is not checked, nor recorded."""
    if opts.mode != "complete" or not (desc.clocked or desc.takeover or snap.frontier is None):
        return None
    start = query_start()
    if start is None:
        return None
    if snap.frontier is None:
        return start  # the view's first commit: where it begins
    keys = Keys(opts.app_id)
    recorded = snap.transaction(keys.origins) is not None
    if not recorded and desc.clocked and continued():
        return start  # the query that built the view, recording where it began
    origin = {p: v for p in start if (v := snap.transaction(keys.origin(p))) is not None}
    if not skips(start, Time.of(origin)):  # (no origin recorded: from 0, the strict reading)
        return None if recorded else start
    if opts.allow_late_start:
        log.warning("%s: the query started at %s, past the view's origin %s; allowed", where, start, origin)
        return start
    raise LineageError(
        f"this query started reading at {start}, past where the query that built the view did "
        f"({origin or 'offset 0'}): in complete mode its state lacks the records in between, "
        "which the view holds (a new checkpoint started from Kafka's startingOffsets=latest or "
        "later explicit offsets beside a view that is caught up or behind, or from earliest on "
        "a topic whose retention dropped records since the view began), so it would replace the "
        "view by an aggregate without them. Nothing was written. Start the query from a new "
        "checkpoint at the view's origin or earlier (startingOffsets=earliest where the topic "
        "still holds it), or set allow_late_start=True to replace the view by that aggregate "
        "knowingly",
        where,
    )
