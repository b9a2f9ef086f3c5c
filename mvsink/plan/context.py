"""What every mode needs from the epoch it plans for: the batch, options, store and figures."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame

from mvsink.compat import to_arrow
from mvsink.config import SinkOptions
from mvsink.errors import Where
from mvsink.plan.rules import Rules, check_rows
from mvsink.table.delta import Snapshot
from mvsink.table.storage import Store

log = logging.getLogger(__name__)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(text: str) -> int:
    """A Spark size (``"8m"``, ``"1g"``, ``"512k"``, ``"1024"``) in bytes."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)i?b?\s*", text.lower())
    if not found:
        return _DEFAULT_RESULT_LIMIT
    return int(found.group(1)) * _UNITS[found.group(2)]


_FINGERPRINT_ROW = 24
"""Arrow bytes a row of desired's fingerprints takes on the driver (two int64 and the rule
column), until a collect measured it."""
_DEFAULT_RESULT_LIMIT = 1 << 30  # Spark's default spark.driver.maxResultSize


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
    """Whether a Spark job has run every partition of the micro-batch this epoch."""
    checked_rules: Rules | None = None
    """The target rules the batch's rows were last found to keep."""
    files_read: int = 0
    budget: DriverBudget = field(default_factory=DriverBudget)
    """Kept by the sink across epochs (``placement``)."""
    too_big: bool = False
    """This epoch's batch proved too big to collect: it plans in Spark tasks."""
    whole: bool = False
    """The current attempt writes desired whole instead of correcting file by file."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to the epoch's figures under ``name``."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def enforce(self, rows: DataFrame, rules: Rules) -> None:
        """Refuse rows that break the target's rules (``rules.py``), unless already checked."""
        if rules and rules != self.checked_rules:
            with self.phase("rules"):
                check_rows(rows, rules, self.where)
        self.checked_rules = rules

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
        limit = self.result_limit()
        return "distributed" if limit and size > limit / 2 else "driver"

    def result_limit(self) -> int:
        """Spark's ``spark.driver.maxResultSize`` in bytes (0: no limit)."""
        try:
            text = self.batch.sparkSession.conf.get("spark.driver.maxResultSize", None)
        except Exception:  # not readable through this session (Spark Connect): the default
            text = None
        return _DEFAULT_RESULT_LIMIT if text is None else parse_bytes(text)

    def collect(self, rows: DataFrame) -> pa.Table | None:
        """``rows`` (a row per row of the batch: the batch in upsert mode, desired's
        fingerprints in complete mode) on the driver as Arrow; None if they are bigger than
        Spark lets a driver collect under ``placement = "auto"``: then this epoch plans
        distributed, and in complete mode every later one too. A default configuration never
        dies of the driver's result limit."""
        try:
            table = to_arrow(rows)
        except Exception as exc:
            if self.opts.placement != "auto" or "maxResultSize" not in str(exc):
                raise
            log.warning(
                "%s: the batch is bigger than the driver may collect (spark.driver.maxResultSize): "
                "it plans in Spark tasks (placement 'distributed')%s",
                self.where,
                " from now on" if self.opts.mode == "complete" else " this epoch",
            )
            self.too_big = True
            self.budget.too_big = self.budget.too_big or self.opts.mode == "complete"
            return None
        self.budget.learn(table)
        return table

    def drain(self) -> None:
        """Run the micro-batch's plan without output, unless this epoch already ran it.

        A stateful streaming query commits its state only when every partition of the batch
        ran; Spark 4 fails a ``foreachBatch`` that skips them. Writing nothing is not enough.
        """
        if not self.batch_ran:
            self.batch.write.format("noop").mode("overwrite").save()
            self.batch_ran = True
