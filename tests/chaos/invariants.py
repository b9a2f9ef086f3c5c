"""The invariants of a view's whole Delta history, checked after the fact.

Given the table, the view and what desired was at each epoch, every version of the log is
read back from storage and checked:

1. At every version that records the view's frontier ``u`` (its own commits), the table
   equals desired of epoch ``u - 1`` as a multiset. Rogue commits in between are excused
   until the next view commit, which must repair them.
2. Every data file any version references exists and reads as Parquet.
3. A view commit adds only files staged by an attempt of the epoch it records (its folder
   ``mvsink-<view>-e<epoch>-*``): no staged file of another attempt is referenced.
4. Within a lineage, the frontier strictly increases: it never moves back or repeats.
5. No epoch of a lineage is committed twice.
6. The log's versions run 0..N without a gap, and a version that changes no data (every
   action ``dataChange = false``: a compaction) holds exactly what the version before held.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable

from mvsink.table.storage import Store
from tests.helpers import multiset


@dataclass
class History:
    """What the check saw, and what it found wrong."""

    versions: int = 0
    view_commits: int = 0
    compared: int = 0
    files: int = 0
    violations: list[str] = field(default_factory=list)


def check_history(
    target: str,
    options: dict[str, str],
    view: str,
    desired: Callable[[int], Counter[Any]],
    columns: list[str],
) -> History:
    store = Store(target, options)
    found = History()
    log = sorted(p for p in store.files("_delta_log") if p.endswith(".json") and "/_" not in p)
    frontier: dict[str, int] = {}
    epochs: set[tuple[str, str]] = set()
    referenced: set[str] = set()
    numbers = [int(p.rsplit("/", 1)[-1].split(".")[0]) for p in log]
    if numbers != list(range(len(numbers))):
        found.violations.append(f"the log's versions are not 0..{len(numbers) - 1}: {numbers}")
    for path in log:
        version = int(path.rsplit("/", 1)[-1].split(".")[0])
        raw = store.get(path)
        assert raw is not None, path
        actions = [json.loads(line) for line in raw.to_pybytes().decode().splitlines() if line.strip()]
        found.versions += 1
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        info = {**(info.get("tags") or {}), **info}
        adds = [a["add"]["path"] for a in actions if "add" in a]
        referenced.update(adds)
        changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        if version and changes and not any(c.get("dataChange", True) for c in changes):
            before, after = (
                multiset(DeltaTable(target, version=v, storage_options=options).to_pyarrow_table(), columns)
                for v in (version - 1, version)
            )
            if before != after:
                found.violations.append(
                    f"v{version}: changes no data (dataChange = false) but its rows differ"
                )
        upper = info.get("mvsink.upper")
        if info.get("mvsink.view") != view or not upper:
            continue  # a rogue writer, a compaction, a promotion
        found.view_commits += 1
        lineage, epoch = str(info.get("mvsink.lineage")), str(info.get("mvsink.epoch"))
        if int(upper) <= frontier.get(lineage, -1):
            found.violations.append(f"v{version}: lineage {lineage} moved its frontier to {upper}")
        frontier[lineage] = int(upper)
        if (lineage, epoch) in epochs:
            found.violations.append(f"v{version}: epoch {epoch} of lineage {lineage} committed again")
        epochs.add((lineage, epoch))
        staged = f"mvsink-{view}-e{epoch}-"
        strays = [p for p in adds if not p.split("/")[0].startswith(staged)]
        if strays:
            found.violations.append(f"v{version}: adds {strays[0]}, not staged by epoch {epoch}")
        held = DeltaTable(target, version=version, storage_options=options).to_pyarrow_table()
        want = desired(int(upper) - 1)
        if multiset(held, columns) != want:
            found.violations.append(
                f"v{version}: holds {held.num_rows} rows that are not desired at epoch {int(upper) - 1} "
                f"({sum(want.values())} rows)"
            )
        found.compared += 1
    for path in sorted(referenced):
        found.files += 1
        try:
            pq.read_metadata(store.fs.open_input_file(_unquoted(path)))
        except Exception as exc:
            found.violations.append(f"{path}, referenced by the log, does not read: {exc}")
    return found


def _unquoted(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)
