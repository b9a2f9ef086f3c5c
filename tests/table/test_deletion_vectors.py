"""Deletion vectors as Delta stores them (PROTOCOL.md), read and written by mvsink (through
pyroaring): what Spark's Delta writes is read in tests/interop and below (bytes the JVM Delta
wrote), what mvsink writes Spark reads there."""

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


# Written by delta-spark 4.4's DELETE on a table of one file of 2M rows (bench/dv_codec.py
# --make-delta-tables): "id = 123457" (an array container) and "id BETWEEN 100000 AND 899999"
# (run containers), magic number first.
JVM_ONE = bytes.fromhex("d1d339640100000000000000000000003a30000001000000010000001000000041e2")
JVM_BLOCK = bytes.fromhex(
    "d1d339640100000000000000000000003b300c00ff1f01005f790200ffff0300ffff0400ffff0500ffff0600ffff"
    "0700ffff0800ffff0900ffff0a00ffff0b00ffff0c00ffff0d009fbb6e000000740000007a00000080000000860000"
    "008c00000092000000980000009e000000a4000000aa000000b0000000b60000000100a0865f7901000000ffff0100"
    "0000ffff01000000ffff01000000ffff01000000ffff01000000ffff01000000ffff01000000ffff01000000ffff01"
    "000000ffff01000000ffff010000009fbb"
)


@pytest.mark.parametrize(
    ("data", "positions"),
    [(JVM_ONE, np.array([123457])), (JVM_BLOCK, np.arange(100_000, 900_000))],
    ids=["array", "runs"],
)
def test_the_jvm_deltas_vectors_are_read_and_written_byte_for_byte(data, positions):
    """mvsink reads what the JVM Delta writes, and writes the same bytes for the same rows
    (run containers for a block of rows, as the JVM does: 204 bytes, not 100 KB of bitmaps)."""
    assert np.array_equal(dv.deserialize(data), positions)
    assert dv.serialize(positions) == data


def test_repeats_are_one_position_and_negative_ones_an_error(tmp_path):
    positions = np.array([9, 3, 9, 3, 1 << 40])
    assert dv.deserialize(dv.serialize(positions)).tolist() == [3, 9, 1 << 40]
    (descriptor,) = dv.write(Store(str(tmp_path)), "mvsink-v-e1-abc", [positions])
    assert descriptor["cardinality"] == 3
    with pytest.raises(dv.InvariantViolation, match="not negative"):
        dv.serialize(np.array([4, -1]))


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


def _one_container(card_less_one: int, body: bytes) -> bytes:
    """A vector of one bucket holding one container (key 0) with the header and body given."""
    header = struct.pack("<IIHHI", 12346, 1, 0, card_less_one, 16)
    return struct.pack("<IQI", dv.MAGIC, 1, 0) + header + body


@pytest.mark.parametrize(
    "data",
    [
        _one_container(2, struct.pack("<HHH", 5, 3, 3)),  # an array container out of order
        _one_container(8999, np.packbits(np.arange(1 << 16) % 8 == 0, bitorder="little").tobytes()),
        JVM_BLOCK[:-1],
        JVM_BLOCK + b"\0",
    ],
    ids=["unsorted", "cardinality", "truncated-run", "trailing-run"],
)
def test_a_vector_that_contradicts_itself_is_an_error(data):
    """A container's values out of order, or its header's cardinality not its values': bytes
    no Roaring writer makes, refused rather than read as some positions."""
    with pytest.raises(dv.CorruptDeletionVector):
        dv.deserialize(data)


def test_every_cut_of_a_vector_is_an_error():
    data = dv.serialize(np.array([*range(10, 20), 70_000, *range(0, 1 << 17, 7), 1 << 33]))
    for end in [*range(64), *range(64, len(data), 251), len(data) - 1]:  # headers, then bodies
        with pytest.raises(dv.CorruptDeletionVector):
            dv.deserialize(data[:end])


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
