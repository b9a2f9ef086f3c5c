"""The streaming query running a batch: its id (which names its lineage) and its output mode.

Spark sets the query's id as a thread-local property while ``foreachBatch`` runs; a sink called
from another thread (several views fed from one batch) does not see it. Then the query is found
by its session: each query runs its batches in a session of its own, the one the batch carries,
and the default session lists the queries it started. What cannot be found is an error, never a
guess (a wrong lineage takes a new checkpoint's batches for replays of the old one's).

Under Spark Connect neither is in reach: the ``checkpoint`` option names the query there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mvsink.errors import ConfigError, Where

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_QUERY_ID = "sql.streaming.queryId"  # the local property Spark sets while a query runs a batch
_RUN_ID = "spark.jobGroup.id"  # ... and its run's id, as the job group of the batch's jobs

FITTING_OUTPUT_MODES = {
    "complete": ("complete",),
    "append": ("append",),
    "upsert": ("update", "append", "complete"),
}
"""The Spark output modes whose batches each sink mode reads right. A complete-mode sink takes a
batch for the whole view (an ``update`` batch holds only the changed groups: the rest would be
deleted); an append-mode sink adds every batch (a ``complete`` batch would add the view again)."""


@dataclass(frozen=True)
class Query:
    id: str
    """The query's id, the same across restarts from its checkpoint (its lineage)."""
    run: str
    """This run's id: new at every start of the query."""
    output_mode: str | None
    """``append``, ``complete`` or ``update``; None where Spark does not say."""
    checkpoint: str | None = None
    """The query's checkpoint location, where Spark says (``clock.query_start`` reads it)."""


def output_mode_refusal(mode: str, output_mode: str) -> str | None:
    """Why a sink in ``mode`` must not take a query's ``output_mode`` batches (None: it may)."""
    fitting = FITTING_OUTPUT_MODES.get(mode, ())
    if output_mode.lower() in fitting:
        return None
    use = " or ".join(f'outputMode("{m}")' for m in fitting)
    article = "an" if mode[0] in "aeiou" else "a"
    return (
        f'the query runs outputMode("{output_mode.lower()}") into {article} {mode}-mode sink, which would '
        f"{'replace the view by each batch' if mode == 'complete' else 'add each batch again'}"
        f" and lose or double rows: use {use} with mode='{mode}'"
        + (", or mode='upsert' with a key" if mode == "complete" and output_mode.lower() == "update" else "")
    )


def running_query(batch: DataFrame, named: bool, where: Where) -> Query | None:
    """The classic streaming query whose ``foreachBatch`` runs ``batch``; None for a direct
    call, under Spark Connect, or when it cannot be found and the sink is ``named`` (its
    ``lineage`` or ``checkpoint`` option tells the lineage instead)."""
    try:
        context = batch.sparkSession.sparkContext
    except Exception:  # a Spark Connect session has no SparkContext
        return None
    query_id = context.getLocalProperty(_QUERY_ID)
    session: Any = batch.sparkSession._jsparkSession
    try:
        default = context._jvm.org.apache.spark.sql.SparkSession.getDefaultSession()  # type: ignore[union-attr]
        root = default.get() if default.isDefined() else None
        for running in root.streams().active() if root is not None else ():
            execution = running.streamingQuery()
            if execution.sparkSessionForStream().equals(session):
                mode = str(execution.outputMode().toString()).lower()
                return Query(
                    str(running.id().toString()),
                    str(running.runId().toString()),
                    mode,
                    _checkpoint_root(execution),
                )
        # A direct call: a DataFrame of the default session while none of its queries runs.
        direct = root is not None and root.equals(session) and len(root.streams().active()) == 0
    except Exception as exc:  # a Spark build without these internals
        log.debug("no streaming query found by session: %s", exc)
        direct = False
    if query_id:  # a query of another session, on foreachBatch's own thread
        return Query(str(query_id), str(context.getLocalProperty(_RUN_ID) or query_id), None)
    if not direct and not named:
        # A batch of a query started from another session, called from another thread; a
        # DataFrame made in foreachBatch from the default session, on another thread; or a
        # direct call while a query runs, or with a DataFrame of another session.
        raise ConfigError(
            "cannot tell whether a streaming query runs this batch, or which (the sink is called "
            "from another thread than foreachBatch's with a DataFrame not of the batch's own "
            "session, or directly while a query runs or with a DataFrame of another session): "
            "pass option 'checkpoint' (the query's checkpointLocation) or 'lineage' (any name "
            "for direct calls, e.g. 'direct')",
            where,
        )
    return None


def _checkpoint_root(execution: Any) -> str | None:
    """Where a running query keeps its checkpoint (Spark's resolved location), if it says."""
    try:
        return str(execution.resolvedCheckpointRoot())
    except Exception:  # a Spark build without it
        return None


def check_output_mode(desired: DataFrame, mode: str, query: Query | None, where: Where) -> None:
    """``ConfigError`` when ``desired`` is made from the batch of a query whose output mode
    ``mode`` cannot read right (``output_mode_refusal``). A desired computed otherwise (the
    whole view read again from a table, say) is whatever the code made it: not checked."""
    if query is None or query.output_mode is None or not _of_the_batch(desired):
        return
    refusal = output_mode_refusal(mode, query.output_mode)
    if refusal is not None:
        raise ConfigError(refusal, where)


def _of_the_batch(desired: DataFrame) -> bool:
    """``desired`` reads the micro-batch (Spark hands ``foreachBatch`` an RDD-backed plan)."""
    try:
        leaves = desired._jdf.queryExecution().logical().collectLeaves()
        return any(leaves.apply(i).getClass().getSimpleName() == "LogicalRDD" for i in range(leaves.size()))
    except Exception:  # not a classic DataFrame
        return False
