"""Decide: what one attempt of an epoch does, given the snapshot it read.

Every attempt reads a fresh snapshot and asks ``decide`` once, a pure function of what it is
given: the snapshot, the options, the epoch and its lineage, whether the sink is read-only,
and, computed by the caller, the epoch's standing under a shared clock (``clock.standing``),
where its batch starts (``clock.batch_start``) and the time now. The answer is a ``Commit``
at a batch description ``(lower, upper)`` (``mint.py``), a ``Skip`` naming why nothing is
written (``report.Reason``), or a ``Refuse``: the epoch fails with its error. Under a shared
clock the answer also carries where the epoch's time stood, for the caller's stall watch
(``clock.Stall``). We commit only when, in this order:

0. Under the source offsets clock, the batch does not end before it starts in some part:
   that is an offset reset within the query (a topic deleted and made again, read with
   ``failOnDataLoss = false``), refused at its first such epoch, since every later epoch would
   be taken for a replay of the old offsets. The way on is a new checkpoint with ``take_over``
   naming the view: its first epoch, behind or incomparable, takes the committed time as its
   own. Every commit of a lineage with that option records so (``record.Keys.clock_taken``),
   so the lineage never takes it again; a new checkpoint started with the option left on
   would, which is why the docs say to remove it.
1. ``before_as_of``: the epoch is at or past the ``as_of`` option.
2. ``fenced``: the epoch's lineage was not superseded (``lineage.py``; without a shared
   clock, and unless its writer was promoted since): an old job left running never writes
   again.
3. ``replay``: the epoch is not yet reflected: ``epoch + 1`` is past its own lineage's
   frontier, or, under a shared clock, its time is ahead of the committed time (not behind,
   equal or incomparable). Writing would move the view back (I1, ``mvsink.epoch``). A new or
   superseded lineage is never taken for a replay of another's (see 6).
4. ``read_only``: the sink is not a standby (read-only and not named active writer). A
   standby still plans and reports the correction, but never commits; its replay is a replay.
5. ``fenced``: no other writer was promoted to active writer; otherwise even a replay is
   ``fenced``, so nothing beside the view, such as its errors table, is written for it either.
6. A new lineage, or a superseded one whose writer was promoted, takes the view over from
   this epoch (a takeover description) only with ``on_new_lineage = "adopt"`` or as the active
   writer; otherwise ``Refuse`` (``Lineage.refuse_new``).
7. ``between_refreshes``: ``refresh_every`` is unset, or a refresh is due. Complete mode
   only; a commit that must land (see ``Commit.always``) is never held back.
8. No gap: in upsert or append mode, epochs between the frontier and this one that never
   committed would lose their rows; under a shared clock, so would a batch that starts past
   the committed time, or whose start is unknown. That is a ``Refuse`` (``LineageError``), or
   with ``allow_gaps`` a WARNING and a commit (an unknown start also with ``on_new_lineage =
   "adopt"``, which accepts the loss knowingly).
9. No late start: in complete mode a batch is the query's whole state, so a query that
   started reading its sources after the query that built the view did (Kafka's
   ``startingOffsets = latest``, a topic whose retention dropped records since) would replace
   the view by an aggregate that lacks what came before its start. The view's first commit
   records where its query started (its **origin**, ``record.Keys.origin``); a new lineage
   taking the view over, or any commit under a shared clock, whose query's start is known
   (``clock.query_start``) and past the origin in some part is a ``Refuse``, unless
   ``allow_late_start`` (which records the new start as the origin). A view committed before
   origins were recorded counts from 0, except for the query that continues it.

A ``Commit`` says whether it lands even with an empty correction (``always``). Otherwise, once
the correction is staged, an empty one writes no version (``unchanged``, the last verdict).

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
from dataclasses import dataclass, replace

from mvsink.config import Cadence, SinkOptions
from mvsink.epoch.clock import Standing, Start, Time, continues, skips, went_back
from mvsink.epoch.lineage import Lineage, Writers
from mvsink.epoch.mint import BatchDescription, mint
from mvsink.errors import ConfigError, LineageError, MVSinkError, Where
from mvsink.report import Reason
from mvsink.table.delta import Snapshot
from mvsink.table.record import Keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Skip:
    """Write nothing this attempt, for ``reason``."""

    reason: Reason
    entitled: bool = True
    """Whether this sink may write the view at all (False: a standby not promoted, a fenced
    lineage or writer). Only a sink that may writes the errors table for an epoch the view
    already holds (``quarantine.py``)."""
    stall: Standing | None = None
    """Where the epoch's time stood under a shared clock, for the stall watch (None: no clock,
    or a writer that is not the active one)."""

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
    """Complete mode: where the epoch's query started, to record as the view's origin
    (condition 9); None: the recorded one stands."""
    stall: Standing | None = None
    """As ``Skip.stall``."""


@dataclass(frozen=True)
class Refuse:
    """The epoch fails with ``error``: nothing is written (conditions 0, 6, 8, 9, or a batch
    start that could not be read when the gap check needed it)."""

    error: MVSinkError
    stall: Standing | None = None
    """As ``Skip.stall``: the stall watch hears it before the error is raised."""


Decision = Commit | Skip | Refuse


@dataclass(frozen=True)
class _Stated:
    """What an attempt decides from, read once."""

    snap: Snapshot
    epoch: int
    opts: SinkOptions
    lineage: Lineage
    writers: Writers
    standby: bool
    """Read-only and not named the view's active writer (a standby promoted writes)."""
    clock: Standing | None
    """Under a shared clock, where the epoch's time stands ("ahead" when it takes the clock)."""
    takes_clock: bool
    start: Start
    now: int
    where: Where


def decide(
    snap: Snapshot,
    epoch: int,
    opts: SinkOptions,
    *,
    lineage: str,
    read_only: bool,
    clock: Standing | None,
    start: Start,
    now: int,
    where: Where,
    query_start: Callable[[], Time | None] = lambda: None,
) -> Decision:
    """What this attempt of ``epoch`` does against ``snap`` (the conditions of the module
    doc). ``lineage`` is the epoch's lineage; ``clock`` its standing under a shared clock
    (None: no clock); ``start`` where its batch starts (``clock.batch_start``; None where not
    known, or without a clock); ``now`` the time in milliseconds, for a time cadence;
    ``query_start`` reads where the batch's query started, asked only by condition 9 (a read
    of the query's checkpoint, kept by the caller). Raises only ``InvariantViolation``."""
    held = Lineage.read(snap, opts.app_id, lineage)
    writers = Writers.read(snap, opts.app_id, opts.writer)
    reset = _offsets_reset(epoch, opts, clock, start, where)  # 0
    if reset is not None:
        return Refuse(reset)
    takes_clock = clock is not None and _takes_clock(snap, epoch, opts, held, clock, read_only, where)
    s = _Stated(
        snap,
        epoch,
        opts,
        held,
        writers,
        standby=read_only and not writers.is_active,
        clock=replace(clock, verdict="ahead") if clock is not None and takes_clock else clock,
        takes_clock=takes_clock,
        start=start,
        now=now,
        where=where,
    )
    reason = _reason(s)  # 1-5
    if reason is not None:
        return _skip(s, reason)
    desc = _describe(s)  # 6
    if isinstance(desc, Refuse):
        return desc
    return _commit(s, desc, query_start)  # 7-9


def unchanged(decision: Commit, *, writes_files: bool, changes_schema: bool, takes_table: bool) -> bool:
    """The last verdict, once the correction is staged: an epoch that need not commit (not
    ``decision.always``) writes no version when it adds and removes no file, keeps the table's
    schema and takes the table from nobody (``holder.py``). Its outcome is ``unchanged``."""
    return not (writes_files or decision.always or changes_schema or takes_table)


def _skip(s: _Stated, reason: Reason) -> Skip:
    """A skip for ``reason``; a fenced sink is not entitled, nor heard by the stall watch."""
    fenced = reason == "fenced"
    return Skip(reason, entitled=not fenced and not s.standby, stall=None if fenced else s.clock)


def _reason(s: _Stated) -> Reason | None:
    """Conditions 1 to 5: why the epoch writes nothing, or None."""
    if s.epoch < s.opts.as_of:
        return "before_as_of"
    if s.clock is None and s.lineage.fenced and not s.writers.is_active:
        log.warning(
            "%s: lineage %s was superseded by another that took the view over; this epoch "
            "writes nothing (stop this job, or restart it with a new checkpoint to take the "
            "view back)",
            s.where,
            s.lineage.name,
        )
        return "fenced"
    replay = _replay(s)
    if s.standby and not replay:
        return "read_only"
    if not s.writers.may_write:
        log.warning(
            "%s: writer %s is not the view's active writer (another was promoted); this epoch writes nothing",
            s.where,
            s.opts.writer,
        )
        return "fenced"
    return "replay" if replay else None


def _replay(s: _Stated) -> bool:
    """Condition 3: the epoch is already reflected in its lineage's frontier, or its time is
    not ahead of the committed time."""
    if s.clock is not None:
        if s.clock.verdict == "ahead":
            return False
        log.info("%s: the epoch's time is %s the committed time: nothing to write", s.where, s.clock.verdict)
        return True
    held, frontier = s.lineage, s.snap.frontier
    if held.new or held.fenced:
        return False  # it takes the view over, or is refused (6)
    own = held.frontier if held.owns else frontier
    if own is None or s.epoch + 1 > own:
        return False
    if held.owner is None:
        log.warning(
            "%s: epoch %d is below the frontier %d of a view with no recorded lineage: taken "
            "for a replay (if a new checkpoint started, pass a new lineage to take over)",
            s.where,
            s.epoch,
            own,
        )
    return True


def _describe(s: _Stated) -> BatchDescription | Refuse:
    """Condition 6, and the description the epoch commits at: clocked under a shared clock
    (the time decides, whatever the lineage), a takeover for a new or superseded lineage."""
    held, frontier = s.lineage, s.snap.frontier
    if s.clock is not None:
        return mint(s.epoch, frontier, clocked=True, where=s.where)
    if not (held.new or held.fenced):
        return mint(s.epoch, frontier, where=s.where)
    if s.opts.new_lineage_policy != "adopt" and not s.writers.is_active:
        try:
            held.refuse_new(s.opts.mode, s.where)
        except LineageError as exc:
            return Refuse(exc)
    log.warning(
        "%s: lineage %s takes the view over at its epoch %d (the view's frontier was %s); the "
        "lineage that owned it is fenced from now on",
        s.where,
        held.name,
        s.epoch,
        frontier,
    )
    return mint(s.epoch, frontier, takeover=True, where=s.where)


def _commit(s: _Stated, desc: BatchDescription, query_start: Callable[[], Time | None]) -> Decision:
    """Conditions 7 to 9, for an epoch that may commit at ``desc``; and whether it must land."""
    always = _always(s, desc)
    if not always and s.opts.refresh is not None:
        if not _due(s.opts.refresh, s, desc):
            return _skip(s, "between_refreshes")
        always = True  # a refresh commits even when nothing changed: the next one counts from it
    try:
        _check_gap(s, desc)
        origin = _check_start(s, desc, query_start)
    except (LineageError, ConfigError) as exc:
        return Refuse(exc, s.clock)
    always = always or s.takes_clock or _due(s.opts.heartbeat_cadence, s, desc)
    return Commit(desc, s.lineage, s.writers, always, s.takes_clock, origin, s.clock)


def _takes_clock(
    snap: Snapshot,
    epoch: int,
    opts: SinkOptions,
    held: Lineage,
    clock: Standing,
    read_only: bool,
    where: Where,
) -> bool:
    """Whether the epoch, behind or incomparable, takes the committed time as its own
    (``take_over`` naming the view, at the first epoch of a lineage that never did: 0)."""
    taken = snap.transaction(Keys(opts.app_id).clock_taken(held.name)) is not None
    takes = (
        opts.take_over == opts.name
        and epoch == 0
        and not taken
        and not read_only
        and clock.verdict in ("behind", "incomparable")
    )
    if takes:
        log.warning(
            "%s: lineage %s takes the view's committed time %s as its own at %s (option take_over)",
            where,
            held.name,
            clock.committed,
            clock.time,
        )
    return takes


def _always(s: _Stated, desc: BatchDescription) -> bool:
    """Whether the epoch must commit even with nothing to change (``Commit.always``), before
    any cadence: every epoch in upsert and append mode; in complete mode, one that creates the
    table, takes the view over or records its lineage for the first time."""
    if s.opts.mode != "complete" or not s.snap.exists:
        return True
    return desc.takeover or (s.lineage.owner is None and not desc.clocked)


def _due(cadence: Cadence, s: _Stated, desc: BatchDescription) -> bool:
    """Whether ``cadence`` is due: counted in epochs since the lineage's last commit (not
    known under a shared clock, or before the lineage committed: due), or in time since the
    view's last commit."""
    own = s.lineage.frontier if s.lineage.owns else None
    since = None if desc.clocked or own is None else desc.upper - own
    last_at = s.snap.transaction(Keys(s.opts.app_id).at)
    return cadence.due(epochs_since=since, last_at_ms=last_at, now=s.now)


def _continues(s: _Stated) -> bool:
    """The committed time is this writer's own commit of the batch before (``clock.continues``)."""
    return continues(s.snap, s.opts.app_id, s.lineage.name, s.opts.writer, s.epoch)


def _check_gap(s: _Stated, desc: BatchDescription) -> None:
    """Condition 8. A complete batch repairs everything its query read (a complete query's own
    start: ``_check_start``). In upsert or append mode, epochs of this lineage between the
    frontier and this one that were never written would be missing rows. That is a
    ``LineageError`` unless ``allow_gaps`` (then a WARNING). This is also why the heartbeat
    thins complete mode only: elsewhere a version is the proof that an epoch was applied."""
    if s.opts.mode == "complete":
        return
    message = _clock_gap(s) if desc.clocked else _epoch_gap(s, desc)
    if message is None:
        return
    if not s.opts.allow_gaps:
        raise LineageError(message + ". Nothing was written; set allow_gaps=True to go on.", s.where)
    log.warning("%s: %s", s.where, message)


def _epoch_gap(s: _Stated, desc: BatchDescription) -> str | None:
    """The gap in epochs of ``desc``, said (None: none)."""
    if desc.takeover:
        if s.epoch <= s.opts.as_of:
            return None
        return (
            f"a new lineage takes the view over at its epoch {s.epoch}, not its first: in "
            f"{s.opts.mode} mode the rows of its earlier epochs would be missing"
        )
    if desc.lower is None or desc.upper <= desc.lower + 1:
        return None
    return (
        f"epochs {desc.lower}..{desc.upper - 2} were never committed to the target; in "
        f"{s.opts.mode} mode their rows would be missing (was the table restored, a "
        "standby promoted late, or the checkpoint replaced?)"
    )


def _clock_gap(s: _Stated) -> str | None:
    """The gap under a shared clock, said (None: none): the batch covers (its start, its end],
    so rows between the committed time and its start were never written by anyone. A start
    not known is the committed time when that is this writer's commit of the batch before
    (``_continues``). A start that could not be read raises its ``ConfigError``."""
    committed = None if s.clock is None else s.clock.committed
    if committed is None:
        return None
    start, mode = s.start, s.opts.mode
    if isinstance(start, ConfigError):
        raise start
    if start is not None:
        if not skips(start, committed):
            return None
        return (
            f"this batch starts at {start}, past the committed source offsets {committed}: in "
            f"{mode} mode the rows in between would be missing (a replica that skipped "
            "batches, a standby that started late, or a new checkpoint started from later "
            "offsets)"
        )
    if _continues(s):
        return None
    message = (
        f"this batch's start is unknown (a query's first batch whose sources did not "
        f"record where it started, or a callable clock's first batch in this process), so "
        f"it cannot prove it covers the committed time {committed}: in {mode} mode the "
        "rows in between could be missing. Start the query from the committed offsets "
        "(mvsink status shows them: Kafka's startingOffsets, mvsink-delta's "
        "startingVersion), or set on_new_lineage='adopt' to accept that loss knowingly"
    )
    if s.opts.new_lineage_policy == "adopt":
        log.warning("%s: %s; adopted", s.where, message)
        return None
    return message


def _offsets_reset(
    epoch: int, opts: SinkOptions, clock: Standing | None, start: Start, where: Where
) -> LineageError | None:
    """Condition 0: a batch whose source offsets go back from where the batch before it ended
    (see the module doc). Only a later batch of a query is checked (a first batch starts where
    it starts), and only under ``source_offsets``: a callable clock's parts are its own. A
    start that could not be read (the batch before's offsets are gone) has nothing to compare."""
    if clock is None or epoch == 0 or opts.clock != "source_offsets":
        return None
    back = {} if start is None or isinstance(start, ConfigError) else went_back(start, clock.time)
    if not back:
        return None
    shown = ", ".join(f"{part}: {was} -> {now}" for part, (was, now) in back.items())
    return LineageError(
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


def _check_start(s: _Stated, desc: BatchDescription, query_start: Callable[[], Time | None]) -> Time | None:
    """Condition 9, in complete mode: a query does not replace a view whose origin its start
    skips (past it in some part): a new lineage taking the view over, or any commit under a
    shared clock. Returns the start to record as the origin: the view's first commit's, a
    view's without one (recorded before origins were), a late start taken knowingly. A start
    not known (no checkpoint in reach, a source that does not say where its query started,
    a query whose first offsets Spark cleaned up) is not checked, nor recorded."""
    snap, opts = s.snap, s.opts
    if opts.mode != "complete" or not (desc.clocked or desc.takeover or snap.frontier is None):
        return None
    start = query_start()
    if start is None:
        return None
    if snap.frontier is None:
        return start  # the view's first commit: where it begins
    keys = Keys(opts.app_id)
    recorded = snap.transaction(keys.origins) is not None
    if not recorded and desc.clocked and _continues(s):
        return start  # the query that built the view, recording where it began
    origin = {p: v for p in start if (v := snap.transaction(keys.origin(p))) is not None}
    if not skips(start, Time.of(origin)):  # (no origin recorded: from 0, the strict reading)
        return None if recorded else start
    if opts.allow_late_start:
        log.warning("%s: the query started at %s, past the view's origin %s; allowed", s.where, start, origin)
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
        s.where,
    )
