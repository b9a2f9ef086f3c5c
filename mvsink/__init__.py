"""mvsink: keep a Delta table exactly equal to a Spark Structured Streaming query's result."""

from mvsink.config import RetryPolicy, SinkOptions
from mvsink.errors import (
    CommitOutcomeUnknownError,
    ConfigError,
    ConflictError,
    DuplicateKeyError,
    InputError,
    InvariantViolation,
    LineageError,
    MVSinkError,
    RetriesExhaustedError,
    SchemaMismatchError,
    StorageError,
    UnsupportedTableError,
)
from mvsink.report import EpochReport
from mvsink.sink import MVSink, frontier, promote
from mvsink.status import Status, status
from mvsink.vacuum import Vacuum, vacuum
from mvsink.verify import Verification, verify

__version__ = "0.1.0"

__all__ = [
    "CommitOutcomeUnknownError",
    "ConfigError",
    "ConflictError",
    "DuplicateKeyError",
    "EpochReport",
    "InputError",
    "InvariantViolation",
    "LineageError",
    "MVSink",
    "MVSinkError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SchemaMismatchError",
    "SinkOptions",
    "Status",
    "StorageError",
    "UnsupportedTableError",
    "Vacuum",
    "Verification",
    "__version__",
    "frontier",
    "promote",
    "status",
    "vacuum",
    "verify",
]
