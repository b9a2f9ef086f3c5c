"""Targets given as table names: ``[catalog.][schema.]table``, resolved through Spark's catalog.

A ``target`` is a **path** when it has a URI scheme (``s3://``, ``file:``, ...), starts with
``/``, ``./`` or ``../``, or holds a path separator; anything else is a **table name**, written
as ``spark.table()`` takes it (parts separated by dots, each an identifier or backquoted).
A name is resolved through the batch's own Spark session, classic or Connect alike, at the
first epoch of each run of a query (``MVSink._locate`` says when): ``DESCRIBE DETAIL`` gives a
Delta table's location, and a table moved since (``ALTER TABLE ... SET LOCATION``) is followed.
A catalog that cannot answer is a ``CatalogUnavailable``, which keeps a location found before. A
name the catalog does not know, a view, or a table that is not Delta is a ``ConfigError``
naming it (and suggesting ``./name`` if a path was meant): never a folder made from a name.
A location is used exactly as the catalog holds it, or refused: never a neighbouring folder
(see ``_hadoop_location``).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlparse

from mvsink.errors import CatalogUnavailable, ConfigError, Where, first_line

_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)+`)"
_NAME = re.compile(rf"^{_PART}(?:\.{_PART}){{0,2}}$")


def is_path(target: str) -> bool:
    """Whether ``target`` names a location (else it is a table name). A string with a URI
    scheme or starting with ``/``, ``./`` or ``../`` is a path; otherwise one holding a
    backquote is a name (``delta.`/lake/t```, ``sales.`q1/q2```: a backquoted part may hold any
    character), and one holding a path separator is a path."""
    if target.startswith(("/", "./", "../")) or target in (".", ".."):
        return True
    if "`" not in target and urlparse(target).scheme:
        return True
    if "`" in target:
        return False
    return "/" in target or os.sep in target


def check_name(target: str) -> None:
    """Raise ``ValueError`` unless ``target`` is a path or a well-formed table name."""
    if not is_path(target) and not _NAME.match(target):
        raise ValueError(
            f"{target!r} is neither a path (a URI, or starting with '/', './' or '../') nor a table "
            "name ([catalog.][schema.]table, parts backquoted if they hold other characters)"
        )


def locate(target: str, where: Where, spark: Any = None, what: str = "target") -> str:
    """``target`` itself when it is a path, else the location of the Delta table it names in
    ``spark``'s catalog (by default the active session's): how the operations commands take
    names. Without a session, a ``ConfigError`` that says what to give instead."""
    if is_path(target):
        return target
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError(
            f"{what} {target!r} is a table name: resolving it needs a Spark session whose catalog "
            f"knows it (start one first; the CLI starts one configured by the job file's [spark] "
            f"and --conf), or give the table's path or URI ('./{target}' for a folder of that name)",
            where,
        )
    return resolve(spark, target, where, what)


def resolve(spark: Any, name: str, where: Where, what: str = "target") -> str:
    """The location of the Delta table ``name`` in ``spark``'s catalog."""
    try:
        known = bool(spark.catalog.tableExists(name))
    except Exception as exc:
        raise CatalogUnavailable(
            f"{what} {name!r}: the session's catalog cannot look it up: {first_line(exc)}", where
        ) from None
    if known and os.path.isdir(os.path.join(name, "_delta_log")):
        raise ConfigError(
            f"{what} {name!r} is both a table in the session's catalog and a Delta table in the "
            f"folder ./{name}: say which, with the table's full name or './{name}'",
            where,
        )
    if not known:
        raise ConfigError(
            f"{what} {name!r} is a table name the session's catalog does not know. Create the "
            f"table first, or give a path: './{name}' for a folder of that name.",
            where,
        )
    _refuse_view(spark, name, where, what)
    try:
        rows = spark.sql(f"DESCRIBE DETAIL {name}").collect()
    except Exception as exc:
        # Without Delta's SQL extension, DESCRIBE DETAIL t reads as DESCRIBE TABLE `DETAIL` t.
        raise CatalogUnavailable(
            f"{what} {name!r} is a table name, and resolving it needs Delta in the Spark session "
            f"(delta-spark, whose DESCRIBE DETAIL gives a table's location): {first_line(exc)}. "
            "Give the table's path or URI instead.",
            where,
        ) from None
    detail = rows[0].asDict() if rows else {}
    if str(detail.get("format", "")).lower() != "delta" or not detail.get("location"):
        raise ConfigError(
            f"{what} {name!r} is a {detail.get('format') or 'non-Delta'} table, not a Delta table: "
            "mvsink keeps Delta tables only",
            where,
        )
    return _hadoop_location(name, str(detail["location"]), where, what)


def _refuse_view(spark: Any, name: str, where: Where, what: str) -> None:
    """A ``ConfigError`` if ``name`` is a view (temporary, global temporary or persistent):
    it has no location to keep. A catalog that cannot say leaves ``DESCRIBE DETAIL`` to."""
    try:
        table = spark.catalog.getTable(name)
    except Exception:
        return
    kind = str(getattr(table, "tableType", "") or "").upper()
    if kind in ("VIEW", "TEMPORARY", "MATERIALIZED_VIEW") or getattr(table, "isTemporary", False):
        raise ConfigError(
            f"{what} {name!r} is a view, not a table ({kind.lower() or 'temporary'} in the session's "
            "catalog): mvsink keeps a Delta table. Name a Delta table, or give its path or URI.",
            where,
        )


def _hadoop_location(name: str, location: str, where: Where, what: str = "target") -> str:
    """The path or URI mvsink opens for a location as Hadoop prints it (already decoded:
    ``file:/lake/t`` on local disk, else the store's URI), character for character.

    A local location is cut after ``file:`` (and an empty or ``localhost`` authority), never
    URL-parsed: Hadoop keeps ``#`` and ``?`` as part of a path (``/lake/orders#v2``), and so do
    delta-rs and the local file system. Refused, since delta-rs would open another folder: a
    ``%`` anywhere (read as a percent-escape), and ``#`` or ``?`` in an object store URI (read
    as a URL's fragment or query, and dropped: ``s3://b/orders#v2`` would be ``s3://b/orders``)."""
    if "%" in location:
        raise ConfigError(
            f"{what} {name!r} is at {location!r}, whose percent sign delta-rs would read as a "
            "percent-escape (another folder): give the table a location without one",
            where,
        )
    if location.startswith("file:"):
        path = location.removeprefix("file:")
        if path.startswith("//"):
            host, slash, rest = path[2:].partition("/")
            path = slash + rest if host in ("", "localhost") else ""
        if not path.startswith("/"):
            raise ConfigError(f"{what} {name!r} is at {location!r}, not a local absolute path", where)
        return path
    scheme = urlparse(location).scheme
    if not scheme and not location.startswith("/"):
        raise ConfigError(f"{what} {name!r} is at {location!r}, which is not an absolute location", where)
    if scheme and ("#" in location or "?" in location):
        mark = "#" if "#" in location else "?"
        raise ConfigError(
            f"{what} {name!r} is at {location!r}, whose {mark!r} delta-rs would read as the start of "
            f"a URL's {'fragment' if mark == '#' else 'query'} and drop (another folder): give the "
            "table a location without '#' or '?'",
            where,
        )
    return location
