"""What every mode needs from the epoch it plans for: the batch, options, store and figures,
and the driver's result limit (``ResultLimit``), which every collect of an epoch keeps."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.compat import is_spark_error, to_arrow
from mvsink.config import SinkOptions
from mvsink.errors import Where
from mvsink.plan.rules import Rules, check_rows
from mvsink.table.delta import Snapshot
from mvsink.table.storage import Store

log = logging.getLogger(__name__)
progress = logging.getLogger("mvsink.progress")
"""What an epoch is doing: each phase at DEBUG as it starts and ends, and at INFO a phase that
runs longer than ``PROGRESS_AFTER`` (an initial load, a whole rewrite), so long work is never
silent between Spark's stage bars."""
PROGRESS_AFTER = 5.0
"""Seconds a phase runs before the sink says, at INFO, what the epoch is doing."""
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(text: str) -> int | None:
    """A Spark size (``"8m"``, ``"1g"``, ``"512k"``, ``"1024"``) in bytes; None if it is none."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)i?b?\s*", text.lower())
    return int(found.group(1)) * _UNITS[found.group(2)] if found else None


def _libc_trim() -> Any:
    """glibc's ``malloc_trim`` from the process's own symbols, or None where there is none
    (musl, macOS, Windows)."""
    try:
        import ctypes

        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
        if trim is not None:
            trim.argtypes = [ctypes.c_size_t]
        return trim
    except Exception:
        return None


_MALLOC_TRIM = _libc_trim()


def give_back_memory(heap: bool = True) -> None:
    """Return to the OS the memory an epoch freed: Arrow's pool keeps freed pages for reuse,
    and glibc keeps freed heap (``heap``). The driver of a view of N rows holds its index,
    16 bytes a row, between epochs; without this it held ~60 a row, and an epoch's peak rose on
    top of what the last one left. Milliseconds."""
    pa.default_memory_pool().release_unused()
    if heap and _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


_FINGERPRINT_ROW = 24
"""Arrow bytes a row of desired's fingerprints takes on the driver (two int64, and the rule
column when the table has rules), until a collect measured it."""
_DEFAULT_RESULT_LIMIT = 1 << 30  # Spark's default spark.driver.maxResultSize
_DEFAULT_BROADCAST = 10 << 20  # Spark's default spark.sql.autoBroadcastJoinThreshold


def long_row_bytes(columns: int) -> int:
    """At most the bytes a row of ``columns`` 64-bit columns adds to a result that reaches the
    driver: Spark's form of a broadcast's rows (``UnsafeRow``: a word of null bits, a word a
    column, a 4-byte length), which is more than Arrow's (8 bytes a column)."""
    return 8 * (1 + columns) + 4


@dataclass(frozen=True)
class ResultLimit:
    """Spark's ``spark.driver.maxResultSize``, and the one rule by which an epoch keeps under it.

    What reaches the driver from tasks counts against the limit: an Arrow collect, and a
    broadcast (Spark gathers its rows on the driver first), Spark's own adaptive ones too.
    Past it Spark fails the job, and with it the epoch. So every collect an epoch makes is
    either

    1. bounded before it runs: at most ``rows`` rows of at most ``row_bytes`` each, which
       ``fits`` a quarter of the limit (the rest for what Spark adds, and the other results of
       the job); a broadcast is made by ``small_side``, which broadcasts only what fits and
       keeps Spark from broadcasting the rest; or
    2. made through ``collect``, which returns None if Spark refused it for its size: the
       caller then plans without it (for desired itself, in Spark tasks:
       ``EpochContext.collect``).
    """

    size: int
    """The limit in bytes; 0: none."""
    spark_broadcasts: int = _DEFAULT_BROADCAST
    """The most Spark broadcasts on its own for a join (the larger of its two thresholds,
    ``spark.sql.autoBroadcastJoinThreshold`` and the adaptive one); 0: never."""

    @classmethod
    def of(cls, spark: Any) -> ResultLimit:
        """The limits of ``spark``'s session (Spark's defaults where it will not say: Connect)."""
        size = _conf_bytes(spark, "spark.driver.maxResultSize")
        static = _conf_bytes(spark, "spark.sql.autoBroadcastJoinThreshold")
        adaptive = _conf_bytes(spark, "spark.sql.adaptive.autoBroadcastJoinThreshold")
        return cls(
            _DEFAULT_RESULT_LIMIT if size is None else size,
            max(
                _DEFAULT_BROADCAST if static is None else static,
                0 if adaptive is None else adaptive,
            ),
        )

    def fits(self, rows: int, row_bytes: int) -> bool:
        """Whether ``rows`` rows of at most ``row_bytes`` each may reach the driver (way 1)."""
        return not self.size or rows * row_bytes <= self.size // 4

    def small_side(self, side: DataFrame, rows: int, row_bytes: int, *, most: int) -> DataFrame:
        """``side``, the small side of a join, of at most ``rows`` rows of at most ``row_bytes``
        each: broadcast when there are at most ``most`` (a bigger broadcast costs more than a
        shuffle) and they ``fits``; otherwise joined by a shuffle, and Spark kept from
        broadcasting it (or the other side) unless what it broadcasts on its own fits."""
        if rows <= most and self.fits(rows, row_bytes):
            return F.broadcast(side)
        if self.fits(1, self.spark_broadcasts):
            return side
        return side.hint("merge")  # the join Spark makes when it does not broadcast

    def collect(self, rows: DataFrame) -> pa.Table | None:
        """``rows`` on the driver as Arrow (way 2); None if Spark refused them for the limit."""
        try:
            return to_arrow(rows)
        except Exception as exc:
            if is_spark_error(exc) and "maxResultSize" in str(exc):
                return None
            raise


def _conf_bytes(spark: Any, key: str) -> int | None:
    """A size setting of ``spark``'s session in bytes (a negative one, disabled: 0); None when
    unset or not readable through this session (Spark Connect)."""
    try:
        text = spark.conf.get(key, None)
    except Exception:
        return None
    if text is None:
        return None
    if text.strip().startswith("-"):
        return 0
    return parse_bytes(text)


@dataclass
class DriverBudget:
    """What the sink learned, across epochs, about bringing the view to the driver."""

    bytes_per_row: float | None = None
    """Arrow bytes per row of the last collect of a row per row of the view (None: none was)."""
    too_big: bool = False
    """A complete batch of this view was once too big for the driver to collect: ``auto``
    plans in Spark tasks from then on, rather than collect and fail again each epoch."""

    def learn(self, table: pa.Table) -> None:
        if table.num_rows:
            self.bytes_per_row = table.nbytes / table.num_rows


@dataclass
class EpochContext:
    """The state of one call of the sink that outlives its attempts."""

    batch: DataFrame
    """The micro-batch, as given."""
    opts: SinkOptions
    where: Where
    store: Store
    phases: dict[str, float] = field(default_factory=dict)
    batch_ran: bool = False
    """Whether a Spark job has run every partition of the micro-batch this epoch (``drain``;
    a plan says so of its planning: ``Plan.ran_batch``)."""
    checked_rules: Rules | None = None
    """The target rules the batch's rows were last found to keep (``enforce``)."""
    collected: bool = False
    """Rows of the batch (or their fingerprints) came to the driver: the epoch's end gives
    back the memory they took (``give_back_memory``)."""
    budget: DriverBudget = field(default_factory=DriverBudget)
    """Kept by the sink across epochs (``placement``)."""
    too_big: bool = False
    """This epoch's batch proved too big to collect (``collect``): it plans in Spark tasks."""

    @contextlib.contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[None]:
        """Add the time spent in the block to the epoch's figures under ``name``, and say what
        the epoch is doing (``progress``): ``detail`` gives its rows or files where known."""
        doing = f"{self.where}: {name}" + (f" ({detail})" if detail else "")
        progress.debug("%s ...", doing)
        long = None
        if progress.isEnabledFor(logging.INFO):
            long = threading.Timer(PROGRESS_AFTER, progress.info, ("%s: still running ...", doing))
            long.daemon = True
            long.start()
        start = time.monotonic()
        try:
            yield
        finally:
            if long is not None:
                long.cancel()
            took = time.monotonic() - start
            self.phases[name] = self.phases.get(name, 0.0) + took
            progress.log(logging.INFO if took >= PROGRESS_AFTER else logging.DEBUG, "%s: %.1fs", doing, took)

    def enforce(self, rows: DataFrame, rules: Rules) -> None:
        """Refuse rows that break the target's rules (``rules.py``), unless already checked."""
        if rules and rules != self.checked_rules:
            with self.phase("rules"):
                check_rows(rows, rules, self.where)
        self.checked_rules = rules

    @functools.cached_property
    def limit(self) -> ResultLimit:
        """The driver's result limit, which every collect of this epoch keeps."""
        return ResultLimit.of(self.batch.sparkSession)

    def placement(self, snap: Snapshot) -> str:
        """Where this attempt plans: the ``placement`` option, or for ``auto`` the driver while
        the target holds at most ``driver_max_rows`` rows and, in complete mode (which collects
        desired's fingerprints, a row per row of the view), what it collects fits in half of
        Spark's driver result limit (``spark.driver.maxResultSize``). Once a batch proved too
        big to collect (``collect``), the sink plans in Spark tasks."""
        if self.opts.placement != "auto":
            return self.opts.placement
        if self.too_big or self.budget.too_big:
            return "distributed"
        # A file without a row count (a foreign writer's, no statistics) counts a row per 8
        # bytes: an unknown table is taken for a big one.
        held = sum(f.num_records if f.num_records is not None else f.size // 8 for f in snap.files)
        if held > self.opts.driver_max_rows:
            return "distributed"
        if self.opts.mode != "complete":
            return "driver"  # an upsert batch brings the changed keys only
        per_row = self.budget.bytes_per_row or _FINGERPRINT_ROW
        size = held * per_row
        limit = self.limit.size
        return "distributed" if limit and size > limit / 2 else "driver"

    def collect(self, rows: DataFrame) -> pa.Table | None:
        """``rows`` (a row per row of the batch: the batch in upsert mode, desired's
        fingerprints in complete mode) on the driver as Arrow; None if they are bigger than
        Spark lets a driver collect under ``placement = "auto"`` (``ResultLimit.collect``):
        then this epoch plans distributed, and in complete mode every later one too. A default
        configuration never dies of the driver's result limit. Under ``placement = "driver"``
        a batch too big for the driver fails the epoch: the placement was asked for."""
        if self.opts.placement != "auto":
            table = to_arrow(rows)
        else:
            collected = self.limit.collect(rows)
            if collected is None:
                log.warning(
                    "%s: the batch is bigger than the driver may collect (spark.driver.maxResultSize): "
                    "it plans in Spark tasks (placement 'distributed')%s",
                    self.where,
                    " from now on" if self.opts.mode == "complete" else " this epoch",
                )
                self.too_big = True
                self.budget.too_big = self.budget.too_big or self.opts.mode == "complete"
                return None
            table = collected
        self.budget.learn(table)
        self.collected = True
        return table

    def drain(self) -> None:
        """Run the micro-batch's plan without output, unless this epoch already ran it.

        A stateful streaming query commits its state only when every partition of the batch
        ran; Spark 4 fails a ``foreachBatch`` that skips them. Writing nothing is not enough.
        """
        if not self.batch_ran:
            self.batch.write.format("noop").mode("overwrite").save()
            self.batch_ran = True
