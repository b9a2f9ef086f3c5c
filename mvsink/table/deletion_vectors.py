"""Deletion vectors: the rows of a data file that a version of the table no longer holds.

Delta's format (PROTOCOL.md, "Deletion Vectors" and "Deletion Vector Format"), read and
written here with numpy, so that the same code runs on the driver and in Spark tasks, on any
store a ``Store`` reaches, whichever engine commits:

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

import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs

from mvsink.errors import CorruptDeletionVector, InvariantViolation
from mvsink.table.delta import NewFile

I64 = npt.NDArray[np.int64]


class Store(Protocol):
    """What this module needs of the table's store (``storage.Store``, which reads deletion
    vectors through this module: hence a protocol, not an import)."""

    @property
    def root(self) -> str: ...

    @property
    def fs(self) -> pafs.FileSystem: ...

    def put(self, path: str, data: bytes) -> None: ...


MAGIC = 1681511377
_FORMAT_VERSION = 1
_COOKIE = 12346  # a 32-bit Roaring bitmap without run containers
_COOKIE_RUNS = 12347  # ... with run containers (low 16 bits; the high ones hold size - 1)
_ARRAY_MAX = 4096  # a container of more values is a bitmap
_NO_OFFSETS = 4  # with run containers, fewer containers than this have no offset header
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
    """The deletion vector of ``positions`` (distinct, non-negative, any order), magic number
    first: a portable 64-bit Roaring bitmap of array and bitmap containers."""
    values = np.unique(np.asarray(positions, dtype=np.int64))
    if len(values) and values[0] < 0:
        raise InvariantViolation("a deletion vector holds row positions, which are not negative")
    values = values.astype(np.uint64)
    out = [struct.pack("<I", MAGIC)]
    highs, starts = np.unique(values >> np.uint64(32), return_index=True)
    out.append(struct.pack("<Q", len(highs)))
    bounds = [*starts.tolist(), len(values)]
    for i, high in enumerate(highs.tolist()):
        out.append(struct.pack("<I", high))
        low = values[bounds[i] : bounds[i + 1]] & np.uint64(0xFFFFFFFF)
        out.append(_serialize32(low.astype(np.uint32)))
    return b"".join(out)


def _serialize32(values: npt.NDArray[np.uint32]) -> bytes:
    keys, starts = np.unique(values >> np.uint32(16), return_index=True)
    bounds = [*starts.tolist(), len(values)]
    containers = []
    for i in range(len(keys)):
        low = (values[bounds[i] : bounds[i + 1]] & np.uint32(0xFFFF)).astype("<u2")
        if len(low) <= _ARRAY_MAX:
            containers.append(low.tobytes())
        else:
            bits = np.zeros(1 << 16, dtype=bool)
            bits[low] = True
            containers.append(np.packbits(bits, bitorder="little").tobytes())
    header = [struct.pack("<II", _COOKIE, len(keys))]
    header += [struct.pack("<HH", int(k), bounds[i + 1] - bounds[i] - 1) for i, k in enumerate(keys.tolist())]
    offset = 8 + 8 * len(keys)
    for body in containers:
        header.append(struct.pack("<I", offset))
        offset += len(body)
    return b"".join(header + containers)


def deserialize(data: bytes) -> I64:
    """The row positions a deletion vector's bytes (magic number first) hold, sorted. Also
    reads Delta's older native layout (``MAGIC - 1``: a 4-byte count of buckets, each a 4-byte
    size and a 32-bit bitmap, keyed by position)."""
    view = memoryview(data)
    magic = struct.unpack_from("<I", view)[0] if len(view) >= 8 else None
    if magic not in (MAGIC, MAGIC - 1):
        raise CorruptDeletionVector("the bytes do not start with a deletion vector's magic number")
    native = magic == MAGIC - 1
    try:
        (buckets,) = struct.unpack_from("<I" if native else "<Q", view, 4)
    except struct.error:
        raise CorruptDeletionVector("a truncated deletion vector") from None
    at, parts = 8 if native else 12, []
    for bucket in range(buckets):
        try:
            (head,) = struct.unpack_from("<I", view, at)
        except struct.error:
            raise CorruptDeletionVector("a truncated deletion vector") from None
        high = bucket if native else head
        low, end = _deserialize32(view, at + 4)
        if native and end != at + 4 + head:
            raise CorruptDeletionVector(f"a bucket of {end - at - 4} bytes where its header says {head}")
        at = end
        parts.append((np.uint64(high) << np.uint64(32)) | low.astype(np.uint64))
    if at != len(view):
        raise CorruptDeletionVector(f"{len(view) - at} bytes after the deletion vector's last bucket")
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts).astype(np.int64)


def _deserialize32(view: memoryview, at: int) -> tuple[npt.NDArray[np.uint32], int]:
    """A standard 32-bit Roaring bitmap starting at ``at``: its values, and where it ends."""
    try:
        (cookie,) = struct.unpack_from("<I", view, at)
        if cookie & 0xFFFF == _COOKIE_RUNS:
            size = (cookie >> 16) + 1
            flags = np.unpackbits(np.frombuffer(view, np.uint8, (size + 7) // 8, at + 4), bitorder="little")
            at += 4 + (size + 7) // 8
            runs = flags[:size].astype(bool)
        elif cookie == _COOKIE:
            (size,) = struct.unpack_from("<I", view, at + 4)
            at += 8
            runs = np.zeros(size, dtype=bool)
        else:
            raise CorruptDeletionVector(f"a Roaring bitmap with the unknown cookie {cookie}")
        header = np.frombuffer(view, "<u2", 2 * size, at).reshape(size, 2).astype(np.uint32)
        at += 4 * size
        if cookie == _COOKIE or size >= _NO_OFFSETS:
            at += 4 * size  # container offsets: the containers follow in order anyway
        parts = []
        for (key, card_less_one), run in zip(header.tolist(), runs.tolist(), strict=True):
            if run:
                (count,) = struct.unpack_from("<H", view, at)
                pairs = np.frombuffer(view, "<u2", 2 * count, at + 2).reshape(count, 2).astype(np.uint32)
                at += 2 + 4 * count
                lengths = pairs[:, 1].astype(np.int64) + 1
                offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
                    np.cumsum(lengths) - lengths, lengths
                )
                low = (np.repeat(pairs[:, 0].astype(np.int64), lengths) + offsets).astype(np.uint32)
            elif card_less_one < _ARRAY_MAX:
                low = np.frombuffer(view, "<u2", card_less_one + 1, at).astype(np.uint32)
                at += 2 * (card_less_one + 1)
            else:
                bits = np.unpackbits(np.frombuffer(view, np.uint8, 8192, at), bitorder="little")
                low = np.flatnonzero(bits).astype(np.uint32)
                at += 8192
            parts.append((np.uint32(key) << np.uint32(16)) | low)
    except (struct.error, ValueError) as exc:
        raise CorruptDeletionVector(f"a truncated Roaring bitmap ({exc})") from None
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    return values, at


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
        data = serialize(positions)
        chunks += [struct.pack(">I", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": folder + z85_encode(name.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": len(np.unique(positions)),
            }
        )
        offset += 8 + len(data)
    if descriptors:
        store.put(file_path(descriptors[0]), b"".join(chunks))
    return descriptors
