"""Deletion vectors: the rows of a data file that a version of the table no longer holds.

Delta's format (PROTOCOL.md, "Deletion Vectors" and "Deletion Vector Format"), read and
written here with pyroaring (CRoaring, whose portable 64-bit format is Delta's), so that the same
code runs on the driver and in Spark tasks (pyroaring is a dependency: workers have it where they
have mvsink), on any store a ``Store`` reaches, whichever engine commits:

* a deletion vector is a set of row positions in a data file (its physical rows, from 0): a
  64-bit Roaring bitmap in the portable serialization (a count of 32-bit buckets, then each
  bucket's high 32 bits and a standard 32-bit Roaring bitmap), after the magic number
  1681511377, all little-endian;
* its descriptor (``deletionVector`` of an add or remove) says where it is: inline in the log
  (``storageType`` ``i``: the bytes in Z85), or in a file at ``offset`` holding a 4-byte
  big-endian size, the bytes and their CRC-32; the file is ``<prefix>/deletion_vector_<uuid>.bin``
  under the table root (``u``: the prefix, then the uuid's 16 bytes in Z85) or an absolute path
  (``p``). A deletion-vector file starts with the format version byte 1.

mvsink writes one file per attempt folder (or per Spark task), named by ``u`` descriptors
whose prefix is the attempt's folder: a failed attempt's vectors go with its folder.
"""

from __future__ import annotations

import array
import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs
from pyroaring import BitMap, BitMap64

from mvsink.errors import CorruptDeletionVector, InvariantViolation
from mvsink.table.delta import NewFile

I64 = npt.NDArray[np.int64]
_Bitmap = TypeVar("_Bitmap", BitMap, BitMap64)


class Store(Protocol):
    """What this module needs of the table's store (``storage.Store``, which reads deletion
    vectors through this module: hence a protocol, not an import)."""

    @property
    def root(self) -> str: ...

    @property
    def fs(self) -> pafs.FileSystem: ...

    def put(self, path: str, data: bytes) -> None: ...


MAGIC = 1681511377
_MAGIC = struct.pack("<I", MAGIC)
_FORMAT_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_UUID_CHARS = 20


# --- Z85 -------------------------------------------------------------------------------------


def z85_encode(data: bytes) -> str:
    """Z85 of ``data``, zero-padded to a multiple of 4 bytes (as Delta pads inline vectors)."""
    data += b"\0" * (-len(data) % 4)
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, rest = divmod(word, 85)
            chars.append(_Z85[rest])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes ``text`` encodes (a multiple of 4; callers cut the padding off)."""
    if len(text) % 5:
        raise CorruptDeletionVector(f"a Z85 string of {len(text)} characters (not a multiple of 5)")
    words = []
    for start in range(0, len(text), 5):
        word = 0
        for char in text[start : start + 5]:
            if char not in _Z85_VALUE:
                raise CorruptDeletionVector(f"{char!r} is not a Z85 character")
            word = word * 85 + _Z85_VALUE[char]
        if word > 0xFFFFFFFF:
            raise CorruptDeletionVector(f"{text[start : start + 5]!r} is past 32 bits")
        words.append(word)
    return struct.pack(f">{len(words)}I", *words)


# --- the bitmap ------------------------------------------------------------------------------


def serialize(positions: I64) -> bytes:
    """The deletion vector of ``positions`` (non-negative, any order, repeats ignored), magic
    number first: a portable 64-bit Roaring bitmap, byte for byte as the JVM Delta writes it
    (run containers where they are smaller)."""
    return _serialize(positions)[0]


def _serialize(positions: I64) -> tuple[bytes, int]:
    """``serialize(positions)``, and how many positions it holds."""
    values = np.sort(np.asarray(positions, dtype=np.int64))
    if len(values) and values[0] < 0:
        raise InvariantViolation("a deletion vector holds row positions, which are not negative")
    # One 32-bit bitmap per bucket of the high 32 bits, framed as the 64-bit format frames them:
    # CRoaring fills a 32-bit bitmap from sorted values two to four times faster than a 64-bit
    # one, and serializes it to the same bytes.
    cuts = np.flatnonzero(np.diff(values >> 32)) + 1
    buckets = np.split(values, cuts) if len(values) else []
    out, count = [_MAGIC, struct.pack("<Q", len(buckets))], 0
    for bucket in buckets:
        low = array.array("I")
        low.frombytes((bucket & 0xFFFFFFFF).astype(np.uint32).data.cast("B"))
        bitmap = BitMap(low)
        out += [struct.pack("<I", int(bucket[0]) >> 32), bitmap.serialize()]
        count += len(bitmap)
    return b"".join(out), count


def deserialize(data: bytes) -> I64:
    """The row positions a deletion vector's bytes (magic number first) hold, sorted. Also
    reads Delta's older native layout (``MAGIC - 1``: a 4-byte count of buckets, each a 4-byte
    size and a 32-bit bitmap, keyed by position)."""
    magic = struct.unpack_from("<I", data)[0] if len(data) >= 8 else None
    if magic == MAGIC:
        return np.frombuffer(_whole(BitMap64, data[4:]).to_array(), dtype=np.int64)
    if magic != MAGIC - 1:
        raise CorruptDeletionVector("the bytes do not start with a deletion vector's magic number")
    (buckets,) = struct.unpack_from("<I", data, 4)
    at, parts = 8, [np.zeros(0, dtype=np.int64)]
    for high in range(buckets):
        if at + 4 > len(data):
            raise CorruptDeletionVector("a truncated deletion vector")
        (size,) = struct.unpack_from("<I", data, at)
        if at + 4 + size > len(data):
            raise CorruptDeletionVector(f"a bucket of {size} bytes past the deletion vector's end")
        low = np.frombuffer(_whole(BitMap, data[at + 4 : at + 4 + size]).to_array(), dtype=np.uint32)
        parts.append((high << 32) | low.astype(np.int64))
        at += 4 + size
    if at != len(data):
        raise CorruptDeletionVector(f"{len(data) - at} bytes after the deletion vector's last bucket")
    return np.concatenate(parts)


def _whole(kind: type[_Bitmap], data: bytes) -> _Bitmap:
    """The bitmap ``data`` holds, which must end where ``data`` ends. pyroaring checks the bytes
    it reads (bounds, sorted containers, cardinalities) but stops at the bitmap's end, saying
    nothing of bytes after it; a bitmap still read without the last byte had bytes after it."""
    try:
        bitmap = kind.deserialize(data)
    except (ValueError, IndexError) as exc:
        raise CorruptDeletionVector(f"a truncated or damaged Roaring bitmap ({exc})") from None
    try:
        kind.deserialize(data[:-1])
    except (ValueError, IndexError):
        return bitmap
    raise CorruptDeletionVector("bytes after the deletion vector's last bucket")


# --- descriptors and files -------------------------------------------------------------------


def file_path(descriptor: Mapping[str, Any]) -> str:
    """Where an on-disk deletion vector lives: relative to the table root (``u``) or absolute
    (``p``)."""
    kind, text = descriptor["storageType"], str(descriptor["pathOrInlineDv"])
    if kind == "p":
        return text
    if kind != "u" or len(text) < _UUID_CHARS:
        raise CorruptDeletionVector(f"no file for a deletion vector stored as {kind!r}")
    prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def _under(root: str, path: str, kind: str) -> str:
    """``path`` relative to the table ``root`` (``p`` descriptors give it absolute)."""
    if kind == "u":
        return path
    from urllib.parse import unquote, urlparse

    parsed = urlparse(path)
    full = (
        unquote(parsed.path)
        if parsed.scheme in ("", "file")
        else f"{parsed.scheme}://{parsed.netloc}{parsed.path}"
    )
    base = root.rstrip("/") + "/"
    if not full.startswith(base):
        raise CorruptDeletionVector(f"a deletion vector at {path}, outside the table at {root}")
    return full[len(base) :]


def vector_files(descriptors: Iterable[Mapping[str, Any] | None]) -> list[NewFile]:
    """The files that hold on-disk ``descriptors`` (``u``), each with the size it must have at
    least: what a commit referencing them needs in storage."""
    sizes: dict[str, int] = {}
    for d in descriptors:
        if d and d["storageType"] == "u":
            path = file_path(d)
            end = int(d.get("offset") or 0) + 8 + int(d["sizeInBytes"])
            sizes[path] = max(sizes.get(path, 0), end)
    return [NewFile(path, size, 0, "") for path, size in sizes.items()]


def read(store: Store, descriptor: Mapping[str, Any]) -> I64:
    """The row positions ``descriptor`` marks deleted, sorted; checked against its size,
    checksum and cardinality."""
    size = int(descriptor["sizeInBytes"])
    if descriptor["storageType"] == "i":
        data = z85_decode(str(descriptor["pathOrInlineDv"]))[:size]
    else:
        offset = int(descriptor.get("offset") or 0)
        path = _under(store.root, file_path(descriptor), descriptor["storageType"])
        with store.fs.open_input_file(path) as fh:
            fh.seek(offset)
            raw = fh.read(size + 8)
        if len(raw) != size + 8:
            raise CorruptDeletionVector(f"{path} ends inside its deletion vector at offset {offset}")
        (stored,) = struct.unpack_from(">I", raw)
        data = bytes(raw[4 : 4 + size])
        (checksum,) = struct.unpack_from(">I", raw, 4 + size)
        if stored != size or zlib.crc32(data) != checksum:
            raise CorruptDeletionVector(f"the deletion vector in {path} at {offset} fails its checksum")
    positions = deserialize(data)
    if len(positions) != int(descriptor["cardinality"]):
        raise CorruptDeletionVector(
            f"a deletion vector holds {len(positions)} positions where its descriptor says "
            f"{descriptor['cardinality']}"
        )
    return positions


def write(store: Store, folder: str, vectors: Sequence[I64]) -> list[dict[str, Any]]:
    """Write ``vectors`` (row positions, one set per data file) as one deletion-vector file under
    ``folder`` (a single path segment under the root); their descriptors, in order."""
    if "/" in folder or not folder:
        raise InvariantViolation(f"deletion vectors go in a folder at the table root, not {folder!r}")
    name = uuid.uuid4()
    chunks, descriptors, offset = [bytes([_FORMAT_VERSION])], [], 1
    for positions in vectors:
        data, cardinality = _serialize(positions)
        chunks += [struct.pack(">I", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": folder + z85_encode(name.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": cardinality,
            }
        )
        offset += 8 + len(data)
    if descriptors:
        store.put(file_path(descriptors[0]), b"".join(chunks))
    return descriptors
