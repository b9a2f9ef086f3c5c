"""The invariants of a view's whole Delta history, checked after the fact.

Given the table, the view and what desired was at each epoch, every version of the log is
read back from storage and checked:

1. At every version that records the view's frontier ``u`` (its own commits), the table
   equals desired of epoch ``u - 1`` as a multiset; under a shared clock (``clock``, a part of
   ``mvsink.time``), desired at that time. Rogue commits in between are excused until the
   next view commit, which must repair them.
2. Every data file any version references (adds and change-data files) exists and reads as
   Parquet; every deletion-vector file it references exists.
3. A view commit adds only files staged by an attempt of the epoch it records (its folder
   ``mvsink-<view>-e<epoch>-*``): no staged file of another attempt is referenced.
4. Within a lineage, the frontier strictly increases: it never moves back or repeats. Under
   a shared clock, the time strictly increases across all the view's commits.
5. No epoch of a lineage is committed twice.
6. The log's versions run 0..N without a gap, and a version that changes no data (every
   action ``dataChange = false``: a compaction) holds exactly what the version before held.
7. A commit that is not the view's may add rows (a rogue append, repaired by the next view
   commit) but never removes any, nor mixes data changes with actions that say they are none.

``check_metrics`` checks the metrics table against those commits: each view commit appears
once, with its own facts, and none is skipped below the newest it holds.

``check_verdicts`` checks the epochs that wrote nothing against the version they read
(``EpochReport.snapshot_version``): an ``unchanged`` epoch found that version equal to
desired at its time, so it must hold exactly that; a ``replay`` found its time already
reached, so the view's newest commit at or below that version must be at or past it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable

from mvsink.table.deletion_vectors import vector_files
from mvsink.table.storage import Store
from tests.helpers import multiset

_COMMIT = re.compile(r"\d{20}\.json")


@dataclass
class History:
    """What the check saw, and what it found wrong."""

    versions: int = 0
    view_commits: int = 0
    compared: int = 0
    files: int = 0
    violations: list[str] = field(default_factory=list)
    vectors: set[str] = field(default_factory=set)
    """Deletion-vector files the log references (checked to exist, like data files)."""
    commits: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The view's commits by version: their commit info, mvsink's keys at the top level."""
    positions: dict[int, int] = field(default_factory=dict)
    """The position (epoch, or time) of each view commit, by version."""
    last: int | None = None
    """The position of the newest view commit."""


def check_history(
    target: str,
    options: dict[str, str],
    view: str,
    desired: Callable[[int], Counter[Any]],
    columns: list[str],
    clock: str | None = None,
) -> History:
    store = Store(target, options)
    clock_at = -1
    found = History()
    log = sorted(p for p in store.files("_delta_log") if _COMMIT.fullmatch(p.rsplit("/", 1)[-1]))
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
        referenced.update(a["cdc"]["path"] for a in actions if "cdc" in a)
        vectors = vector_files(a["add"].get("deletionVector") for a in actions if "add" in a)
        found.vectors.update(v.path for v in vectors)
        changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        upper = info.get("mvsink.upper")
        ours = info.get("mvsink.view") == view and bool(upper)
        labels = {bool(c.get("dataChange", True)) for c in changes}
        if not ours and labels == {True, False}:
            found.violations.append(f"v{version}: changes data and says it does not, in one commit")
        if not ours and any("remove" in a and a["remove"].get("dataChange", True) for a in actions):
            # Another writer may add rows (a rogue append the next view commit repairs); one
            # that removes rows here is a compaction or a tool of ours gone wrong.
            found.violations.append(f"v{version}: a commit not the view's removes rows")
        if version and labels == {False}:
            before, after = (_held(target, v, options, columns, found) for v in (version - 1, version))
            if before is not None and after is not None and before != after:
                found.violations.append(
                    f"v{version}: changes no data (dataChange = false) but its rows differ"
                )
        if not ours:
            continue  # a rogue append, a compaction, a promotion, a property set
        found.view_commits += 1
        found.commits[version] = info
        lineage, epoch = str(info.get("mvsink.lineage")), str(info.get("mvsink.epoch"))
        if int(upper) <= frontier.get(lineage, -1):
            found.violations.append(f"v{version}: lineage {lineage} moved its frontier to {upper}")
        frontier[lineage] = int(upper)
        at = int(upper) - 1
        if clock is not None:
            at = int(json.loads(info.get("mvsink.time") or "{}").get(clock, -1))
            if at < 0:
                found.violations.append(f"v{version}: records no time {clock!r} ({info.get('mvsink.time')})")
                continue
            if at <= clock_at:
                found.violations.append(f"v{version}: the view's time moved from {clock_at} to {at}")
            clock_at = at
        found.last = found.positions[version] = at
        if (lineage, epoch) in epochs:
            found.violations.append(f"v{version}: epoch {epoch} of lineage {lineage} committed again")
        epochs.add((lineage, epoch))
        staged = f"mvsink-{view}-e{epoch}-"
        strays = [p for p in adds if not p.split("/")[0].startswith(staged)]
        if strays:
            found.violations.append(f"v{version}: adds {strays[0]}, not staged by epoch {epoch}")
        held = _held(target, version, options, columns, found)
        want = desired(at)
        if held is not None and held != want:
            found.violations.append(
                f"v{version}: holds {sum(held.values())} rows that are not desired at epoch {at} "
                f"({sum(want.values())} rows)"
            )
        found.compared += 1
    for path in sorted(referenced):
        found.files += 1
        try:
            pq.read_metadata(store.fs.open_input_file(_unquoted(path)))
        except Exception as exc:
            found.violations.append(f"{path}, referenced by the log, does not read: {exc}")
    held = store.sizes(sorted(found.vectors)) if found.vectors else {}
    found.violations += [
        f"deletion vector {p}, referenced by the log, is gone" for p in found.vectors - set(held)
    ]
    return found


def check_metrics(metrics: str, options: dict[str, str], view: str, history: History) -> list[str]:
    """What is wrong with the metrics table ``metrics`` against the view's commits in
    ``history``: a commit recorded twice or with other facts, a row that is no view commit,
    a view commit missing below the newest one recorded."""
    rows = [
        r
        for r in DeltaTable(metrics, storage_options=options).to_pyarrow_table().to_pylist()
        if r["view"] == view
    ]
    wrong = []
    seen = Counter(r["version"] for r in rows)
    wrong += [f"metrics: version {v} recorded {n} times" for v, n in seen.items() if n > 1]
    for r in rows:
        info = history.commits.get(r["version"])
        if info is None:
            wrong.append(f"metrics: version {r['version']} is no commit of view {view}")
            continue
        for column in ("epoch", "lineage", "writer", "inserted", "retracted"):
            if str(r[column]) != str(info.get(f"mvsink.{column}")):
                wrong.append(
                    f"metrics: version {r['version']} has {column} {r[column]!r}, the commit says "
                    f"{info.get(f'mvsink.{column}')!r}"
                )
    newest = max(seen, default=-1)
    missing = [v for v in history.commits if v <= newest and v not in seen]
    wrong += [f"metrics: view commit v{v} is missing (v{newest} is recorded)" for v in missing]
    return wrong


def check_verdicts(
    target: str,
    options: dict[str, str],
    reports: list[dict[str, Any]],
    history: History,
    desired: Callable[[int], Counter[Any]],
    columns: list[str],
    clock: str | None = None,
) -> tuple[int, list[str]]:
    """How many of the view's ``reports`` (``EpochReport.to_json``) said ``unchanged`` or
    ``replay`` against a version of the table, and what is wrong with them. An epoch's
    position is its time ``clock`` under a shared clock, else its epoch (the ``direct``
    lineage), as ``history`` (``check_history`` with the same ``clock``) gives its commits'.
    Positions are compared as one number: a clock of one part (the chaos run's one source),
    never parts that can be incomparable."""
    found, checked, held_at = History(), 0, dict[int, Counter[Any] | None]()
    for report in reports:
        version, outcome = report.get("snapshot_version"), report.get("outcome")
        at = (report.get("clock_time") or {}).get(clock) if clock is not None else report.get("epoch")
        if version is None or outcome not in ("unchanged", "replay"):
            continue
        checked += 1
        where = f"epoch {report['epoch']} ({outcome} at v{version}, position {at})"
        if at is None:  # a report that cannot be checked is itself wrong
            found.violations.append(f"{where}: the report gives no {clock or 'epoch'}")
            continue
        if outcome == "unchanged":
            if version not in held_at:
                held_at[version] = _held(target, version, options, columns, found)
            held = held_at[version]
            if held is not None and held != desired(at):
                wrong = f"v{version} is not desired at {at}, yet nothing was written"
                found.violations.append(f"{where}: {wrong}")
        else:
            reached = max((p for v, p in history.positions.items() if v <= version), default=-1)
            if reached < at:
                found.violations.append(f"{where}: the view had only reached {reached} at v{version}")
    return checked, found.violations


def _held(
    target: str, version: int, options: dict[str, str], columns: list[str], found: History
) -> Counter[Any] | None:
    """The rows of ``version``, or None (and a violation) if it does not read."""
    try:
        table = DeltaTable(target, version=version, storage_options=options).to_pyarrow_table()
    except Exception as exc:
        violation = f"v{version} does not read: {str(exc)[:300]}"
        if violation not in found.violations:
            found.violations.append(violation)
        return None
    return multiset(table, columns)


def _unquoted(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)
