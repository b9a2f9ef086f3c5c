"""Deletion vectors as Delta stores them (PROTOCOL.md), read and written by mvsink's own codec:
what Spark's Delta writes is read in tests/interop, what mvsink writes Spark reads there."""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np
import pytest

from mvsink.table import deletion_vectors as dv
from mvsink.table.delta import unique_id
from mvsink.table.storage import Store


def test_the_protocols_example_descriptor_names_its_file():
    """PROTOCOL.md, "JSON Example 1": a two-character prefix, then the uuid in Z85."""
    found = dv.file_path({"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^"})
    assert found == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert dv.z85_encode(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"


@pytest.mark.parametrize(
    "positions",
    [
        np.array([], dtype=np.int64),
        np.array([0]),
        np.array([3, 4, 7, 11, 18, 29]),
        np.arange(0, 70_000, 2),  # bitmap containers (more than 4096 values in 65536)
        np.arange(65_530, 65_540),  # across two containers
        np.array([5, (1 << 32) + 1, (3 << 32) + 7]),  # three 32-bit buckets
        np.unique(np.random.default_rng(7).integers(0, 1 << 36, 20_000)),
    ],
    ids=["empty", "one", "few", "dense", "container-edge", "buckets", "random"],
)
def test_a_vector_reads_back_as_the_positions_written(positions):
    data = dv.serialize(positions)
    assert struct.unpack_from("<I", data)[0] == dv.MAGIC
    assert np.array_equal(dv.deserialize(data), np.sort(positions))


def test_run_containers_and_the_native_layout_are_read():
    """Serializers other than mvsink's (Java's RoaringBitmap after runOptimize, Delta's older
    native layout) write run containers and another array header."""
    # A 32-bit bitmap with one run container (values 10..19) and one array container (70000).
    runs = struct.pack("<I", 12347 | (1 << 16))  # cookie with runs, 2 containers
    runs += bytes([0b01])  # container 0 is a run container
    runs += struct.pack("<HHHH", 0, 9, 1, 0)  # keys and cardinalities - 1
    runs += struct.pack("<HHH", 1, 10, 9)  # one run: start 10, length 10
    runs += struct.pack("<H", 70000 - 65536)
    portable = struct.pack("<IQI", dv.MAGIC, 1, 0) + runs
    assert dv.deserialize(portable).tolist() == [*range(10, 20), 70000]
    native = struct.pack("<III", dv.MAGIC - 1, 1, len(runs)) + runs
    assert dv.deserialize(native).tolist() == [*range(10, 20), 70000]


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b"\0\0\0\0" + b[4:],  # not a deletion vector
        lambda b: b[:-3],  # cut short
        lambda b: b + b"\0",  # trailing bytes
    ],
    ids=["magic", "truncated", "trailing"],
)
def test_damaged_bytes_are_an_error_never_other_positions(damage):
    with pytest.raises(dv.CorruptDeletionVector):
        dv.deserialize(damage(dv.serialize(np.array([1, 2, 3, 100_000]))))


def test_a_vector_file_is_checked_against_its_descriptor(tmp_path):
    """One file holds several vectors, each at its offset with its size and CRC-32; a wrong
    checksum or cardinality is an error."""
    store = Store(str(tmp_path))
    vectors = [np.array([1, 5]), np.arange(0, 9000, 3), np.array([1 << 33])]
    descriptors = dv.write(store, "mvsink-v-e1-abc", vectors)
    paths = {dv.file_path(d) for d in descriptors}
    assert len(paths) == 1 and next(iter(paths)).startswith("mvsink-v-e1-abc/deletion_vector_")
    for d, want in zip(descriptors, vectors, strict=True):
        assert np.array_equal(dv.read(store, d), want)
        assert unique_id(d) == f"u{d['pathOrInlineDv']}@{d['offset']}"
    raw = (tmp_path / next(iter(paths))).read_bytes()
    assert raw[0] == 1 and struct.unpack_from(">I", raw, 1)[0] == descriptors[0]["sizeInBytes"]
    assert (
        zlib.crc32(raw[5 : 5 + descriptors[0]["sizeInBytes"]])
        == struct.unpack_from(">I", raw, 5 + descriptors[0]["sizeInBytes"])[0]
    )
    with pytest.raises(dv.CorruptDeletionVector, match="says 3"):
        dv.read(store, {**descriptors[0], "cardinality": 3})
    damaged = bytearray(raw)
    damaged[8] ^= 0xFF
    (tmp_path / next(iter(paths))).write_bytes(bytes(damaged))
    with pytest.raises(dv.CorruptDeletionVector, match="checksum"):
        dv.read(store, descriptors[0])


def test_an_inline_vector_is_read_from_the_descriptor():
    data = dv.serialize(np.array([2, 9]))
    descriptor = {
        "storageType": "i",
        "pathOrInlineDv": dv.z85_encode(data),
        "sizeInBytes": len(data),
        "cardinality": 2,
    }
    assert dv.read(Store("/nonexistent"), descriptor).tolist() == [2, 9]
    assert unique_id(descriptor) == "i" + descriptor["pathOrInlineDv"]
