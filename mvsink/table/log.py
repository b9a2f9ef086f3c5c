"""The Delta log's commit files, read directly from storage: one version's actions and its
commit info (with mvsink's metadata, ``record.py``, at the top level whichever engine wrote
it), a view's recent history, and a version's add actions carried forward from an earlier
version's (``Adds``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from mvsink.errors import MVSinkError
from mvsink.table import record


class LogFiles(Protocol):
    """What reading the log's files needs of the table's storage (``storage.Store``)."""

    def get(self, path: str) -> pa.Buffer | None: ...


def commit_attempt(log_files: LogFiles, version: int) -> str | None:
    """The attempt id recorded in commit ``version`` ("" for a commit that has none), or None
    if the log does not hold that version. Raises if the log cannot be read."""
    entry = commit_info(log_files, version)
    if entry is None:
        return None
    if entry.keys() == {"version"}:
        # No commitInfo at all: it may be ours (a writer told not to record one), so it
        # proves nothing either way; the caller keeps the staged files.
        raise MVSinkError(f"version {version} records no commitInfo: whose commit it is cannot be told")
    return str(entry.get(record.ATTEMPT, ""))


def commit_info(log_files: LogFiles, version: int) -> dict[str, Any] | None:
    """The commit info of version ``version``, read from its own log file, with ``version``
    set and mvsink's commit metadata at the top level whichever engine wrote it (delta-rs
    writes it there, the JVM Delta into the commit's ``tags``); ``{"version": n}`` for a commit
    without one; None if the log holds no such file.

    Never through delta-rs's ``DeltaTable.history``: it lists the log's files past the version
    the table was loaded at and numbers them counting down from that version, so a commit that
    lands between the load and the listing shifts every number (delta-rs 1.6; the chaos run
    found metrics rows, and would have found commit outcomes, read off the wrong version)."""
    raw = log_files.get(_log_file(version))
    if raw is None:
        return None
    for line in raw.to_pybytes().decode().splitlines():
        # Only the commitInfo line is parsed: a commit of many files has megabytes of others.
        if '"commitInfo"' not in line[:32]:
            continue
        info = json.loads(line).get("commitInfo")
        if isinstance(info, dict):
            tags = info.get("tags")
            if isinstance(tags, dict):
                info = {**record.tags(tags), **info}
            return {**info, "version": version}
    return {"version": version}


def log_actions(log_files: LogFiles, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version``, in log order, from its own log file; None if the
    log holds no such file."""
    raw = log_files.get(_log_file(version))
    if raw is None:
        return None
    return [json.loads(line) for line in raw.to_pybytes().decode().splitlines() if line.strip()]


def unique_id(descriptor: Mapping[str, Any] | None) -> str | None:
    """The descriptor's ``uniqueId`` (PROTOCOL.md): with the path, what tells two versions of a
    data file apart."""
    if not descriptor:
        return None
    base = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    offset = descriptor.get("offset")
    return base if offset is None else f"{base}@{offset}"


def _log_file(version: int) -> str:
    return f"_delta_log/{version:020}.json"


def history(log_files: LogFiles, newest: int, limit: int) -> list[dict[str, Any]]:
    """The commit infos (``commit_info``) of versions ``newest`` down to ``newest - limit +
    1``, newest first; versions whose file is gone (log cleanup) are left out."""
    commits = (commit_info(log_files, v) for v in range(newest, max(newest - limit, -1), -1))
    return [c for c in commits if c is not None]


ADD_FIELDS = (
    "path",
    "partitionValues",
    "size",
    "modificationTime",
    "dataChange",
    "stats",
    "tags",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
    "clusteringProvider",
)
"""An add action's fields in the protocol (a writer may record more, the JVM's ``AddFile``
has internal ones)."""
REPLAYED = 48
"""The most commit files ``Adds.at`` reads to carry a table's adds forward (a read each); past
that, the caller loads the version's whole state another way (one Spark job)."""


@dataclass(frozen=True)
class Adds:
    """The add actions of one version of a table, by path (``ADD_FIELDS`` of each, as its log
    holds them): what removing a file, or adding it again with another deletion vector, must
    repeat, and each file's deletion vector. Kept from epoch to epoch and carried forward
    through the commit files in between, so a version's state is not computed anew each time
    (a Spark job over the whole table's state through the JVM, 0.6 s at 10M rows)."""

    version: int
    by_path: Mapping[str, Mapping[str, Any]]

    @classmethod
    def empty(cls) -> Adds:
        """A table before its first commit (carried forward from there: read from version 0)."""
        return cls(-1, {})

    def at(self, log_files: LogFiles, version: int) -> Adds | None:
        """These adds as of ``version``, carried forward through commits after this one's,
        each from its own file: in each, its removes, then its adds (a file whose deletion
        vector changes is removed and added in one commit). None when that cannot be known
        here: ``version`` is older, is more than ``REPLAYED`` commits on, or a commit file
        is gone (log cleanup)."""
        if version < self.version or version - self.version > REPLAYED:
            return None
        if version == self.version:
            return self
        files = dict(self.by_path)
        for v in range(self.version + 1, version + 1):
            actions = log_actions(log_files, v)
            if actions is None:
                return None
            for action in actions:
                # A file is its path and its vector (PROTOCOL.md): a remove of another
                # vector of the path leaves the one held.
                gone = action.get("remove")
                if gone is None or gone["path"] not in files:
                    continue
                held = files[gone["path"]].get("deletionVector")
                if unique_id(held) == unique_id(gone.get("deletionVector")):
                    del files[gone["path"]]
            for action in actions:
                if "add" in action:
                    add = action["add"]
                    files[add["path"]] = {k: add[k] for k in ADD_FIELDS if add.get(k) is not None}
        return Adds(version, files)

    def vectors(self) -> dict[str, Mapping[str, Any]]:
        """The deletion vectors of the files that have one, by path."""
        return {p: a["deletionVector"] for p, a in self.by_path.items() if a.get("deletionVector")}

    def totals(self) -> tuple[int, int]:
        """The version's number of files and their total size (to check against another reader)."""
        return len(self.by_path), sum(int(a["size"]) for a in self.by_path.values())

    def checksum_problem(self, log_files: LogFiles) -> str | None:
        """How these adds differ from what the version's checksum file (``.crc``, which the
        JVM Delta writes with each commit) says of it: its files, bytes, deletion vectors and
        rows they drop; None when they agree, or there is no such file to ask."""
        raw = log_files.get(f"_delta_log/{self.version:020}.crc")
        if raw is None:
            return None
        try:
            crc = json.loads(raw.to_pybytes())
        except ValueError:
            return None
        vectors = self.vectors()
        mine = {
            "numFiles": len(self.by_path),
            "tableSizeBytes": self.totals()[1],
            "numDeletionVectorsOpt": len(vectors),
            "numDeletedRecordsOpt": sum(int(v.get("cardinality", 0)) for v in vectors.values()),
        }
        differ = {k: (crc[k], v) for k, v in mine.items() if isinstance(crc.get(k), int) and crc[k] != v}
        if not differ:
            return None
        return ", ".join(f"{k} {said} in its checksum, {ours} read" for k, (said, ours) in differ.items())
