"""Clocks: what an epoch's time is, so that replicas can compare epochs.

``clock = "batch_id"`` (the default): an epoch's time is Spark's batch id, meaningful only
within one lineage (``lineage.py``).

``clock = "source_offsets"``: an epoch's time is the end offsets of the micro-batch, as the
query records them in its checkpoint (``<checkpoint>/offsets/<batch id>``), flattened to named
integers (``"0.version"`` for the first source's ``{"version": n}``). Queries reading the same
sources (``mvsink-delta`` offsets are Delta versions) then share a clock, whatever their
checkpoints. A callable ``(batch_df, batch_id) -> int | dict`` gives the time any other way.

The time of the last commit is kept in the target as app transactions ``mvsink:<view>~<name>``.
An epoch commits only if it is **ahead**: at or beyond the committed time in every component
and beyond in at least one. Behind or incomparable (the replicas disagree on which is later),
it writes nothing. So active-active replicas with separate checkpoints never move the view
back, and each committed version holds desired as of the time it records.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from mvsink.errors import ConfigError, Where

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from mvsink.config import SinkOptions
    from mvsink.delta import Snapshot

log = logging.getLogger(__name__)

Time = dict[str, int]
Verdict = Literal["ahead", "same", "behind", "incomparable"]


def read_checkpoint_file(
    checkpoint: str, relative: str, storage_options: Mapping[str, str], where: Where
) -> str:
    """The text of a file of a streaming checkpoint (a local path or an object store URI,
    reached with the sink's ``storage_options``; ``s3a://`` is read as ``s3://``)."""
    from mvsink.delta import table_root
    from mvsink.storage import Store

    if checkpoint.startswith("s3a://"):
        checkpoint = "s3://" + checkpoint.removeprefix("s3a://")
    try:
        data = Store(table_root(checkpoint), dict(storage_options)).get(relative)
    except Exception as exc:
        raise ConfigError(f"cannot read {relative} of checkpoint {checkpoint}: {exc}", where) from exc
    if data is None:
        raise ConfigError(f"checkpoint {checkpoint} has no {relative}: is it the query's checkpoint?", where)
    return bytes(data.to_pybytes()).decode()


def _offsets(opts: SinkOptions, batch_id: int, where: Where) -> Time:
    """The end offsets Spark recorded for ``batch_id`` (``offsets/<id>``), flattened."""
    assert opts.checkpoint is not None
    text = read_checkpoint_file(opts.checkpoint, f"offsets/{batch_id}", opts.storage_options, where)
    lines = text.splitlines()
    if not lines or lines[0].strip() != "v1":
        raise ConfigError(f"offsets/{batch_id} of {opts.checkpoint} is not in a format mvsink knows", where)
    # After the version and the batch's metadata: one line per source, its offset as JSON, or
    # "-" for a source with none yet (counted as -1, so that every batch names the same parts).
    sources: dict[str, Any] = {}
    for i, line in enumerate(lines[2:]):
        try:
            sources[str(i)] = -1 if line.strip() == "-" else json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"offsets/{batch_id} of {opts.checkpoint}: source {i}: {exc}", where) from None
    return flatten(sources, where)


def epoch_time(batch: DataFrame, epoch: int, opts: SinkOptions, where: Where) -> Time | None:
    """The epoch's time under the sink's clock (None: the batch id clock)."""
    clock = opts.clock
    if clock == "batch_id":
        return None
    if callable(clock):
        return flatten(clock(batch, epoch), where)
    if not opts.checkpoint:
        raise ConfigError("clock 'source_offsets' needs the query's 'checkpoint' option", where)
    return _offsets(opts, epoch, where)


def batch_start(batch: DataFrame, epoch: int, opts: SinkOptions, where: Where) -> Time | None:
    """Where the batch's data starts: the end offsets of the batch before it (None: the
    first batch, or a callable clock, which says only where batches end)."""
    if opts.clock != "source_offsets" or epoch == 0:
        return None
    return _offsets(opts, epoch - 1, where)


def flatten(value: Any, where: Where, prefix: str = "") -> Time:
    """Integer leaves of a (nested) offset, by dotted name."""
    out: Time = {}
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        out[prefix or "t"] = value
    elif isinstance(value, Mapping):
        for k in sorted(value):
            out.update(flatten(value[k], where, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(flatten(v, where, f"{prefix}.{i}" if prefix else str(i)))
    if not prefix and not out:
        raise ConfigError(f"the clock gave no integer to compare epochs by: {value!r}", where)
    return out


def _names_id(app_id: str, names: list[str]) -> str:
    return f"{app_id}~names@" + hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def committed_time(snap: Snapshot, app_id: str, names: list[str]) -> Time | None:
    """The time of the last commit made under this clock, or None. A commit whose time had
    other parts (another set of sources) is returned with a part this time lacks, so that
    ``compare`` finds the two incomparable."""
    found = {n: snap.transaction(f"{app_id}~{n}") for n in names}
    if all(v is None for v in found.values()) and snap.transaction(f"{app_id}~names") is None:
        return None
    out = {n: v for n, v in found.items() if v is not None}
    if snap.transaction(_names_id(app_id, names)) != snap.transaction(f"{app_id}~names"):
        out["(other sources)"] = 0
    return out


def compare(time: Time, committed: Time | None) -> Verdict:
    """Where ``time`` stands against the committed time (see the module doc)."""
    if committed is None:
        return "ahead"
    if set(committed) - set(time):
        return "incomparable"
    ahead = any(time[k] > committed.get(k, -(2**63)) for k in time)
    behind = any(time[k] < committed[k] for k in committed)
    if ahead and behind:
        return "incomparable"
    return "ahead" if ahead else "behind" if behind else "same"


def transactions(app_id: str, time: Time) -> dict[str, int]:
    """The app transactions recording ``time`` as the committed time: its parts, and which
    parts it had (a tag both under its names' digest and as the current one)."""
    tag = int(hashlib.sha256("\n".join(sorted(time)).encode()).hexdigest()[:12], 16)
    return {
        **{f"{app_id}~{k}": v for k, v in time.items()},
        _names_id(app_id, list(time)): tag,
        f"{app_id}~names": tag,
    }
