"""Clocks: what an epoch's time is, so that replicas can compare epochs.

``clock = "batch_id"`` (the default): an epoch's time is Spark's batch id, meaningful only
within one lineage (``lineage.py``).

``clock = "source_offsets"``: an epoch's time is the end offsets of the micro-batch, as the
query records them in its checkpoint (``<checkpoint>/offsets/<batch id>``), as named integers
that each only grow, in each source kind's own order:

* Delta's streaming source (``{"reservoirVersion": v, "index": i, ...}``) is ordered by
  ``(v, i)`` lexicographically (``i`` restarts as ``v`` grows): one part ``"<n>.delta"``;
* ``mvsink-delta``'s ``{"version": n, "from": s, "id": t}`` is ordered by ``n``: one part
  ``"<n>.version"`` (``s``, where the query started, is no part of its time);
* any other source (Kafka's ``{"topic": {"partition": offset}}``, files' ``{"logOffset": n}``,
  a plain number) has a part per integer leaf, by dotted name (``"1.topic.3"``);
* a source without an offset yet (``-``) has no parts.

A part one time has and the other lacks counts as below every offset there: a source's first
offset, or a Kafka topic's new partition, starts from nothing. ``clock = callable``
``(batch_df, batch_id) -> int | dict`` gives the time any other way.

The time of the last commit is kept in the target as app transactions ``mvsink:<view>~<part>``
(and ``~#parts``, how many it had; ``~#by`` and ``~#upper``, the lineage and the upper of the
commit that recorded it). An epoch commits only if it is **ahead**: at or beyond the
committed time in every part and beyond in at least one. Behind or incomparable (the replicas
disagree on which is later), it writes nothing. So active-active replicas with separate
checkpoints never move the view back, and each committed version holds desired as of the time
it records.

In upsert mode a batch carries only the changes between where it starts and where it ends, so
it may commit only if it **starts** at or before the committed time (``batch_start``): a batch
starting past it would jump the changes in between, which nobody would ever write. Where a
batch starts is the end of the batch before it in its checkpoint; for a query's first batch,
where Spark or the source recorded it (Kafka's initial offsets in ``sources/<n>/0``,
``mvsink-delta``'s ``from``, Delta's source while its first batch ends inside its first
snapshot, a source with no offset yet); for a callable clock, the time it gave the batch
before (in this process). A batch whose start is unknown cannot prove it covers the committed
time, unless the committed time is its own previous batch's (``continues``: the same lineage
and ``writer``).

An epoch that stays behind or incomparable while the committed time does not move is a
**stall** (``Stall``): a WARNING each epoch naming both times, and ``mvsink status`` shows it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mvsink.errors import ConfigError, Where
from mvsink.table.record import Keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from mvsink.config import SinkOptions
    from mvsink.table.delta import Snapshot
    from mvsink.table.storage import Store

log = logging.getLogger(__name__)

Verdict = Literal["ahead", "same", "behind", "incomparable"]


class Time(dict[str, int]):
    """An epoch's time: its parts by name. ``legacy`` is the set of part names mvsink gave the
    same offsets before parts were counted (read only against views it last committed)."""

    legacy: tuple[str, ...] = ()

    @staticmethod
    def of(parts: Mapping[str, int], legacy: Sequence[str] | None = None) -> Time:
        time = Time(parts)
        time.legacy = tuple(sorted(parts if legacy is None else legacy))
        return time


def read_checkpoint_file(
    checkpoint: str, relative: str, storage_options: Mapping[str, str], where: Where
) -> str:
    """The text of a file of a streaming checkpoint (a local path or an object store URI,
    reached with the sink's ``storage_options``; ``s3a://`` is read as ``s3://``)."""
    if checkpoint.startswith("s3a://"):
        checkpoint = "s3://" + checkpoint.removeprefix("s3a://")
    try:
        data = _checkpoint_store(checkpoint, storage_options).get(relative)
    except Exception as exc:
        raise ConfigError(f"cannot read {relative} of checkpoint {checkpoint}: {exc}", where) from exc
    if data is None:
        raise ConfigError(f"checkpoint {checkpoint} has no {relative}: is it the query's checkpoint?", where)
    return bytes(data.to_pybytes()).decode()


def _checkpoint_store(checkpoint: str, storage_options: Mapping[str, str]) -> Store:
    from mvsink.table.storage import Store
    from mvsink.table.uris import table_root

    if checkpoint.startswith("s3a://"):
        checkpoint = "s3://" + checkpoint.removeprefix("s3a://")
    return Store(table_root(checkpoint), dict(storage_options))


@dataclass(frozen=True)
class RecordedOffsets:
    """A batch's end offsets as a query's checkpoint spells them (``offsets/<id>``: ``v1``, the
    batch's metadata, then one line per source: its offset as JSON, or ``-``)."""

    text: str
    batch: int | None
    """The checkpoint's batch that ended there (None: spelled from a committed time)."""

    @property
    def sources(self) -> list[Any]:
        """Each source's offset, as JSON (None: the source had none yet)."""
        return [None if line.strip() == "-" else json.loads(line) for line in self.text.splitlines()[2:]]

    @property
    def kafka(self) -> bool:
        """Whether every source is a Kafka source with an offset (topic -> partition -> offset)."""
        sources = self.sources
        return bool(sources) and all(_is_kafka(offset) for offset in sources)


def recorded_batches(checkpoint: str, storage_options: Mapping[str, str], where: Where) -> list[int]:
    """The batches whose end offsets the checkpoint still holds (Spark keeps its last ones
    only), newest first."""
    try:
        paths = _checkpoint_store(checkpoint, storage_options).files("offsets")
    except Exception as exc:
        raise ConfigError(f"cannot list the offsets of checkpoint {checkpoint}: {exc}", where) from exc
    names = (p.rpartition("/")[2] for p in paths)
    return sorted((int(n) for n in names if n.isdigit()), reverse=True)


def last_offsets(checkpoint: str, storage_options: Mapping[str, str], where: Where) -> RecordedOffsets | None:
    """The end offsets of the checkpoint's last batch (None: it has run none)."""
    batches = recorded_batches(checkpoint, storage_options, where)
    if not batches:
        return None
    text = read_checkpoint_file(checkpoint, f"offsets/{batches[0]}", storage_options, where)
    return RecordedOffsets(text, batches[0])


def committed_offsets(snap: Snapshot, opts: SinkOptions, where: Where) -> RecordedOffsets | None:
    """The view's committed time under ``clock = "source_offsets"`` as its query's checkpoint
    (``opts.checkpoint``) spells end offsets, so that a fresh query can be run to them
    (``ops/verify``): the file of the checkpoint's newest batch that ended at that time, or,
    where the checkpoint holds none (another replica's checkpoint committed it, or Spark no
    longer keeps the batch) and every source is Kafka, its newest batch's file with the
    committed offsets in place of its own. None: the view has no committed time, or it
    cannot be spelled so (a part the checkpoint's batches do not name)."""
    assert opts.checkpoint is not None
    batches = recorded_batches(opts.checkpoint, opts.storage_options, where)
    for batch in batches:
        time = _offsets(opts, batch, where)
        if compare(time, committed_time(snap, opts.app_id, time)) == "same":
            text = read_checkpoint_file(opts.checkpoint, f"offsets/{batch}", opts.storage_options, where)
            return RecordedOffsets(text, batch)
    if not batches:
        return None
    newest = RecordedOffsets(
        read_checkpoint_file(opts.checkpoint, f"offsets/{batches[0]}", opts.storage_options, where), None
    )
    if not newest.kafka:
        return None
    committed = committed_time(snap, opts.app_id, _offsets(opts, batches[0], where))
    if committed is None:
        return None
    lines, parts = newest.text.splitlines()[:2], set(committed)
    for i, offset in enumerate(newest.sources):
        spelled = {
            topic: {p: committed.get(f"{i}.{topic}.{p}") for p in partitions}
            for topic, partitions in offset.items()
        }
        parts -= {f"{i}.{topic}.{p}" for topic, partitions in offset.items() for p in partitions}
        if any(o is None for partitions in spelled.values() for o in partitions.values()):
            return None  # a partition the view never read: no offset to end it at
        lines.append(json.dumps(spelled, separators=(",", ":")))
    return None if parts else RecordedOffsets("\n".join(lines), None)


def _offsets(opts: SinkOptions, batch_id: int, where: Where) -> Time:
    """The end offsets Spark recorded for ``batch_id`` (``offsets/<id>``), as a time."""
    assert opts.checkpoint is not None
    text = read_checkpoint_file(opts.checkpoint, f"offsets/{batch_id}", opts.storage_options, where)
    lines = text.splitlines()
    if not lines or lines[0].strip() != "v1":
        raise ConfigError(f"offsets/{batch_id} of {opts.checkpoint} is not in a format mvsink knows", where)
    # After the version and the batch's metadata: one line per source, its offset as JSON, or
    # "-" for a source with none yet.
    out: dict[str, int] = {}
    raw: dict[str, Any] = {}  # as mvsink named parts before it counted them: "-" was -1
    for i, line in enumerate(lines[2:]):
        if line.strip() == "-":
            raw[str(i)] = -1
            continue
        try:
            offset = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"offsets/{batch_id} of {opts.checkpoint}: source {i}: {exc}", where) from None
        raw[str(i)] = offset
        out.update(source_parts(str(i), offset, where))
    return Time.of(out, list(flatten(raw, where)) if raw else [])


_DELTA_INDEX_BITS = 32
# Delta's file index within a version, in its own order: the base index (written -1, or -100
# from Delta 3), then the metadata-change indexes, then the files (Delta's DeltaSourceOffset).
_DELTA_SPECIAL_INDEX = {-100: 0, -1: 0, -20: 1, -19: 2}


def source_parts(name: str, offset: Any, where: Where) -> dict[str, int]:
    """One source's offset as parts that each only grow (see the module doc). An offset with
    no integer to order by (a source whose positions are strings) is an error: a time that
    never grows would freeze the view."""
    if isinstance(offset, Mapping) and "reservoirVersion" in offset and "index" in offset:
        version, index = int(offset["reservoirVersion"]), int(offset["index"])
        rank = _DELTA_SPECIAL_INDEX.get(index, index + 3 if index >= 0 else None)
        if rank is None or not (
            0 <= rank < 1 << _DELTA_INDEX_BITS and 0 <= version < 1 << (62 - _DELTA_INDEX_BITS)
        ):
            raise ConfigError(f"source {name}: a Delta offset mvsink cannot order: {offset}", where)
        return {f"{name}.delta": version << _DELTA_INDEX_BITS | rank}
    if isinstance(offset, Mapping) and {"version", "from"} <= set(offset) <= {"version", "from", "id"}:
        offset = {"version": offset["version"]}  # mvsink-delta: its start and table id are no time
    parts = flatten(offset, where, name) if not isinstance(offset, (int, bool)) else {name: int(offset)}
    if not parts:
        raise ConfigError(
            f"source {name}'s offset {json.dumps(offset)} holds no integer to order epochs by: "
            "clock 'source_offsets' cannot compare its batches (give a callable clock instead)",
            where,
        )
    return parts


def epoch_time(batch: DataFrame, epoch: int, opts: SinkOptions, where: Where) -> Time | None:
    """The epoch's time under the sink's clock (None: the batch id clock)."""
    clock = opts.clock
    if clock == "batch_id":
        return None
    if callable(clock):
        parts = flatten(clock(batch, epoch), where)
        reserved = [k for k in parts if k == "names" or k.startswith(("names@", "#"))]
        if reserved:
            raise ConfigError(f"the clock names a part {reserved[0]!r}: mvsink keeps that name", where)
        return Time.of(parts)
    if not opts.checkpoint:
        raise ConfigError("clock 'source_offsets' needs the query's 'checkpoint' option", where)
    return _offsets(opts, epoch, where)


def went_back(start: Time, end: Time) -> dict[str, tuple[int, int]]:
    """The parts in which a batch ends before it starts (``start``: where the batch before it
    ended), with both offsets: offsets only grow within a query, unless its source was reset
    (a Kafka topic deleted and made again, read with ``failOnDataLoss=false``)."""
    return {p: (start[p], end[p]) for p in sorted(start) if p in end and end[p] < start[p]}


def query_start(checkpoint: str, storage_options: Mapping[str, str], where: Where) -> Time | None:
    """Where the query whose checkpoint is ``checkpoint`` started reading, as far as a complete
    view needs it (its state holds what came from there on): ``_first_start``, but not known
    for ``mvsink-delta``, whose first batch may be the table's whole state at its start (a
    snapshot) or only the changes from it (a ``startingVersion``), the same in its offsets.
    None where it is not known; ``ConfigError`` where the checkpoint could not be read (Spark
    keeps the offsets of its last batches only: ``offsets/0`` of an old query is gone)."""
    return _first_start(checkpoint, storage_options, where, changes_only=True)


Start = Time | ConfigError | None
"""Where a batch starts (``batch_start``): its time; None where that is not known; or the
error reading it from the checkpoint (the batch before's offsets gone): the reset check then
has nothing to compare, the gap check fails with it (``decide.py``)."""


def batch_start(epoch: int, opts: SinkOptions, where: Where, before: Time | None = None) -> Start:
    """Where the batch's data starts (see the module doc), as a value: a checkpoint that could
    not be read gives its ``ConfigError``. ``before``: the time of the batch before this one,
    if this process saw it."""
    if callable(opts.clock) or before is not None:
        return before
    if opts.clock != "source_offsets":
        return None
    assert opts.checkpoint is not None
    try:
        if epoch > 0:
            return _offsets(opts, epoch - 1, where)
        return _first_start(opts.checkpoint, opts.storage_options, where)
    except ConfigError as exc:
        return exc
    except (ValueError, KeyError, TypeError) as exc:  # a checkpoint file not as Spark writes it
        # A value too: only the checks that need the start (an offset reset, a gap) raise it.
        return ConfigError(
            f"cannot read where batch {epoch} starts from the query's checkpoint: {exc}", where
        )


def _first_start(
    checkpoint: str, storage_options: Mapping[str, str], where: Where, *, changes_only: bool = False
) -> Time | None:
    """Where a query's first batch starts, source by source, from what its checkpoint holds
    (None: some source's start is not recorded; with ``changes_only``, also an
    ``mvsink-delta`` source's, which may be a snapshot)."""
    lines = read_checkpoint_file(checkpoint, "offsets/0", storage_options, where).splitlines()
    out: dict[str, int] = {}
    for i, line in enumerate(lines[2:]):
        if line.strip() == "-":
            continue  # no offset yet: the batch starts from nothing
        end = json.loads(line)
        name = str(i)
        if isinstance(end, Mapping) and "version" in end and "from" in end:  # mvsink-delta
            if changes_only:
                return None
            out[f"{name}.version"] = int(end["from"])
        elif isinstance(end, Mapping) and "reservoirVersion" in end:
            # Delta's own source starts from its first snapshot, unless told a startingVersion;
            # only while a batch ends inside that snapshot does its offset say so (a batch that
            # read it whole ends at the next version, as one from a startingVersion would).
            if end.get("isStartingVersion") is not True:
                return None
        elif isinstance(end, Mapping) and set(end) == {"logOffset"}:
            pass  # the file source: offsets count its own checkpoint's log, from nothing
        elif _is_kafka(end):
            start = kafka_initial(checkpoint, storage_options, i, where)
            if start is None:
                return None
            out.update(source_parts(name, start, where))
        else:
            return None
    return Time.of(out)


def _is_kafka(offset: Any) -> bool:
    """Kafka's offset shape: topic -> partition -> offset."""
    return (
        isinstance(offset, Mapping)
        and bool(offset)
        and all(
            isinstance(p, Mapping) and all(isinstance(o, int) and not isinstance(o, bool) for o in p.values())
            for p in offset.values()
        )
    )


def kafka_initial(checkpoint: str, storage_options: Mapping[str, str], source: int, where: Where) -> Any:
    """The initial offsets Spark's Kafka source recorded for the query (``sources/<n>/0``: a
    zero byte, ``v1``, then the offsets as JSON; ``kafka_initial_file``), where it started
    reading, or None without them."""
    try:
        text = read_checkpoint_file(checkpoint, f"sources/{source}/0", storage_options, where)
    except ConfigError:
        return None
    lines = text.lstrip("\x00").split("\n", 1)
    if len(lines) != 2 or lines[0].strip() != "v1":
        return None
    try:
        offsets = json.loads(lines[1])
    except ValueError:
        return None
    return offsets if _is_kafka(offsets) else None


def kafka_initial_file(offsets: Mapping[str, Mapping[str, int]]) -> bytes:
    """``sources/<n>/0`` of a checkpoint whose Kafka source starts at ``offsets``, as Spark
    writes it (``kafka_initial`` reads it): Spark reads a query's first batch's start there,
    and resolves ``startingOffsets`` only where there is no such file."""
    return b"\x00v1\n" + json.dumps(offsets, separators=(",", ":"), sort_keys=True).encode()


def continues(snap: Snapshot, app_id: str, lineage: str, writer: str | None, epoch: int) -> bool:
    """Whether the committed time is the one this writer recorded for ``epoch - 1`` of
    ``lineage``: then ``epoch`` starts exactly where the view stands."""
    return (
        snap.transaction(Keys(app_id).clock(_BY)) == committer_tag(lineage, writer)
        and snap.transaction(Keys(app_id).clock(_UPPER)) == epoch
    )


def committer_tag(lineage: str, writer: str | None) -> int:
    """A lineage and the writer running it, as a non-negative app transaction version. Without
    a ``writer`` name, this process (``host:pid``): a restart then does not continue, and two
    replicas that share a lineage name never continue each other's commits."""
    who = writer if writer is not None else f"{socket.gethostname()}:{os.getpid()}"
    return int(hashlib.sha256(f"{lineage}\n{who}".encode()).hexdigest()[:15], 16)


def flatten(value: Any, where: Where, prefix: str = "") -> dict[str, int]:
    """Integer leaves of a (nested) offset, by dotted name."""
    out: dict[str, int] = {}
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        out[prefix or "t"] = value
    elif isinstance(value, Mapping):
        for k in sorted(value):
            out.update(flatten(value[k], where, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(flatten(v, where, f"{prefix}.{i}" if prefix else str(i)))
    if not prefix and not out:
        raise ConfigError(f"the clock gave no integer to compare epochs by: {value!r}", where)
    return out


_OTHER_PARTS = "(parts this time lacks)"
_MISSING = -(2**63)  # below every offset: where a time has no such part
_PARTS = "#parts"  # a name no part has (parts are dotted names of offsets' fields)
_BY = "#by"  # the lineage whose commit recorded the committed time
_UPPER = "#upper"  # and that commit's upper
_NAMES = "names"  # the set of part names a commit before parts were counted had (legacy)


def committed_time(snap: Snapshot, app_id: str, time: Time) -> Time | None:
    """The time of the last commit made under this clock (None: none was), as far as it can be
    compared with ``time``. Committed parts that ``time`` lacks are counted under one part no
    time has, so ``compare`` finds such a time behind in it.

    (A commit is made only when its time is ahead, so it has every part of the committed time
    before it: the parts recorded in the table are those of the last commit, and ``~#parts``
    says how many there are.)"""
    keys = Keys(app_id)
    found = {n: v for n in time if (v := snap.transaction(keys.clock(n))) is not None}
    count = snap.transaction(keys.clock(_PARTS))
    if count is None:
        if snap.transaction(keys.clock(_NAMES)) is None:
            return None  # never committed under a clock
        return _legacy(snap, app_id, time, found)
    if count > len(found):
        found[_OTHER_PARTS] = 0
    return Time.of(found)


def _legacy(snap: Snapshot, app_id: str, time: Time, found: dict[str, int]) -> Time:
    """The committed time of a view last committed by mvsink before parts were counted. It
    named a Delta source's offset ``<n>.reservoirVersion`` and ``<n>.index`` (now one part
    ``<n>.delta``) and every other part as now, and tagged the set of names it had (``~names``):
    a time whose old names are another set (a source with no offset then or now, another
    Kafka partition) is not comparable, as it was not then."""
    keys = Keys(app_id)
    for name in time:
        if name.endswith(".delta") and name not in found:
            source = name.removesuffix(".delta")
            version = snap.transaction(keys.clock(f"{source}.reservoirVersion"))
            index = snap.transaction(keys.clock(f"{source}.index"))
            if version is not None and index is not None:
                rank = _DELTA_SPECIAL_INDEX.get(index, index + 3 if index >= 0 else None)
                if rank is None:
                    found[_OTHER_PARTS] = 0  # an index this order does not know: never ahead
                else:
                    found[name] = version << _DELTA_INDEX_BITS | rank
    digest = hashlib.sha256("\n".join(sorted(time.legacy)).encode()).hexdigest()[:16]
    tag = snap.transaction(keys.clock(_NAMES))
    if not time.legacy or snap.transaction(keys.clock(f"{_NAMES}@{digest}")) != tag:
        found[_OTHER_PARTS] = 0
    return Time.of(found)


@dataclass(frozen=True)
class Standing:
    """Where an epoch's time stands against the view's committed time: what ``decide`` reads,
    and the stall watch hears (``Stall.observe``)."""

    time: Time
    """The epoch's time."""
    verdict: Verdict
    committed: Time | None
    """The view's committed time (None: nothing was committed under the clock)."""


def standing(time: Time, snap: Snapshot, app_id: str) -> Standing:
    """Where ``time`` stands against the committed time of ``snap`` (``compare``)."""
    committed = committed_time(snap, app_id, time)
    return Standing(time, compare(time, committed), committed)


def compare(time: Time, committed: Time | None) -> Verdict:
    """Where ``time`` stands against the committed time (see the module doc); a part one of
    them lacks is below every offset there."""
    if committed is None:
        return "ahead"
    parts = set(time) | set(committed)
    ahead = any(time.get(k, _MISSING) > committed.get(k, _MISSING) for k in parts)
    behind = any(time.get(k, _MISSING) < committed.get(k, _MISSING) for k in parts)
    if ahead and behind:
        return "incomparable"
    return "ahead" if ahead else "behind" if behind else "same"


def skips(start: Time, committed: Time) -> bool:
    """Whether a batch starting at ``start`` leaves records after the committed time unread:
    it starts past it in some part. A part the committed time lacks has had nothing
    committed, so it counts from its beginning (0: a Kafka partition added, a new source); a
    part the start lacks starts from nothing."""
    return any(offset > committed.get(part, 0) for part, offset in start.items())


def transactions(app_id: str, time: Time, lineage: str, writer: str | None, upper: int) -> dict[str, int]:
    """The app transactions recording ``time`` as the committed time: its parts and their
    number, and the lineage and upper of the commit (``continues``). (``~names`` = -1 matches
    no tag of mvsink before parts were counted: a replica still running such a version finds
    the committed time incomparable and writes nothing.)"""
    keys = Keys(app_id)
    return {
        **{keys.clock(k): v for k, v in time.items()},
        keys.clock(_PARTS): len(time),
        keys.clock(_BY): committer_tag(lineage, writer),
        keys.clock(_UPPER): upper,
        keys.clock(_NAMES): -1,
    }


STALL_EPOCHS = 3
"""Epochs in a row behind or incomparable, with the committed time standing still, after which
a sink reports the view as stalled."""


def stall_folder(view: str) -> str:
    """Where sinks of ``view`` leave a note while they are stalled (``mvsink status`` reads it)."""
    from mvsink.table.index import HIDDEN

    return f"{HIDDEN}/{view}/stalled"


@dataclass
class Stall:
    """One sink's run of epochs that wrote nothing under a shared clock although the committed
    time did not move: nobody advances the view, so it goes stale (an offset this clock
    cannot order, a replica that fell behind for good). Kept by the sink across epochs."""

    committed: Time | None = None
    """The committed time the run started from (a run ends when it moves)."""
    since: int | None = None
    """The first epoch of the run."""
    epochs: int = 0
    note: str | None = None
    """The note left in storage while stalled (deleted when the sink moves again)."""
    checked: bool = False
    """Whether this sink looked for a note of an earlier run of it (once, when it moves)."""

    def observe(self, verdict: Verdict, committed: Time | None, epoch: int) -> bool:
        """Count this epoch; whether the view is stalled now."""
        if verdict in ("ahead", "same"):
            self.committed, self.since, self.epochs = None, None, 0
            return False
        if committed != self.committed or self.since is None:
            self.committed, self.since, self.epochs = committed, epoch, 0
        self.epochs += 1
        return self.epochs > STALL_EPOCHS

    @staticmethod
    def note_path(view: str, who: str) -> str:
        return f"{stall_folder(view)}/{hashlib.sha256(who.encode()).hexdigest()[:16]}.json"

    def leave_note(self, store: Store, view: str, who: str, fields: Mapping[str, Any], where: Where) -> None:
        """Say in storage that this sink is stalled; best-effort (a WARNING says it anyway)."""
        path = self.note_path(view, who)
        try:
            store.put(path, json.dumps({**fields, "since_epoch": self.since}, sort_keys=True).encode())
            self.note = path
        except Exception as exc:
            log.warning("%s: could not leave the stall note %s: %s", where, path, exc)

    def clear_note(self, store: Store, view: str, who: str, where: Where) -> None:
        """The sink moves: its note goes (also one an earlier run of it left, looked for once)."""
        if self.note is None and self.checked:
            return
        path = self.note or self.note_path(view, who)
        self.checked = True
        try:
            store.delete([path])
            self.note = None
        except Exception as exc:
            log.warning("%s: could not delete the stall note %s: %s", where, path, exc)


def stall_notes(store: Store, snap: Snapshot, view: str) -> list[dict[str, Any]]:
    """The notes of sinks of ``view`` still stalled at ``snap``: those whose committed time is
    still the table's (a note whose time moved on is of a stall that ended)."""
    out = []
    for path in sorted(store.files(stall_folder(view))):
        data = store.get(path)
        try:
            note = json.loads(bytes(data.to_pybytes()).decode()) if data is not None else None
        except ValueError:
            continue
        if not isinstance(note, dict) or not isinstance(note.get("time"), dict):
            continue
        now = committed_time(snap, Keys.of(view).app_id, Time.of(note["time"]))
        if now == note.get("committed"):
            out.append(note)
    return out
