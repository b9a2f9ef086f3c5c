"""The exceptions mvsink raises.

Every error is an ``MVSinkError`` and says which view, target and epoch it concerns::

    MVSinkError
    ├── ConfigError (also ValueError)        bad options or config file: fix and restart
    │   └── CatalogUnavailable               the catalog could not answer a table name's lookup
    ├── InputError (also ValueError)         the micro-batch cannot be stored as given
    │   ├── SchemaMismatchError              desired's columns differ from the target's
    │   └── DuplicateKeyError                upsert mode: one key twice in a batch
    ├── LineageError                         the epoch has no place in the view's history (a
    │                                        new lineage, a gap): nothing was written
    ├── TableHeldError                       the target holds another view, or rows no mvsink
    │   │                                    view wrote: take it over explicitly (take_over)
    │   └── IdentityChangedError             the view's key or sequence columns differ
    │                                        from those its table records
    ├── UnsupportedTableError                the target uses a Delta feature mvsink refuses,
    │                                        or is not a Delta table at all
    ├── StorageError                         the target's storage refused or cannot be reached
    ├── EngineUnavailable                    the session has no JVM Delta the engine can use
    ├── EngineRefused                        the JVM Delta refused an operation
    ├── SparkJobError                        a Spark job of the epoch failed (a UDF that raised,
    │                                        a cancelled job): nothing was committed
    ├── ConflictError                        retryable: another commit landed first
    │   └── RetriesExhaustedError            ...and kept landing until the retry budget ran out
    ├── CommitOutcomeUnknownError            the commit call failed and the log could not say
    │                                        whether it landed: the next epoch resolves it
    ├── CommitReplacedError                  a commit this sink reported was replaced in the
    │                                        log by another writer's: an unsafe writer pair
    ├── HistoryBehindError                   as_of: the view's history does not hold that time
    │                                        or version (yet, or any longer)
    └── InvariantViolation                   a check that must never fail did: a bug, report it
        └── CorruptDeletionVector            a deletion vector's bytes are not what the log says

Catch ``ConflictError`` to retry an epoch yourself (Spark retries a failed batch on restart);
everything else is terminal for the epoch and leaves the target as it was, except two:

* ``CommitOutcomeUnknownError``: the epoch's commit may have landed. Its staged files are kept
  (never delete what a version may reference), and running the epoch again, or the next one,
  decides from the Delta log.
* ``InvariantViolation`` raised after the commit call (its message says so: a version that
  landed other than planned, an overwrite that left files in place): the version landed, its
  files are kept, and the next epoch of a complete view repairs the rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Where:
    """Which view, target and epoch an error concerns (any may be unknown)."""

    view: str | None = None
    target: str | None = None
    epoch: int | None = None

    def __str__(self) -> str:
        parts = []
        if self.view is not None:
            parts.append(f"view {self.view!r}")
        if self.target is not None:
            parts.append(f"target {self.target!r}")
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch}")
        return ", ".join(parts)


class MVSinkError(Exception):
    """Root of every mvsink error. ``view``, ``target`` and ``epoch`` say where it happened."""

    def __init__(self, message: str, where: Where | None = None) -> None:
        self.where = where or Where()
        self.message = message
        super().__init__(f"[{self.where}] {message}" if str(self.where) else message)

    @property
    def view(self) -> str | None:
        return self.where.view

    @property
    def target(self) -> str | None:
        return self.where.target

    @property
    def epoch(self) -> int | None:
        return self.where.epoch


class ConfigError(MVSinkError, ValueError):
    """An option or config file is invalid; the message names the option."""


class InputError(MVSinkError, ValueError):
    """The micro-batch cannot be stored as given; the target is left unchanged."""


class LineageError(MVSinkError):
    """An epoch cannot be placed in the view's history: a new lineage (checkpoint, query) where
    it would lose or double batches, or a gap in epochs. Nothing was written."""


class TableHeldError(MVSinkError):
    """The target is held by another view, or holds rows no mvsink view wrote: a sink never
    takes such a table unless told to (option ``take_over``). Nothing was written."""


class IdentityChangedError(TableHeldError):
    """The view's key or sequence columns differ from those its table records (a
    redeployment re-keyed the view): the stored rows are versions of the old key. Nothing
    was written; re-keying is a takeover or a rebuild (docs/modes.md)."""


class SchemaMismatchError(InputError):
    """Desired's schema differs from the target's; ``columns`` names the differing columns."""

    def __init__(self, message: str, where: Where | None = None, columns: tuple[str, ...] = ()) -> None:
        super().__init__(message, where)
        self.columns = columns


class DuplicateKeyError(InputError):
    """Upsert mode without a sequence column got one key several times in one batch."""


class UnsupportedTableError(MVSinkError):
    """The target uses a Delta feature mvsink refuses (deletion vectors, column mapping...)."""


class StorageError(MVSinkError):
    """The target's storage cannot be reached: endpoint, credentials, bucket or container."""


class SparkJobError(MVSinkError):
    """A Spark job of the epoch failed: computing desired (a UDF that raised on some rows), a
    job cancelled, executors lost. Every such job runs before the commit call, so nothing was
    committed; the attempt's staged files are unreferenced (vacuum removes them). Spark runs
    the batch again when the query restarts."""


class ConflictError(MVSinkError):
    """Another commit landed between our snapshot and our commit. Retryable."""


class RetriesExhaustedError(ConflictError):
    """Conflicts kept happening until the retry policy gave up; the epoch is not committed."""


class CommitOutcomeUnknownError(MVSinkError):
    """The commit call failed and reading the Delta log back could not tell whether the commit
    landed (storage unreachable, or the version still absent after an indeterminate error).

    The staged files are kept. Rerun the epoch (Spark does, when the batch fails): if the commit
    landed the epoch is a replay, otherwise it commits afresh; vacuum removes files of attempts
    that never landed.
    """


class CommitReplacedError(MVSinkError):
    """A commit this sink landed and reported is no longer in the log: another writer's commit
    file replaced it, so that writer does not make a version exclusive the way this sink's
    engine does (docs/design.md, "Two writers on one S3 table"). Found, as a best effort, by
    the sink's next epoch, before it stages anything; that epoch is not run. The rows of the
    replaced epoch are not in the table: complete mode repairs them at the next epoch; upsert
    and append mode need that epoch's input again (replay it from the source)."""


class HistoryBehindError(MVSinkError):
    """A view's history does not hold the time or version asked for: not yet (the view's next
    version is committed, its history's not yet), or no longer (before the history began)."""


class InvariantViolation(MVSinkError):
    """An internal check failed: a bug in mvsink or in the Delta engine below it; please report
    it with the log. Raised before the commit call, nothing was committed; after it (the
    message says which version), the version landed and its staged files are kept."""


class CorruptDeletionVector(InvariantViolation):
    """A deletion vector's bytes are not what its descriptor says."""


class CatalogUnavailable(ConfigError):
    """The catalog could not answer (a metastore timeout, a failing lookup): unlike a table
    it does not know, a reason to keep a location already found rather than stop."""


class EngineUnavailable(MVSinkError):
    """The session has no JVM Delta the ``delta-spark`` engine can use (the message says why)."""


class EngineRefused(MVSinkError):
    """The JVM Delta refused an operation (the message has its first line)."""


def first_line(exc: BaseException, limit: int = 500) -> str:
    """The first line of an exception's message (its type's name if it has none), for
    messages that quote a lower layer's error without its traceback."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:limit]
