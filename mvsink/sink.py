"""The sink: keeps a Delta table equal to a streaming query's result, epoch by epoch.

``MVSink`` is a ``foreachBatch`` callable. Each call runs one epoch through three steps:

    micro-batch (desired) ──┐
                            v
    snapshot ──> mint ──> write ──> append ──> Delta log
       ^         (desc)   (staged)    │
       └───── conflict: discard staged files, reload, retry ──┘

* mint (``mint.py``): from the latest snapshot (version ``v``, frontier ``lower``) decide the
  batch description ``(lower, epoch + 1)``, or nothing (replay, before ``as_of``, read-only).
* write (``correction.py``, ``write.py``): fingerprint desired in one Spark job, diff it against
  the index of the snapshot's files (``index.py``), and stage the inserted rows and the
  rewritten files as Parquet that nothing references yet.
* append (``delta.py``): commit removes, adds and the frontier in one Delta version, only if
  no commit at all landed since ``v``.

The frontier of view ``name`` is the app transaction ``mvsink:<name>`` in the Delta log: the
target holds desired as of epoch ``frontier - 1``.

Invariants (cited elsewhere by number):

* I1. Lowers of committed descriptions strictly increase; at most one description is valid
  at a time (the one whose lower is the current frontier).
* I2. A commit is only ever made against the snapshot its correction was computed from
  (``compare_and_append`` is strict: any commit since that snapshot makes it fail).
* I3. After a successful append at ``upper`` the target equals desired of epoch ``upper - 1``
  as a multiset, whatever it held before.
* I4. No staged file is referenced unless its whole description committed; a failed attempt
  deletes its staged files, and a crash leaves only unreferenced files that vacuum removes.
* I5. Nothing is lost: an epoch commits, is found already reflected (a newer frontier), or
  raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.config import SinkOptions
from mvsink.correction import Correction, Fingerprints, diff
from mvsink.delta import Snapshot, compare_and_append, load_snapshot, read_frontier
from mvsink.errors import ConflictError, InputError, RetriesExhaustedError, Where
from mvsink.fingerprint import FP_A, FP_B, fingerprint_columns, quote
from mvsink.index import PersistedIndex
from mvsink.mint import BatchDescription, mint
from mvsink.report import EpochReport
from mvsink.schema import check_fits, check_supported, target_schema_json, target_struct
from mvsink.write import Staged, discard_folder, stage

log = logging.getLogger(__name__)


class MVSink:
    """Keep the Delta table at ``target`` equal to each micro-batch (``complete`` mode).

    Use as ``df.writeStream.foreachBatch(MVSink(target, name))``, or call it directly as
    ``sink(batch_df, epoch)`` from a batch job. Options are those of ``SinkOptions``.
    """

    def __init__(self, target: str, name: str, **options: Any) -> None:
        self.options = SinkOptions.build(target=target, name=name, **options)
        self._index = PersistedIndex()
        self._lock = threading.Lock()
        self.reports: deque[EpochReport] = deque(maxlen=1000)
        # Called with the snapshot after staging and before committing (tests use it to land
        # a competing commit in exactly that window).
        self._before_commit: Callable[[Snapshot], None] | None = None

    @classmethod
    def from_options(cls, options: SinkOptions) -> MVSink:
        """A sink from an already validated ``SinkOptions`` (e.g. ``SinkOptions.from_toml``)."""
        return cls(**options.model_dump())

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def target(self) -> str:
        return self.options.target

    @property
    def last_report(self) -> EpochReport | None:
        return self.reports[-1] if self.reports else None

    def frontier(self) -> int | None:
        """The target's frontier for this view (None before the first commit)."""
        return read_frontier(self.target, self.options.app_id, self.options.storage_options)

    def __call__(self, batch_df: DataFrame, epoch_id: int) -> EpochReport:
        """Run one epoch: make the target equal ``batch_df`` and record ``epoch_id + 1``."""
        if isinstance(epoch_id, bool) or not isinstance(epoch_id, int) or epoch_id < 0:
            raise InputError(
                f"the epoch must be a non-negative int, got {epoch_id!r}",
                Where(self.name, self.target, None),
            )
        with self._lock:
            report = _Epoch(self, batch_df, epoch_id).run()
        self.reports.append(report)
        log.info("%s", report)
        return report


class _Epoch:
    """One call of the sink: the retry loop around mint, write and append."""

    def __init__(self, sink: MVSink, desired: DataFrame, epoch: int) -> None:
        self.sink = sink
        self.opts = sink.options
        self.raw = desired
        self.epoch = epoch
        self.where = Where(self.opts.name, self.opts.target, epoch)
        self.started = time.monotonic()
        self.desired: DataFrame | None = None
        self.fingerprints: Fingerprints | None = None
        self.files_indexed = 0
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to the epoch's figures under ``name``."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def run(self) -> EpochReport:
        check_supported(self.raw.schema, self.where)
        try:
            return self._attempts()
        finally:
            if self.desired is not None:
                self.desired.unpersist()

    def _attempts(self) -> EpochReport:
        policy = self.opts.retry
        for attempt in range(1, policy.max_attempts + 1):
            with self._phase("snapshot"):
                snap = load_snapshot(
                    self.opts.target, self.opts.app_id, self.opts.storage_options, self.where
                )
            if snap.exists:
                assert snap.schema_json is not None
                check_fits(self.raw.schema, snap.schema_json, self.where)
                schema_json = snap.schema_json
            else:
                schema_json = target_schema_json(self.raw.schema)
            desc = mint(
                self.epoch,
                snap.frontier,
                as_of=self.opts.as_of,
                read_only=self.opts.read_only,
                where=self.where,
            )
            if desc in ("replay", "before_as_of"):
                self._drain()
                return self._report(desc, snap.frontier, None, None, attempt)
            corr = self._correction(snap, schema_json)
            if not isinstance(desc, BatchDescription):
                return self._report(desc, snap.frontier, None, None, attempt, corr=corr)
            with self._phase("write"):
                staged = stage(
                    self.raw.sparkSession,
                    desired=self._desired(schema_json),
                    corr=corr,
                    snap=snap,
                    index=self.sink._index,
                    schema=target_struct(schema_json),
                    view=self.opts.name,
                    epoch=self.epoch,
                    max_rows_per_file=self.opts.max_rows_per_file,
                    cluster_by=self.opts.cluster_by,
                    where=self.where,
                )
            try:
                if self.sink._before_commit is not None:
                    self.sink._before_commit(snap)
                with self._phase("append"):
                    version = compare_and_append(
                        snap,
                        adds=staged.adds,
                        removes=staged.removes,
                        app_id=self.opts.app_id,
                        upper=desc.upper,
                        metadata=self._metadata(desc, staged),
                        schema_json=schema_json,
                        partition_by=(),
                        where=self.where,
                    )
            except ConflictError as exc:
                discard_folder(staged.folder)
                pause = policy.backoff(attempt, random.random())
                log.info(
                    "%s: attempt %d lost a commit race (%s); retrying in %.2fs",
                    self.where,
                    attempt,
                    exc.message,
                    pause,
                )
                if attempt < policy.max_attempts:
                    time.sleep(pause)
                continue
            except BaseException:
                discard_folder(staged.folder)
                raise
            # Keep the index equal to the new version's files (the snapshot's, less removes,
            # plus ours) so the next epoch reads nothing back.
            self.sink._index.forget(f.path for f in staged.removes)
            for add, entry in zip(staged.adds, staged.entries, strict=True):
                self.sink._index.put(add.path.replace(os.sep, "/"), entry)
            return self._report(
                "committed", desc.lower, desc.upper, version, attempt, corr=corr, staged=staged
            )
        raise RetriesExhaustedError(
            f"lost the commit race {policy.max_attempts} times in a row; the epoch is not committed "
            "(Spark will retry the batch). If another writer commits this often, raise "
            "retry.max_attempts or make it commit less often.",
            self.where,
        )

    def _drain(self) -> None:
        """Run the micro-batch's plan without output, unless this epoch already ran it.

        A stateful streaming query commits its state only when every partition of the batch
        ran; Spark 4 fails a ``foreachBatch`` that skips them. Writing nothing is not enough.
        """
        if self.fingerprints is None:
            self.raw.write.format("noop").mode("overwrite").save()

    def _desired(self, schema_json: str) -> DataFrame:
        """Desired in the target's column order with its fingerprints, cached for this epoch."""
        if self.desired is None:
            schema = target_struct(schema_json)
            a, b = fingerprint_columns(schema)
            cols = [F.col(quote(n)) for n in schema.names]
            self.desired = self.raw.select(*cols, a, b).persist(StorageLevel.MEMORY_AND_DISK)
        return self.desired

    def _correction(self, snap: Snapshot, schema_json: str) -> Correction:
        spark = self.raw.sparkSession
        with self._phase("index"):
            self.files_indexed += self.sink._index.sync(spark, snap, target_struct(schema_json), self.where)
        if self.fingerprints is None:
            # Desired does not change between attempts: fingerprint it once per epoch.
            with self._phase("fingerprint"):
                table = self._desired(schema_json).select(FP_A, FP_B).toArrow()
                self.fingerprints = Fingerprints(table.column(FP_A).to_numpy(), table.column(FP_B).to_numpy())
        with self._phase("diff"):
            return diff(self.fingerprints, self.sink._index.persisted(snap.files))

    def _metadata(self, desc: BatchDescription, staged: Staged) -> dict[str, str]:
        return {
            "mvsink.view": self.opts.name,
            "mvsink.epoch": str(self.epoch),
            "mvsink.lower": "" if desc.lower is None else str(desc.lower),
            "mvsink.upper": str(desc.upper),
            "mvsink.writer": self.opts.writer or f"{socket.gethostname()}:{os.getpid()}",
            "mvsink.inserted": str(staged.inserted),
            "mvsink.retracted": str(staged.retracted),
            "mvsink.files_added": str(len(staged.adds)),
            "mvsink.files_removed": str(len(staged.removes)),
        }

    def _report(
        self,
        outcome: Any,
        lower: int | None,
        upper: int | None,
        version: int | None,
        attempts: int,
        *,
        corr: Correction | None = None,
        staged: Staged | None = None,
    ) -> EpochReport:
        return EpochReport(
            view=self.opts.name,
            target=self.opts.target,
            epoch=self.epoch,
            outcome=outcome,
            lower=lower,
            upper=upper,
            version=version,
            inserted=corr.inserted if corr else 0,
            retracted=corr.retracted if corr else 0,
            files_added=len(staged.adds) if staged else 0,
            files_removed=len(staged.removes) if staged else 0,
            bytes_written=staged.bytes_written if staged else 0,
            files_indexed=self.files_indexed,
            phases=dict(self.phases),
            attempts=attempts,
            seconds=time.monotonic() - self.started,
        )


def frontier(target: str, name: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The frontier (upper) of view ``name`` in the Delta table at ``target``, or None."""
    return read_frontier(target, f"mvsink:{name}", storage_options or {})
