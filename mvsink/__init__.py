"""mvsink: keep a Delta table exactly equal to a Spark Structured Streaming query's result."""

from mvsink._version import __version__
from mvsink.config import RetryPolicy, SinkOptions
from mvsink.errors import (
    CommitOutcomeUnknownError,
    CommitReplacedError,
    ConfigError,
    ConflictError,
    DuplicateKeyError,
    HistoryBehindError,
    IdentityChangedError,
    InputError,
    InvariantViolation,
    LineageError,
    MVSinkError,
    RetriesExhaustedError,
    SchemaMismatchError,
    SparkJobError,
    StorageError,
    TableHeldError,
    UnsupportedTableError,
)
from mvsink.ops.history import as_of
from mvsink.ops.promote import frontier, promote
from mvsink.ops.status import Status, status
from mvsink.ops.vacuum import Vacuum, vacuum
from mvsink.ops.verify import Verification, verify
from mvsink.report import EpochReport
from mvsink.sink import MVSink

__all__ = [
    "CommitOutcomeUnknownError",
    "CommitReplacedError",
    "ConfigError",
    "ConflictError",
    "DuplicateKeyError",
    "EpochReport",
    "HistoryBehindError",
    "IdentityChangedError",
    "InputError",
    "InvariantViolation",
    "LineageError",
    "MVSink",
    "MVSinkError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SchemaMismatchError",
    "SinkOptions",
    "SparkJobError",
    "Status",
    "StorageError",
    "TableHeldError",
    "UnsupportedTableError",
    "Vacuum",
    "Verification",
    "__version__",
    "as_of",
    "frontier",
    "promote",
    "status",
    "vacuum",
    "verify",
]
