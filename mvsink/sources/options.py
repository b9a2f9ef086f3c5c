"""The options of the ``mvsink-delta`` source, checked once, before anything is read.

Every option is validated here (``parse``), and a name the source does not know is a
``ConfigError`` rather than a storage option: a misspelt ``maxVersionPerTrigger`` would
otherwise reach the object store, be ignored there, and leave the stream unbounded.

Storage options (the keys delta-rs documents, as in the sink's ``storage_options``) are given
with the prefix ``storage.`` (``storage.AWS_REGION``). The way documented before the prefix
existed, a bare key, keeps working for the keys of the three clouds' stores (names starting
``AWS_``, ``AZURE_`` or ``GOOGLE_``); any other storage key needs the prefix.

Spark hands a source its options with lower-cased names (``CaseInsensitiveDict``); messages
name them as documented (``maxVersionsPerTrigger``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mvsink.errors import ConfigError
from mvsink.table.uris import table_root

NAME = "mvsink-delta"
MODES = ("appends", "changes")
REWRITE_ROWS_PER_TASK = 20_000_000
"""Rows whose fingerprints one task of the change feed holds, if it can (``reader._Rewrite``)."""
STORAGE_PREFIX = "storage."
BARE_STORAGE_PREFIXES = ("aws_", "azure_", "google_")
"""Bare option names taken as storage options (the documented way before ``storage.``)."""

OPTIONS = (
    "path",
    "mode",
    "startingVersion",
    "startingSnapshot",
    "maxVersionsPerTrigger",
    "rewriteRowsPerTask",
)
_SPELLED = {name.lower(): name for name in OPTIONS}
_INTEGER = re.compile(r"[+-]?\d+")

Latest = Literal["latest"]


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, valid (``parse``)."""

    root: str
    """The table's root (``table_root`` of option ``path``)."""
    mode: Literal["appends", "changes"] = "appends"
    """What each version yields: the rows it appends, or its exact inserts and retractions."""
    starting_version: int | Latest | None = None
    """Read the versions from this one on (``latest``: those after the latest at the start)."""
    starting_snapshot: int | Latest | None = None
    """Read the table as of this version in the first batch, then the versions after it."""
    max_versions_per_trigger: int | None = None
    """At most this many versions a batch (at least 1); None: all available."""
    rewrite_rows_per_task: int = REWRITE_ROWS_PER_TASK
    """Rows whose fingerprints one task of the change feed holds (at least 1)."""
    storage: Mapping[str, str] = field(default_factory=dict)
    """What delta-rs and the file system get as ``storage_options``."""


def parse(options: Mapping[str, Any]) -> SourceOptions:
    """The source's options, checked: a ``ConfigError`` names the first option that is wrong."""
    own: dict[str, str] = {}
    storage: dict[str, str] = {}
    for key, value in options.items():
        low = str(key).lower()
        if low in _SPELLED:
            own[_SPELLED[low]] = str(value)
        elif low.startswith(STORAGE_PREFIX) and len(low) > len(STORAGE_PREFIX):
            storage[str(key)[len(STORAGE_PREFIX) :]] = str(value)
        elif low.startswith(BARE_STORAGE_PREFIXES):
            storage.setdefault(str(key), str(value))
        else:
            raise ConfigError(
                f"the {NAME} source has no option {key!r}: its options are {', '.join(OPTIONS)}; "
                f"pass a storage option as '{STORAGE_PREFIX}<key>' (e.g. '{STORAGE_PREFIX}timeout')"
            )
    path = own.get("path")
    if not path:
        raise ConfigError(f"the {NAME} source needs option 'path' (the Delta table)")
    mode = own.get("mode", "appends").lower()
    if mode not in MODES:
        raise ConfigError(f"the {NAME} source's option 'mode' is one of {MODES}, not {own['mode']!r}")
    starting_version = _version(own, "startingVersion")
    starting_snapshot = _version(own, "startingSnapshot")
    if starting_version is not None and starting_snapshot is not None:
        raise ConfigError(
            f"the {NAME} source takes 'startingVersion' (read versions from there) or "
            "'startingSnapshot' (read the table as of a version, then the versions after it), "
            "not both"
        )
    limit = _positive(own, "maxVersionsPerTrigger", "number of versions")
    per_task = _positive(own, "rewriteRowsPerTask", "number of rows")
    return SourceOptions(
        root=table_root(path),
        mode="changes" if mode == "changes" else "appends",
        starting_version=starting_version,
        starting_snapshot=starting_snapshot,
        max_versions_per_trigger=limit,
        rewrite_rows_per_task=REWRITE_ROWS_PER_TASK if per_task is None else per_task,
        storage=storage,
    )


def _version(own: Mapping[str, str], name: str) -> int | Latest | None:
    """A Delta version (an integer, at least 0) or ``latest``."""
    value = own.get(name)
    if value is None:
        return None
    text = value.strip()
    if text.lower() == "latest":
        return "latest"
    if not _INTEGER.fullmatch(text) or int(text) < 0:
        raise ConfigError(
            f"the {NAME} source's option {name!r} is a Delta version (an integer, 0 or more) "
            f"or 'latest', not {value!r}"
        )
    return int(text)


def _positive(own: Mapping[str, str], name: str, what: str) -> int | None:
    value = own.get(name)
    if value is None:
        return None
    if not _INTEGER.fullmatch(value.strip()) or int(value) < 1:
        raise ConfigError(f"the {NAME} source's option {name!r} is a positive {what}, not {value!r}")
    return int(value)
