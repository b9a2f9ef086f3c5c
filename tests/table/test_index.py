"""The index of the table's files' fingerprints: on the driver (``DriverIndex``)."""

from __future__ import annotations

import numpy as np
import pytest

from mvsink.table.fingerprint import Fingerprints


def test_the_index_packs_once_and_numbers_files_in_the_callers_order() -> None:
    """``DriverIndex`` packs its entries into one pair of arrays once; asked again over
    the same files in another order, or after packing ahead (``pack``), it copies nothing,
    and every row is located in its file by the caller's numbering."""
    from mvsink.table.delta import DataFile
    from mvsink.table.index import DriverIndex, FileEntry

    files = [DataFile(f"part-{k}.parquet", 10, n) for k, n in enumerate([3, 0, 2, 4])]
    index = DriverIndex()
    for k, f in enumerate(files):
        n = f.num_records or 0
        index.put(f.identity, FileEntry(np.arange(n) + 100 * k, np.arange(n) - 100 * k))

    def rows_by_file(fps: Fingerprints) -> dict[int, list[tuple[int, int, int]]]:
        file, pos = fps.locate(np.arange(len(fps)))
        out: dict[int, list[tuple[int, int, int]]] = {}
        for r in range(len(fps)):
            out.setdefault(int(file[r]), []).append((int(pos[r]), int(fps.a[r]), int(fps.b[r])))
        return {f: sorted(v) for f, v in out.items()}

    first = index.persisted(files)
    shuffled = [files[2], files[0], files[3], files[1]]
    again = index.persisted(shuffled)
    assert again.a is first.a and again.b is first.b  # not packed again
    expect = {
        k: [(p, p + 100 * j, p - 100 * j) for p in range(files[j].num_records or 0)]
        for k, j in ((0, 2), (1, 0), (2, 3))
    }
    assert rows_by_file(again) == expect
    # A commit: file 0 leaves, a new file comes; packed ahead, the next epoch copies nothing.
    index.forget([files[0].identity])
    new = DataFile("part-9.parquet", 10, 2)
    index.put(new.identity, FileEntry(np.array([7, 8]), np.array([-7, -8])))
    index.pack()
    packed = index.entry(new.identity).a.base
    after = index.persisted([new, files[3], files[2], files[1]])
    assert after.a is packed
    assert rows_by_file(after) == {0: [(0, 7, -7), (1, 8, -8)], 1: expect[2], 2: expect[0]}
    # An entry packed, forgotten and held again (other rows: not a real file's, but the index
    # must not tell): the packing goes with it.
    index.forget([new.identity])
    index.put(new.identity, FileEntry(np.array([5]), np.array([-5])))
    again = index.persisted([new, files[3], files[2], files[1]])
    assert again.a is not packed
    assert rows_by_file(again) == {0: [(0, 5, -5)], 1: expect[2], 2: expect[0]}
    with pytest.raises(ValueError, match="twice"):
        index.persisted([new, new])


def test_a_forgotten_entry_is_gone_and_clear_drops_every_entry() -> None:
    from mvsink.table.delta import DataFile
    from mvsink.table.index import DriverIndex, FileEntry

    files = [DataFile(f"part-{k}.parquet", 10, 2) for k in range(3)]
    index = DriverIndex()
    for k, f in enumerate(files):
        index.put(f.identity, FileEntry(np.array([k, k]), np.array([-k, -k])))
    index.forget([files[1].identity])
    with pytest.raises(KeyError):
        index.entry(files[1].identity)
    assert len(index.persisted([files[0], files[2]])) == 4
    index.clear()
    with pytest.raises(KeyError):
        index.entry(files[0].identity)
