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


def read_checkpoint_file(checkpoint: str, relative: str) -> str:
    """The text of a file of a streaming checkpoint (local path or URI)."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(checkpoint if "://" in checkpoint else f"file://{checkpoint}")
    with fs.open_input_stream(f"{path.rstrip('/')}/{relative}") as fh:
        return bytes(fh.read()).decode()


def epoch_time(batch: DataFrame, epoch: int, opts: SinkOptions, where: Where) -> Time | None:
    """The epoch's time under the sink's clock (None: the batch id clock)."""
    clock = opts.clock
    if clock == "batch_id":
        return None
    if callable(clock):
        return flatten(clock(batch, epoch), where)
    if not opts.checkpoint:
        raise ConfigError("clock 'source_offsets' needs the query's 'checkpoint' option", where)
    try:
        text = read_checkpoint_file(opts.checkpoint, f"offsets/{epoch}")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the offsets of batch {epoch} from checkpoint {opts.checkpoint}: {exc}", where
        ) from exc
    # "v1", the batch's metadata, then one line per source: its end offset as JSON.
    sources = [json.loads(line) for line in text.splitlines()[2:] if line.strip()]
    return flatten({str(i): s for i, s in enumerate(sources)}, where)


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


def committed_time(snap: Snapshot, app_id: str, names: list[str]) -> Time | None:
    """The time of the last commit made under this clock, or None."""
    found = {n: snap.transaction(f"{app_id}~{n}") for n in names}
    if all(v is None for v in found.values()):
        return None
    return {n: v for n, v in found.items() if v is not None}


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
    return {f"{app_id}~{k}": v for k, v in time.items()}
