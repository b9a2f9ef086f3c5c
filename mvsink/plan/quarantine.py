"""Error rows: rows that break a rule neither vanish nor poison the view (``on_error``).

With ``on_error = "fail"`` (the default) a row breaking a rule fails the epoch
(``rules.raise_broken``): an ``InputError`` naming the rule, a sample of rows and the epoch,
and nothing committed.

With ``on_error = "table"`` each epoch is split once (the batch marked with the first rule
each row breaks, and cached): the rows that keep every rule go to the view, and the others,
with the rule in column ``mvsink_rule``, to the **errors table** beside it
(``errors_target``, default ``<target>_errors``). The errors table is kept by a second sink of
the same view name, mode, epoch and lineage, so it follows the same discipline: in complete
mode it equals the current error rows (an error that disappears from desired disappears from
it), in append mode it gets each epoch's error rows once; and it carries the same frontier.
The view runs first and decides: the errors table is written only for an epoch the view
committed or already holds, so it follows the view's lineage and active writer; a crash
between the two commits leaves the errors table behind, and the replayed epoch (a replay
for the view) brings it up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from mvsink.compat import KEEP
from mvsink.config import SinkOptions
from mvsink.errors import ConfigError, Where, first_line
from mvsink.plan.rules import RULE, Rules, rules_for
from mvsink.table.delta import load_snapshot

if TYPE_CHECKING:
    from mvsink.report import EpochReport

ERROR_RULE = "mvsink_rule"
"""The errors table's column naming the rule a row broke."""


def errors_target(opts: SinkOptions) -> str:
    return opts.errors_target or opts.target.rstrip("/") + "_errors"


def check_expressions(batch: DataFrame, opts: SinkOptions, where: Where) -> None:
    """Each ``not_null`` path names a column (through struct fields) of the batch, and each
    of the ``checks`` options is a boolean SQL expression over its columns."""
    for path in opts.not_null:
        kind: DataType = batch.schema
        for depth, part in enumerate(path.split(".")):
            if not isinstance(kind, StructType) or part not in kind.names:
                within = "the view" if depth == 0 else f"struct {'.'.join(path.split('.')[:depth])}"
                raise ConfigError(f"option 'not_null': {path!r}: {within} has no field {part!r}", where)
            kind = kind[part].dataType
    for i, expression in enumerate(opts.checks, 1):
        try:
            result = batch.select(F.expr(expression).alias("c")).schema["c"].dataType.typeName()
        except Exception as exc:
            raise ConfigError(
                f"option 'checks' ({i}: {expression!r}) is not an SQL expression over the view's "
                f"columns: {first_line(exc, 300)}",
                where,
            ) from None
        if result != "boolean":
            raise ConfigError(f"option 'checks' ({i}: {expression!r}) is {result}, not boolean", where)


def errors_options(opts: SinkOptions) -> SinkOptions:
    """The options of the sink that keeps the errors table of a view with options ``opts``."""
    return opts.model_copy(
        update={
            "target": errors_target(opts),
            "on_error": "fail",
            "errors_target": None,
            "not_null": (),
            "checks": (),
            "partition_by": None,
            "cluster_by": (),
            "compact_every": None,
            "metrics_table": None,
            "history_target": None,  # the view's history is the view's, not its errors table's
            "history_retention": None,
            # The view decides which epochs and lineages count (it runs first): the errors
            # table follows it, whatever its own history says.
            "on_new_lineage": "adopt",
            "allow_gaps": True,
            "read_only": False,
        }
    )


class Quarantine:
    """The errors table of one sink (``on_error = "table"``), kept by ``sink``: a sink made
    with ``errors_options`` (the caller makes it: this layer sits below the sink)."""

    def __init__(self, sink: ErrorsSink) -> None:
        self.sink = sink

    def split(
        self, batch: DataFrame, opts: SinkOptions, where: Where
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        """``(marked, ok rows, error rows)``; ``marked`` is cached: unpersist it after."""
        snap = load_snapshot(opts.target, opts.app_id, opts.storage_options, where)
        rules: Rules = rules_for(snap, opts, where)
        marked = batch.select("*", rules.broken()).persist(KEEP)
        ok = marked.where(F.col(RULE).isNull()).drop(RULE)
        bad = marked.where(F.col(RULE).isNotNull()).withColumnRenamed(RULE, ERROR_RULE)
        return marked, ok, bad

    def run(self, bad: DataFrame, epoch: int) -> EpochReport:
        return self.sink(bad, epoch)


class ErrorsSink(Protocol):
    """What ``Quarantine`` needs of the errors table's sink (``MVSink``)."""

    @property
    def target(self) -> str: ...

    def __call__(self, batch: DataFrame, epoch: int, /) -> EpochReport: ...
