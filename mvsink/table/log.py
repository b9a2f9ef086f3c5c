"""The Delta log's commit files, read directly from storage: one version's actions and its
commit info (with mvsink's metadata, ``record.py``, at the top level whichever engine wrote
it), and a view's recent history."""

from __future__ import annotations

import json
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


def _log_file(version: int) -> str:
    return f"_delta_log/{version:020}.json"


def history(log_files: LogFiles, newest: int, limit: int) -> list[dict[str, Any]]:
    """The commit infos (``commit_info``) of versions ``newest`` down to ``newest - limit +
    1``, newest first; versions whose file is gone (log cleanup) are left out."""
    commits = (commit_info(log_files, v) for v in range(newest, max(newest - limit, -1), -1))
    return [c for c in commits if c is not None]
