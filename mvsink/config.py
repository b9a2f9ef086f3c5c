"""Options of a sink, as frozen pydantic models that load from keyword arguments or TOML.

``SinkOptions`` is what ``MVSink(...)`` takes; a TOML file holds the same fields under
``[sink]`` (and ``[sink.retry]``). Invalid values raise ``ConfigError`` naming the option.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mvsink.errors import ConfigError, Where
from mvsink.table.catalog import check_name, is_path
from mvsink.table.record import app_id, now_ms
from mvsink.table.uris import REMOTE_SCHEMES, nested

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Cadence:
    """Every ``epochs`` epochs, or every ``seconds`` seconds, since the view's last commit:
    when ``heartbeat`` and ``refresh_every`` let a complete-mode epoch create a version
    (``epoch/decide.py`` says which epochs commit whatever the cadence)."""

    epochs: int | None = None
    seconds: float | None = None

    @staticmethod
    def parse(value: int | str) -> Cadence:
        """A number of epochs (an int, or digits) or a duration; ``0`` means every epoch."""
        if isinstance(value, bool):
            raise ValueError(f"expected a number of epochs or a duration like '10m', got {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            n = int(value)
            if n < 0:
                raise ValueError(f"a number of epochs must be >= 0, got {n}")
            return Cadence(epochs=max(n, 1))
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"expected a number of epochs or a duration like '250ms', '30s', '10m', '2h', '1d'; "
                f"got {value!r}"
            )
        return Cadence(seconds=float(match.group(1)) * _UNIT[match.group(2)])

    @property
    def always(self) -> bool:
        return self.epochs == 1 or self.seconds == 0

    def due(self, *, epochs_since: int | None, last_at_ms: int | None, now: int | None = None) -> bool:
        """Whether the epoch ``epochs_since`` epochs after the last commit (None: unknown),
        ``last_at_ms`` after its time (None: unknown), is due. Unknown counts as due."""
        if self.always:
            return True
        if self.epochs is not None:
            return epochs_since is None or epochs_since >= self.epochs
        assert self.seconds is not None
        if last_at_ms is None:
            return True
        return (now_ms() if now is None else now) - last_at_ms >= self.seconds * 1000


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class _Frozen(BaseModel):
    # The docstring under each field is its description (``model_fields[name].description``):
    # ``help(MVSink)`` and docs/options.md are made from it (``options_doc.py``).
    model_config = ConfigDict(
        frozen=True, extra="forbid", str_strip_whitespace=True, use_attribute_docstrings=True
    )


class RetryPolicy(_Frozen):
    """How often and how patiently an epoch retries after losing a commit race."""

    max_attempts: int = Field(8, ge=1, le=1000)
    """Attempts per epoch (the first included) before ``RetriesExhaustedError``."""
    initial_backoff_s: float = Field(0.05, ge=0.0, le=60.0)
    """Sleep after the first conflict; doubles (``multiplier``) after each further one."""
    max_backoff_s: float = Field(5.0, ge=0.0, le=600.0)
    """Upper bound on one sleep."""
    multiplier: float = Field(2.0, ge=1.0, le=10.0)
    """Growth of the sleep between attempts."""
    jitter: float = Field(0.5, ge=0.0, le=1.0)
    """Each sleep is scaled by a random factor in ``[1 - jitter, 1]`` so replicas spread out."""

    def backoff(self, attempt: int, rand: float) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * rand)


class SinkOptions(_Frozen):
    """Everything that configures one ``MVSink``."""

    target: str
    """The Delta table that holds the view: a local path (``/...``, ``./...``, ``../...`` or any
    string with a ``/``), a ``file://`` URI, an object store URI (``s3://``, ``gs://``,
    ``az://``/``abfss://``) with ``storage_options``, or a table name
    (``[catalog.][schema.]table``) that the batch's Spark session's catalog resolves to a Delta
    table's location at the first epoch (``catalog.py``)."""
    name: str
    """The view's name; the frontier is the Delta app transaction ``mvsink:<name>``."""
    mode: Literal["complete", "upsert", "append"] = "complete"
    """Shape of each micro-batch: ``complete``, the whole desired collection (Spark
    ``outputMode("complete")``); ``upsert``, the new rows of the keys that changed
    (``outputMode("update")`` or a change stream); ``append``, rows to add (insert-only)."""
    key: tuple[str, ...] = ()
    """Upsert mode: the columns that identify a row (at least one; never null)."""
    delete_column: str | None = None
    """Upsert mode: a boolean column; true deletes the key. Not stored in the target."""
    sequence_column: str | None = None
    """Upsert mode: within a batch the highest value wins per key, and a row older than the one
    stored for its key is ignored. Without it, a key twice in one batch is an error."""
    tombstone_retention: str | None = None
    """Upsert mode with ``sequence_column`` and ``delete_column``: how long a deleted key's
    tombstone is kept (a duration: ``"7d"``, ``"12h"``), during which an event older than the
    delete never brings the key back (``tombstones.py``). Default: the table's
    ``delta.deletedFileRetentionDuration`` (7 days unset)."""
    partition_by: tuple[str, ...] | None = None
    """Partition columns of a new target (Hive-style folders). None: a new target is not
    partitioned and an existing one keeps its partitioning; given, it must match the target's."""
    as_of: int = Field(0, ge=0)
    """Epochs below this produce nothing; the first epoch at or above it is written whole."""
    lineage: str | None = None
    """The lineage of this sink's epochs (``lineage.py``). Default: the streaming query's id
    under ``foreachBatch`` (from Spark; under Spark Connect from ``checkpoint``), else
    ``"direct"``. Epoch numbers are compared only within one lineage."""
    clock: Literal["batch_id", "source_offsets"] | Callable[[Any, int], Any] = "batch_id"
    """What an epoch's time is (``clock.py``): Spark's batch id (one lineage), the batch's end
    source offsets read from ``checkpoint`` (replicas with their own checkpoints share it), or a
    callable ``(batch_df, batch_id) -> int | dict``. Not in append mode."""
    checkpoint: str | None = None
    """The query's checkpoint location: under Spark Connect, where the query id is read from."""
    on_new_lineage: Literal["adopt", "fail"] | None = None
    """What epochs of a lineage never seen do to a view another lineage owns: ``adopt`` (take
    it over from their first epoch; the old lineage is fenced) or ``fail`` (``LineageError``).
    Default: ``adopt`` in complete mode (a batch is the whole view), ``fail`` otherwise."""
    allow_gaps: bool = False
    """Upsert and append mode: commit an epoch although epochs between the frontier and it
    were never written (their rows are then missing). By default that is a ``LineageError``."""
    allow_late_start: bool = False
    """Complete mode: let a query that started reading its sources after the query that built
    the view did (Kafka's ``startingOffsets = latest``, a topic whose retention dropped records
    since) replace the view: it then lacks the records before that start, which becomes the
    view's origin. By default that is a ``LineageError`` before anything is written
    (docs/replicas.md)."""
    take_over: str | None = None
    """Take the target from what holds it, in this epoch's commit (one version, which says so
    in its ``userMetadata``): the name of the view holding it, or ``"foreign"`` for a table
    holding rows no mvsink view wrote. Naming this view itself re-keys it: its recorded key,
    sequence columns give way to the options'. Without it such a target is refused
    (``TableHeldError``). Once taken, the option is inert: it names a holder that is gone. One
    exception: under a shared clock, naming this view also lets a new checkpoint's first epoch
    take the committed source offsets as its own (after its source was reset: docs/replicas.md);
    remove it after that deployment, since every new checkpoint started with it would."""
    heartbeat: int | str = "10m"
    """Complete mode: an epoch with nothing to change commits (a version that only moves the
    frontier) only when this many epochs, or this long (``"30s"``, ``"10m"``, ``"1h"``), passed
    since the view's last commit (``Cadence``). ``0``: every epoch commits. Upsert and
    append mode commit every epoch."""
    refresh_every: int | str | None = None
    """Complete mode: advance the view only every this many epochs, or this often (a
    duration); epochs in between write nothing. None: every epoch."""
    not_null: tuple[str, ...] = ()
    """The view's rule: these columns (``a.b`` for a struct field) are never null."""
    checks: tuple[str, ...] = ()
    """The view's rules: SQL boolean expressions every row keeps (``"amount >= 0"``); named
    ``check_1``, ``check_2`` ... in messages. A null result breaks the rule, as in Delta."""
    on_error: Literal["fail", "table"] = "fail"
    """Rows breaking a rule (the view's or the target table's): ``fail``, the epoch fails with an
    ``InputError`` naming the rule and commits nothing; ``table`` (complete and append mode),
    they go, with the rule they broke, to the errors table (``quarantine.py``) and the view
    gets the other rows."""
    errors_target: str | None = None
    """With ``on_error = "table"``: the errors table. Default: the target's path + ``_errors``."""
    read_only: bool = False
    """Compute and report corrections but never commit (a standby replica)."""
    engine: Literal["auto", "delta-rs", "delta-spark"] = "auto"
    """What commits to the target (``jvm_delta.py``): ``delta-rs``, or ``delta-spark``, the
    session's own JVM Delta (classic sessions with delta-spark). ``auto``: delta-rs, unless the
    table has a feature the installed delta-rs cannot write and the session has Delta."""
    max_rows_per_file: int = Field(50_000, ge=1)
    """Upper bound on rows per staged file, so that a retraction rewrites a bounded file: a
    changed row costs rewriting the rest of its file. Small files keep corrections small (1%
    of a 1M-row view changed in key order writes about 5% of the view's bytes); for views of
    hundreds of millions of rows raise it, to keep the file count (and the log) small."""
    metrics_table: str | None = None
    """A Delta table that gets one row per committed epoch of the view, exactly once
    (``metrics.py``), on the target's store (same ``storage_options``)."""
    history_target: str | None = None
    """A second Delta table (a path or URI on the target's store, or a table name resolved
    through the session's catalog as the target's is: an empty Delta table with the history's
    columns, docs/history.md) that keeps the view's
    history: every row's lifetimes, with ``valid_from`` and ``valid_to`` (docs/history.md). The
    sink's commits are followed by the history's; versions others make, and a history commit
    that failed, are completed by its next epoch before it plans. Every mode; an upsert view
    with a ``sequence_column`` records its late events too. None: no history."""
    history_retention: str | None = None
    """With ``history_target``: how long the history keeps a lifetime after it ended (a
    duration: ``"90d"``); never an open one. Applied when the history is compacted (with the
    view's compaction: ``compact_every``, ``mvsink compact``); ``as_of`` then refuses a time or
    version it no longer knows whole. None: every lifetime is kept."""
    compact_every: int | None = Field(None, ge=1)
    """Merge small files (``compact.py``) after a committed epoch once this many epochs passed
    since the last compaction (the table records its frontier); its own
    strict commit, which changes no row. None: never (run ``mvsink compact``)."""
    cluster_by: tuple[str, ...] = ()
    """Columns to sort inserted rows by, so rows that change together share few files: columns
    the view stores, of scalar types (not arrays, maps or structs; strings of the default
    collation), sorted as Spark sorts them (ascending, nulls first) by Spark's tasks and on the
    driver alike. Checked against the view at every epoch, before anything is written
    (``ConfigError``)."""
    cache_desired: bool = True
    """Kept for old configs; no effect. Desired is evaluated once per epoch (complete mode
    caches it with its fingerprints; upsert mode caches the ranked batch; tasks write an
    initial load once)."""
    placement: Literal["auto", "driver", "distributed"] = "auto"
    """Where the correction is computed: ``driver``, on the driver with numpy (the view's
    fingerprints, 16 bytes a row, in its memory; fastest for views that fit); ``distributed``,
    by Spark (nothing row-sized on the driver; scales with the cluster); ``auto``, the driver
    while the target holds at most ``driver_max_rows`` rows, else distributed."""
    driver_max_rows: int = Field(20_000_000, ge=1)
    """With ``placement = "auto"``: the largest target (in rows) planned on the driver."""
    storage_options: dict[str, str] = Field(default_factory=dict)
    """Passed to delta-rs and the I/O layer for the target: endpoint, credentials, region ...
    (the keys delta-rs documents per store, e.g. ``AWS_ENDPOINT_URL``, ``AWS_REGION``)."""
    writer: str | None = None
    """Recorded in each commit's metadata; defaults to ``host:pid``."""
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    """Behaviour after a lost commit race."""
    schema_changes: Literal["refuse", "evolve"] = "refuse"
    """What an epoch does when desired's columns differ from the target's (``schema.py``):
    ``refuse`` (a ``SchemaMismatchError``, nothing written), or ``evolve``: the view's table
    takes desired's columns in the epoch's commit (complete mode: columns added, dropped or
    widened, every row rewritten in that one version). Narrowed types and changed key,
    partition or sequence columns are refused either way (docs/modes.md)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                "must be 1-128 characters of letters, digits, '_', '.', '-' and not start with "
                f"'.' or '-' (got {v!r})"
            )
        return v

    @field_validator("target")
    @classmethod
    def _check_target(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        check_name(v)
        scheme = urlparse(v).scheme
        if scheme in ("", "file") and is_path(v) and "%" in (v if not scheme else v.split("://", 1)[-1]):
            raise ValueError(
                f"{v!r}: delta-rs reads '%' in a local path as a percent-escape (a%41b is aAb), so the "
                "table and its files would land in two folders; use a path without '%'"
            )
        if scheme not in ("", "file", *REMOTE_SCHEMES):
            raise ValueError(
                f"unknown scheme {scheme!r}: use a local path, file://, s3://, gs://, az://, "
                "abfss:// or another object store URI delta-rs supports"
            )
        return v

    @field_validator("take_over")
    @classmethod
    def _check_take_over(cls, v: str | None) -> str | None:
        if v is not None and v != "foreign" and not _NAME.match(v):
            raise ValueError(f"must be a view's name or 'foreign' (got {v!r})")
        return v

    @field_validator("heartbeat", "refresh_every")
    @classmethod
    def _check_cadence(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            Cadence.parse(v)
        return v

    @field_validator("tombstone_retention", "history_retention")
    @classmethod
    def _check_retention(cls, v: str | None) -> str | None:
        if v is not None and not Cadence.parse(v).seconds:
            raise ValueError(f"expected a positive duration like '7d' or '12h', got {v!r}")
        return v

    @field_validator("cluster_by")
    @classmethod
    def _check_cluster_by(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"names a column twice: {list(v)}")
        return v

    @model_validator(mode="after")
    def _check_mode(self) -> SinkOptions:
        if self.mode == "upsert":
            if not self.key:
                raise ValueError("option 'key': upsert mode needs at least one key column")
            if len(set(self.key)) != len(self.key):
                raise ValueError(f"option 'key': names a column twice: {list(self.key)}")
            for option in ("delete_column", "sequence_column"):
                if getattr(self, option) in self.key:
                    raise ValueError(f"option {option!r}: {getattr(self, option)!r} is a key column")
            if self.delete_column is not None and self.delete_column == self.sequence_column:
                raise ValueError("option 'sequence_column': it is the delete column too")
            if self.tombstone_retention is not None and not (self.delete_column and self.sequence_column):
                raise ValueError(
                    "option 'tombstone_retention': tombstones are kept only with both "
                    "sequence_column and delete_column"
                )
        else:
            for option in ("key", "delete_column", "sequence_column"):
                if getattr(self, option):
                    raise ValueError(f"option {option!r}: only upsert mode takes it (mode is {self.mode!r})")
        if self.clock != "batch_id" and self.mode == "append":
            raise ValueError(
                "option 'clock': append mode needs the batch_id clock (one writer): batches of "
                "replicas with their own checkpoints overlap, and their rows would be added twice"
            )
        if self.clock == "source_offsets" and not self.checkpoint:
            raise ValueError("option 'clock': 'source_offsets' needs the 'checkpoint' option")
        if self.on_error == "table" and self.mode == "upsert":
            raise ValueError(
                "option 'on_error': 'table' takes complete or append mode (an upsert batch holds "
                "only the changed keys, so the errors table could not be kept equal to them)"
            )
        if self.on_error == "table" and self.errors_target is None and not is_path(self.target):
            raise ValueError(
                "option 'errors_target': a target given as a table name needs the errors table's "
                "path or URI (the default, beside the table's folder, would be no catalog table)"
            )
        if self.errors_target is not None and self.on_error != "table":
            raise ValueError("option 'errors_target': only on_error = 'table' writes an errors table")
        if self.history_retention is not None and self.history_target is None:
            raise ValueError("option 'history_retention': it needs a history (history_target)")
        for option in ("errors_target", "metrics_table", "history_target"):
            other = getattr(self, option)
            if other is not None and option == "history_target":
                try:  # a path, or a table name (resolved as the target is: catalog.py)
                    check_name(other)
                except ValueError as exc:
                    raise ValueError(f"option {option!r}: {exc}") from None
            elif other is not None and not is_path(other):
                raise ValueError(f"option {option!r}: {other!r} must be a path or URI (not a table name)")
            if other is not None and not is_path(other) and other == self.target:
                raise ValueError(f"option {option!r}: {other!r} is the target itself")
            if other is not None and is_path(self.target) and is_path(other) and nested(self.target, other):
                raise ValueError(
                    f"option {option!r}: {other!r} is the target or lies inside it (or holds it): "
                    "a table inside another's folder is lost to the other's vacuum"
                )
        if self.allow_late_start and self.mode != "complete":
            raise ValueError(
                "option 'allow_late_start': only complete mode takes it (upsert and append mode "
                "take allow_gaps)"
            )
        if self.refresh_every is not None and self.mode != "complete":
            raise ValueError(
                "option 'refresh_every': only complete mode takes it (an upsert or append batch "
                "skipped between refreshes would be lost)"
            )
        if self.partition_by is not None and len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError(f"option 'partition_by': names a column twice: {list(self.partition_by)}")
        return self

    @property
    def new_lineage_policy(self) -> str:
        """``on_new_lineage``, or its default for the mode."""
        return self.on_new_lineage or ("adopt" if self.mode == "complete" else "fail")

    @property
    def heartbeat_cadence(self) -> Cadence:
        return Cadence.parse(self.heartbeat)

    @property
    def refresh(self) -> Cadence | None:
        """``refresh_every`` parsed (None: every epoch)."""
        return None if self.refresh_every is None else Cadence.parse(self.refresh_every)

    @property
    def app_id(self) -> str:
        """The Delta app id under which this view's frontier is recorded."""
        return app_id(self.name)

    @classmethod
    def build(cls, **kwargs: Any) -> SinkOptions:
        """Validate keyword arguments, turning pydantic's error into a ``ConfigError``."""
        try:
            return cls.model_validate(kwargs)
        except ValidationError as exc:
            raise _config_error(exc, kwargs) from None

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> SinkOptions:
        """Load the ``[sink]`` table of a TOML file; ``overrides`` win over the file."""
        data = load_toml(path)
        sink = data.get("sink")
        if not isinstance(sink, dict):
            raise ConfigError(f"{path}: no [sink] table")
        return cls.build(**{**sink, **overrides})


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, reporting a missing file or bad syntax as ``ConfigError``."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _config_error(
    exc: ValidationError, given: dict[str, Any], what: str = "invalid sink options"
) -> ConfigError:
    lines = []
    for err in exc.errors():
        option = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"option {option!r}: {message}" if option else message)
    where = Where(
        view=given.get("name") if isinstance(given.get("name"), str) else None,
        target=given.get("target") if isinstance(given.get("target"), str) else None,
    )
    return ConfigError(f"{what}: " + "; ".join(lines), where)
