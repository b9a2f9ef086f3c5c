"""A reference model of one mvsink view, written from docs/modes.md and docs/replicas.md (not
from the code), for the model-based test (``test_model.py``).

The model keeps what the docs say the target holds: the view's rows (a multiset), the frontier,
which lineage owns the view and which were superseded, each lineage's own frontier, the active
writer, and in upsert mode with a sequence and a delete column the tombstones of deleted keys.
For each epoch a sink runs, ``View.expect`` lists the answers the docs allow (``Expect``): most
often one; where the docs leave a choice open, each of them. The test takes the one the sink
gave and ``View.commit`` applies it.

Rows are tuples in column order ``k, v, p`` (+ ``seq``) for the target, and ``k, v, p`` (+
``seq``) (+ ``del``) for a batch. NaN equals NaN and None is a value (``canon``).

Where the docs do not say what a key holds (upsert mode with a sequence, after another writer
appended a second row for a key, or deleted a key that has a tombstone), the key is *muddled*:
it is left out of the comparison until an event at or above every sequence the key ever had
decides it for every reading of the docs.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mvsink import DuplicateKeyError, InputError, LineageError

Row = tuple[Any, ...]
Mode = Literal["complete", "upsert", "append"]


def canon(row: Iterable[Any]) -> Row:
    """A row as a multiset element: NaN equal to NaN (``tests.helpers.multiset`` does the same)."""
    return tuple(("NaN",) if isinstance(x, float) and math.isnan(x) else x for x in row)


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


@dataclass(frozen=True)
class Shape:
    """The view's options that decide what a batch means."""

    mode: Mode
    delete: bool = False
    """Upsert mode: the batch has a boolean ``del`` column (not stored)."""
    sequence: bool = False
    """Upsert mode: the batch and the target have a ``seq`` column."""
    partitioned: bool = False
    """The target is partitioned by ``p``."""
    composite: bool = False
    """Upsert mode: the key is ``(k, p)`` instead of ``k``."""
    heartbeat: int | None = None
    """Complete mode: the ``heartbeat`` option in epochs (None: a duration that never passes
    within a history)."""

    @property
    def batch_columns(self) -> tuple[str, ...]:
        return ("k", "v", "p") + (("seq",) if self.sequence else ()) + (("del",) if self.delete else ())

    @property
    def stored_columns(self) -> tuple[str, ...]:
        return ("k", "v", "p") + (("seq",) if self.sequence else ())

    def key(self, row: Row) -> Any:
        """A row's key."""
        return (row[0], row[2]) if self.composite else row[0]

    def null_key(self, row: Row) -> bool:
        return row[0] is None or (self.composite and row[2] is None)

    @property
    def tombstones(self) -> bool:
        """A delete leaves a tombstone (key, sequence) that late events for the key never pass."""
        return self.delete and self.sequence


@dataclass
class Sink:
    """One MVSink object as the model sees it."""

    lineage: str
    writer: str
    read_only: bool
    on_new_lineage: Literal["adopt", "fail"] | None = None
    allow_gaps: bool = False
    as_of: int = 0


@dataclass(frozen=True)
class Expect:
    """One answer the docs allow for an epoch: a commit, a skip (``outcomes``), or an error."""

    kind: Literal["commit", "skip", "error"]
    outcomes: frozenset[str] = frozenset()
    error: type[Exception] | None = None
    takeover: bool = False
    must: bool = False
    """A commit that records something besides the rows (the view's first, a takeover): it
    makes a version even when no row changes."""
    why: str = ""

    def matches(self, result: str | BaseException) -> bool:
        if isinstance(result, BaseException):
            return self.kind == "error" and self.error is not None and isinstance(result, self.error)
        return self.kind != "error" and result in self.outcomes

    def __repr__(self) -> str:
        what = self.error.__name__ if self.error else "/".join(sorted(self.outcomes))
        return f"{self.kind} {what} ({self.why})"


def _skip(outcomes: Iterable[str], why: str) -> Expect:
    return Expect("skip", frozenset(outcomes), why=why)


def _error(error: type[Exception], why: str) -> Expect:
    return Expect("error", error=error, why=why)


@dataclass
class View:
    """The target of one view, as the docs describe it."""

    shape: Shape
    exists: bool = False
    frontier: int | None = None
    owner: str | None = None
    """The lineage that owns the view (None: no lineage committed yet)."""
    seen: set[str] = field(default_factory=set)
    """Lineages that ever owned the view: all but the owner are superseded (fenced)."""
    own: dict[str, int] = field(default_factory=dict)
    """Each lineage's own frontier: the upper of its last commit."""
    active: str | None = None
    """The writer promoted last (None: never promoted; every replica writes)."""
    rows: list[Row] = field(default_factory=list)
    tombstones: dict[Any, Any] = field(default_factory=dict)
    muddled: set[Any] = field(default_factory=set)
    highest: dict[Any, Any] = field(default_factory=dict)
    """Upsert with a sequence: the highest sequence each key ever had (events, rows, tombstones)."""
    stats: Counter[str] = field(default_factory=Counter)

    # --- what an epoch may do -------------------------------------------------------------

    def expect(
        self,
        sink: Sink,
        epoch: int,
        batch: Sequence[Row],
        *,
        refused: type[Exception] | None = None,
        judged_by: Shape | None = None,
    ) -> list[Expect]:
        """Every answer the docs allow for ``sink`` running ``epoch`` with ``batch``;
        ``refused``: the error the sink's options make it raise instead of writing;
        ``judged_by``: the shape the sink's own options give the batch (a sink redeployed with
        another key checks the batch by that key: a standby plans by it)."""
        answers = [self._outcomes(a, epoch, batch) for a in self.decide(sink, epoch)]
        bad = refused or self.problem(batch)
        # A standby plans by its own options: the batch is bad input by them (a sink redeployed
        # with another key checks its batch by that key), whatever else refuses it.
        planned = self.problem(batch, judged_by) if judged_by is not None else None
        if bad is None and planned is None:
            return answers
        # Bad input raises before anything is written; an epoch that writes nothing anyway may
        # say so instead (the docs do not order the checks), and so may a standby, which plans.
        out: list[Expect] = []
        for a in answers:
            if a.kind != "commit":
                out.append(a)
            if bad is not None:
                out.append(_error(bad, "bad input"))
            if planned is not None and a.kind == "skip" and "read_only" in a.outcomes:
                out.append(_error(planned, "bad input by the standby's own options"))
        return out

    def decide(self, sink: Sink, epoch: int) -> list[Expect]:
        """replicas.md, "The rules" and "Promotion", for a well-formed batch. An epoch below
        the sink's ``as_of`` produces nothing (``before_as_of``; the docs do not order it
        before the other reasons to write nothing)."""
        answers = self._decide(sink, epoch)
        if epoch < sink.as_of:
            return [_skip({"before_as_of"}, f"epoch {epoch} is below as_of {sink.as_of}")] + [
                a for a in answers if a.kind == "skip"
            ]
        return answers

    def _decide(self, sink: Sink, epoch: int) -> list[Expect]:
        mode = self.shape.mode
        ro_extra = {"read_only"} if sink.read_only else set()
        if self.active is not None and sink.writer != self.active:
            answers = [_skip({"fenced"} | ro_extra, f"writer {self.active} is the active writer")]
            return answers
        promoted = self.active is not None  # and it is this sink's writer
        read_only = sink.read_only and not promoted
        gaps_matter = mode != "complete"
        if self.owner is None:
            if read_only:
                return [_skip({"read_only"}, "a standby")]
            answers = [self._commit(True, False, "the view's first commit")]
            if gaps_matter and epoch > sink.as_of:  # replicas.md does not say: no frontier yet
                answers.append(_error(LineageError, "first epoch above 0"))
            return answers
        if sink.lineage not in self.seen:
            if read_only:
                return [_skip({"read_only"}, "a read-only new lineage never takes over")]
            policy = sink.on_new_lineage or ("adopt" if mode == "complete" else "fail")
            if policy == "fail":
                answers = [_error(LineageError, "a new lineage, on_new_lineage=fail")]
                if promoted:  # the docs do not say which wins: promotion or the policy
                    answers.append(self._commit(True, True, "a promoted new lineage"))
                return answers
            if gaps_matter and epoch > sink.as_of and not sink.allow_gaps:
                return [_error(LineageError, f"a new lineage takes over at its epoch {epoch}, not 0")]
            return [self._commit(True, True, "a new lineage takes the view over")]
        if sink.lineage != self.owner:
            if not promoted:
                return [_skip({"fenced"} | ro_extra, f"lineage {sink.lineage} was superseded")]
            answers = [self._commit(True, True, "failback: a promoted superseded lineage")]
            if gaps_matter and not sink.allow_gaps:  # the docs do not say whether gaps apply
                answers.append(_error(LineageError, "failback past the lineage's frontier"))
            return answers
        own = self.own[sink.lineage]
        if epoch + 1 <= own:
            return [_skip({"replay"} | ro_extra, f"epoch {epoch} is below the lineage's frontier {own}")]
        if read_only:
            answers = [_skip({"read_only"}, "a standby")]
            if gaps_matter and epoch > own:
                answers.append(_error(LineageError, "a standby past a gap"))
            return answers
        if gaps_matter and epoch > own and not sink.allow_gaps:
            return [_error(LineageError, f"a gap: epoch {epoch}, the lineage's frontier {own}")]
        return [self._commit(False, False, "the owner's next epoch")]

    @staticmethod
    def _commit(must: bool, takeover: bool, why: str) -> Expect:
        return Expect("commit", frozenset({"committed"}), takeover=takeover, must=must, why=why)

    def _outcomes(self, answer: Expect, epoch: int, batch: Sequence[Row]) -> Expect:
        """README, guarantee 1: in complete mode an epoch with nothing to change creates no
        version (``unchanged``) until a heartbeat is due, unless its commit records something
        besides rows. A heartbeat of N epochs is due N epochs after the view's last commit
        (at exactly N the docs allow either reading of "passed")."""
        if answer.kind != "commit" or answer.must or self.shape.mode != "complete":
            return answer
        if Counter(map(canon, batch)) != Counter(map(canon, self.rows)):
            return answer
        beat, why = self.shape.heartbeat, answer.why + ", nothing to change"
        since = epoch + 1 - (self.frontier or 0)  # epochs since the last commit's
        if beat is None or since < beat:
            return Expect("commit", frozenset({"unchanged"}), why=why)
        if since == beat and beat > 0:
            return Expect("commit", frozenset({"unchanged", "committed"}), why=why + ", a beat may be due")
        return Expect("commit", frozenset({"committed"}), why=why + ", a heartbeat is due")

    def problem(self, batch: Sequence[Row], shape: Shape | None = None) -> type[Exception] | None:
        """The error bad input raises (modes.md), or None for a well-formed batch, judged by
        ``shape`` (by default the view's)."""
        shape = shape or self.shape
        if shape.partitioned and any(r[2] == "" for r in batch):
            return InputError  # an empty string cannot be told from null in a partition
        if shape.mode != "upsert":
            return None
        null = any(shape.null_key(r) for r in batch)
        if shape.delete:
            null = null or any(r[-1] is None for r in batch)
        if shape.sequence:
            null = null or any(r[3] is None or _is_nan(r[3]) for r in batch)
        if null:
            return InputError
        by_key: dict[Any, list[Row]] = {}
        for r in batch:
            by_key.setdefault(shape.key(r), []).append(r)
        for rows in by_key.values():
            # Rows equal in every column are one event delivered twice (repr: NaN equals NaN).
            if not shape.sequence and len({repr(r) for r in rows}) > 1:
                return DuplicateKeyError
            if shape.sequence:
                top = max(r[3] for r in rows)
                if len({repr(r) for r in rows if r[3] == top}) > 1:
                    return DuplicateKeyError
        return None

    # --- what a commit does ---------------------------------------------------------------

    def correction(self, batch: Sequence[Row], *, whole: bool) -> tuple[int, int] | None:
        """The rows a commit of ``batch`` inserts and retracts, as its report counts them
        (README, ``EpochReport``): the difference between the view before and after, or in
        complete mode written whole, every row of each. None where the docs leave it open (a
        touched key undecided, or an upsert written whole)."""
        mode = self.shape.mode
        if mode == "append":
            return len(batch), 0
        if mode == "complete" and whole:
            return len(batch), len(self.rows)
        if mode == "complete":
            held, want = Counter(map(canon, self.rows)), Counter(map(canon, batch))
            return sum((want - held).values()), sum((held - want).values())
        if whole or {self.shape.key(r) for r in batch} & self.muddled:
            return None
        after = copy.deepcopy(self)
        after._upsert(batch)
        held, now = Counter(map(canon, self.rows)), Counter(map(canon, after.rows))
        return sum((now - held).values()), sum((held - now).values())

    def commit(self, sink: Sink, epoch: int, batch: Sequence[Row], answer: Expect) -> None:
        """Apply a committed epoch: the frontier and ownership, then the rows per mode."""
        self.exists = True
        self.frontier = epoch + 1
        if answer.takeover or self.owner != sink.lineage:
            self.owner = sink.lineage
            self.seen.add(sink.lineage)
        self.own[sink.lineage] = epoch + 1
        mode = self.shape.mode
        if mode == "complete":
            self.rows = [tuple(r) for r in batch]
        elif mode == "append":
            self.rows += [tuple(r) for r in batch]
        else:
            self._upsert(batch)

    def _upsert(self, batch: Sequence[Row]) -> None:
        """modes.md, upsert: each key in the batch ends holding exactly its winning row (the
        highest sequence), or nothing for a delete; a row older than the sequence stored for
        its key is ignored, and an equal one replaces. With a delete column too, a delete
        leaves a tombstone (even for a key never held) that later-arriving older events never
        pass; an equal or newer event inserts the key again and clears the tombstone."""
        shape = self.shape
        winners: dict[Any, Row] = {}
        for r in batch:
            k = shape.key(r)
            if k not in winners or (shape.sequence and r[3] > winners[k][3]):
                winners[k] = tuple(r)
        for k, w in winners.items():
            gone = shape.delete and bool(w[-1])
            stored_row = w[: len(shape.stored_columns)]
            if shape.sequence:
                seq = w[3]
                before = self.highest.get(k)
                self.highest[k] = seq if before is None else max(before, seq)
                if k in self.muddled:
                    if before is not None and seq < before:
                        continue  # still undecided: the key stays out of the comparison
                    self.muddled.discard(k)
                else:
                    stored = self._stored_sequence(k)
                    after_delete = k in self.tombstones and not self._rows_of(k)
                    if stored is not None and seq < stored:
                        self.stats["late events ignored"] += 1
                        if after_delete and not gone:
                            self.stats["late inserts ignored for a tombstone"] += 1
                        continue
                    if after_delete and not gone:
                        tie = seq == self.tombstones[k]
                        self.stats[f"keys re-inserted after a delete{' (tie)' if tie else ''}"] += 1
            self.rows = [r for r in self.rows if shape.key(r) != k]
            if gone:
                if shape.tombstones:
                    self.tombstones[k] = w[3]
                self.stats["keys deleted"] += 1
            else:
                self.tombstones.pop(k, None)  # an insert clears the key's tombstone
                self.rows.append(stored_row)

    def sequenced_keys(self) -> list[tuple[Any, Any]]:
        """Upsert with a sequence: each decided key with the sequence stored for it."""
        if not self.shape.sequence:
            return []
        keys = {self.shape.key(r) for r in self.rows if not self.shape.null_key(r)} | set(self.tombstones)
        out = [(k, self._stored_sequence(k)) for k in sorted(keys - self.muddled)]
        return [(k, s) for k, s in out if s is not None]

    def _rows_of(self, k: Any) -> list[Row]:
        return [r for r in self.rows if self.shape.key(r) == k]

    def _stored_sequence(self, k: Any) -> Any:
        """The sequence stored for key ``k``: its row's (a null sequence is older than any
        event), or its tombstone's."""
        seqs = [r[3] for r in self._rows_of(k) if r[3] is not None]
        if k in self.tombstones:
            seqs.append(self.tombstones[k])
        return max(seqs) if seqs else None

    # --- other writers --------------------------------------------------------------------

    def foreign_append(self, rows: Sequence[Row]) -> None:
        """Another writer appends rows (stored columns)."""
        for r in rows:
            k = self.shape.key(r)
            if self.shape.mode == "upsert" and self.shape.sequence and not self.shape.null_key(r):
                if self._rows_of(k) or k in self.tombstones or k in self.muddled:
                    self.muddled.add(k)  # a second row, or a row beside a tombstone
                if r[3] is not None:
                    self.highest[k] = r[3] if k not in self.highest else max(self.highest[k], r[3])
            self.rows.append(tuple(r))

    def foreign_delete(self, column: int, value: Any) -> int:
        """Another writer deletes the rows whose ``column`` equals ``value`` (SQL ``=``; None
        stands for ``IS NULL``). Returns how many rows went."""
        hit = [r for r in self.rows if (r[column] is None if value is None else r[column] == value)]
        if self.shape.tombstones:
            self.muddled |= {self.shape.key(r) for r in hit if self.shape.key(r) in self.tombstones}
        self.rows = [r for r in self.rows if not (r[column] is None if value is None else r[column] == value)]
        return len(hit)

    def promote(self, writer: str) -> None:
        self.active = writer

    def handed_over(self) -> None:
        """modes.md, "A view owns its table": another view takes the table over. Its rows stay
        as they are for the new view's first commit; the old view's lineages, promotions and
        tombstones are its own, and the new view starts without them."""
        self.frontier, self.owner, self.active = None, None, None
        self.seen, self.own, self.tombstones = set(), {}, {}

    def forget_foreign(self) -> None:
        """The foreign table a view did not take is gone (the test removes it)."""
        self.rows, self.muddled, self.highest = [], set(), {}

    # --- comparing ------------------------------------------------------------------------

    def visible(self, rows: Iterable[Row]) -> Counter[Row]:
        """Rows as a multiset, leaving out the keys the docs leave undecided."""
        return Counter(canon(r) for r in rows if self.shape.key(r) not in self.muddled)
