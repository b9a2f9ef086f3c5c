"""Table locations: paths and object store URIs, the root a table is opened at, and when two
spellings name one folder."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlparse

REMOTE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure")
"""URI schemes whose tables live in an object store (delta-rs's, with ``storage_options``)."""


def is_local(target: str) -> bool:
    """Whether ``target`` is a local path or ``file://`` URI (not an object store URI)."""
    return urlparse(target).scheme in ("", "file")


def table_root(target: str) -> str:
    """The table root: an absolute local path for a path or ``file://`` URI, else the URI
    without its trailing slash."""
    parsed = urlparse(target)
    if parsed.scheme not in ("", "file"):
        return target.rstrip("/")
    path = unquote(parsed.path) if parsed.scheme == "file" else target
    return os.path.normpath(os.path.abspath(path)).rstrip("/") or "/"


# Spellings of one store: ``s3a://b/t`` and ``s3://b/t`` are the same table.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "abfs": "abfss", "azure": "az", "gcs": "gs"}


def location(target: str) -> tuple[str, str, str]:
    """A table location as ``(scheme, bucket or container, path)``, normalised so that two
    spellings of one folder compare equal: ``file://`` and relative paths become absolute
    local paths, ``..``, percent-escapes and repeated or trailing slashes are resolved,
    ``s3a://`` is ``s3://``, the bucket is lower-cased, and Azure's URI forms name the
    container."""
    parsed = urlparse(target)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return "file", "", table_root(target)
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    host = parsed.netloc.lower()
    if scheme in ("az", "abfss"):
        # ``az://container/...`` and ``abfss://container@account.dfs.../...`` (or .blob.):
        # compared by container, so an account-less spelling is never taken for another table.
        scheme, host = "az", host.split("@", 1)[0]
    path = posixpath.normpath("/" + unquote(parsed.path).lstrip("/"))
    return scheme, host, path.rstrip("/") or "/"


def nested(a: str, b: str) -> bool:
    """Whether one of two table locations is the other or lies inside it (in which case the
    outer table's vacuum would delete the inner table's files)."""
    x, y = location(a), location(b)
    if x[:2] != y[:2]:
        return False
    px, py = x[2].rstrip("/") + "/", y[2].rstrip("/") + "/"
    return px.startswith(py) or py.startswith(px)
