"""What every mode needs from the epoch it plans for: the batch, options, store and figures."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

from mvsink.config import SinkOptions
from mvsink.delta import Snapshot
from mvsink.errors import Where
from mvsink.rules import Rules, check_rows
from mvsink.storage import Store


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
        the target holds at most ``driver_max_rows`` rows (``distributed.py`` above)."""
        if self.opts.placement != "auto":
            return self.opts.placement
        # A file without a row count (a foreign writer's, no statistics) counts a row per 8
        # bytes: an unknown table is taken for a big one.
        held = sum(f.num_records if f.num_records is not None else f.size // 8 for f in snap.files)
        return "distributed" if held > self.opts.driver_max_rows else "driver"

    def drain(self) -> None:
        """Run the micro-batch's plan without output, unless this epoch already ran it.

        A stateful streaming query commits its state only when every partition of the batch
        ran; Spark 4 fails a ``foreachBatch`` that skips them. Writing nothing is not enough.
        """
        if not self.batch_ran:
            self.batch.write.format("noop").mode("overwrite").save()
            self.batch_ran = True
