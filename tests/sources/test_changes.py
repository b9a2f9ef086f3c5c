"""The exact change of one commit (``mvsink.sources.changes``): which rows of the added and the
removed files carry it, decided from fingerprints alone. No Spark."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.sources.changes import exact_change
from mvsink.table.fingerprint import fingerprints


def lanes(rows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A file's fingerprints given as its rows' two 64-bit lanes."""
    return (
        np.array([a for a, _ in rows], dtype=np.int64),
        np.array([b for _, b in rows], dtype=np.int64),
    )


def test_exact_change_cancels_equal_rows_as_multisets():
    def fps(values: list[int]):
        return fingerprints(pa.table({"x": pa.array(values, pa.int64())}))

    # Added: x=1 three times, 2 once; removed: 1 once, 3 twice (in two files).
    inserts, retracts = exact_change([fps([1, 2, 1]), fps([1])], [fps([3, 1]), fps([3])])
    assert [m.tolist() for m in inserts] == [[True, True, True], [False]]  # 1 twice (first ones), 2
    assert [m.tolist() for m in retracts] == [[True, False], [True]]  # 3 twice; 1 cancels
    assert exact_change([], []) == ([], [])
    same = fps([5, 5])
    assert [m.tolist() for side in exact_change([same], [same]) for m in side] == [[False, False]] * 2


def test_rows_equal_in_one_lane_only_are_different_rows():
    inserts, retracts = exact_change([lanes([(1, 2), (1, 3)])], [lanes([(1, 2), (4, 3)])])
    assert [m.tolist() for m in inserts] == [[False, True]]
    assert [m.tolist() for m in retracts] == [[False, True]]


def test_empty_files_get_empty_masks_in_their_places():
    inserts, retracts = exact_change([lanes([]), lanes([(1, 1)]), lanes([])], [lanes([])])
    assert [m.tolist() for m in inserts] == [[], [True], []]
    assert [m.tolist() for m in retracts] == [[]]
    inserts, retracts = exact_change([lanes([])], [lanes([]), lanes([])])
    assert [m.tolist() for m in inserts] == [[]]
    assert [m.tolist() for m in retracts] == [[], []]


row = st.tuples(st.integers(-2, 2), st.integers(-1, 1))  # few values: many equal rows
files = st.lists(st.lists(row, max_size=6), max_size=4)


@settings(max_examples=300, deadline=None)
@given(files, files)
def test_the_selected_rows_are_the_multiset_difference_taken_first_in_file_order(added, removed):
    inserts, retracts = exact_change([lanes(f) for f in added], [lanes(f) for f in removed])
    assert [len(m) for m in inserts] == [len(f) for f in added]
    assert [len(m) for m in retracts] == [len(f) for f in removed]
    plus, minus = Counter(r for f in added for r in f), Counter(r for f in removed for r in f)
    for side, masks, want in ((added, inserts, plus - minus), (removed, retracts, minus - plus)):
        flat = [r for f in side for r in f]
        chosen = [
            r for r, keep in zip(flat, np.concatenate([*masks, np.zeros(0, bool)]), strict=True) if keep
        ]
        assert Counter(chosen) == want
        # Of equal rows, the first ones in file order are the ones selected.
        seen: Counter[tuple[int, int]] = Counter()
        for r, keep in zip(flat, np.concatenate([*masks, np.zeros(0, bool)]), strict=True):
            assert bool(keep) == (seen[r] < want[r])
            seen[r] += 1
