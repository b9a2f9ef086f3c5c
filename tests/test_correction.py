"""The correction algebra: for any persisted and desired multisets, applying it yields desired."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.plan.correction import diff
from mvsink.table.fingerprint import Fingerprints

# Few distinct values so that duplicates, and 64-bit halves shared by different rows, are common.
fp = st.tuples(st.integers(-3, 3), st.integers(-2, 2))


def desired_of(keys: list[tuple[int, int]]) -> Fingerprints:
    a = np.array([k[0] for k in keys], dtype=np.int64)
    b = np.array([k[1] for k in keys], dtype=np.int64)
    return Fingerprints(a, b)


def persisted_of(files: list[list[tuple[int, int]]]) -> Fingerprints:
    flat = [(k, f, p) for f, rows in enumerate(files) for p, k in enumerate(rows)]
    return Fingerprints(
        a=np.array([k[0] for k, _, _ in flat], dtype=np.int64),
        b=np.array([k[1] for k, _, _ in flat], dtype=np.int64),
        file=np.array([f for _, f, _ in flat], dtype=np.int64),
        pos=np.array([p for _, _, p in flat], dtype=np.int64),
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(fp, max_size=40), st.lists(st.lists(fp, max_size=8), max_size=6))
def test_applying_the_correction_yields_desired(desired: list, files: list) -> None:
    corr = diff(desired_of(desired), persisted_of(files))
    drop = corr.retracted_positions()
    kept = Counter(
        k for f, rows in enumerate(files) for p, k in enumerate(rows) if p not in set(drop.get(f, []))
    )
    want = Counter(desired)
    inserted = Counter()
    for a, b in zip(corr.whole_a, corr.whole_b, strict=True):
        inserted[(int(a), int(b))] += want[(int(a), int(b))]  # every desired copy
    for a, b, n in zip(corr.part_a, corr.part_b, corr.part_n, strict=True):
        inserted[(int(a), int(b))] += int(n)
    assert kept + inserted == want
    # Minimal: nothing is both retracted and inserted, and counts match the multiset difference.
    have = Counter(k for rows in files for k in rows)
    assert corr.inserted == sum((want - have).values())
    assert corr.retracted == sum((have - want).values())
    assert not (set(inserted) & {files[f][p] for f, ps in drop.items() for p in ps})
    assert corr.inserts_all_desired == (corr.inserted == len(desired))


def test_the_earliest_copy_is_kept_and_later_duplicates_retracted() -> None:
    files = [[(1, 1), (2, 2)], [(1, 1)], [(1, 1)]]
    corr = diff(desired_of([(1, 1), (2, 2)]), persisted_of(files))
    assert {f: list(p) for f, p in corr.retracted_positions().items()} == {1: [0], 2: [0]}
    assert corr.inserted == 0


def test_empty_sides() -> None:
    assert diff(desired_of([]), persisted_of([])).is_empty
    corr = diff(desired_of([(1, 2), (1, 2)]), persisted_of([]))
    assert corr.inserted == 2 and corr.inserts_all_desired
    corr = diff(desired_of([]), persisted_of([[(1, 2)]]))
    assert corr.retracted == 1 and corr.inserted == 0


def _apply(corr, desired: list, files: list) -> Counter:
    drop = corr.retracted_positions()
    kept = Counter(
        k for f, rows in enumerate(files) for p, k in enumerate(rows) if p not in set(drop.get(f, []))
    )
    return kept + Counter(desired[i] for i in corr.insert_rows)


# Mostly distinct values, as in a steady view: the matched-once fast path does most of the work.
wide = st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
mixed = st.one_of(wide, wide, wide, fp, st.tuples(st.just(7), st.integers(-2, 2)))


@settings(max_examples=300, deadline=None)
@given(st.lists(mixed, max_size=40), st.lists(st.lists(mixed, max_size=8), max_size=6), st.randoms())
def test_the_inserted_rows_and_retractions_yield_desired(desired: list, files: list, rnd) -> None:
    # Desired shares most of persisted's rows, in another order.
    shared = [k for rows in files for k in rows if rnd.random() < 0.8]
    desired = desired + shared
    rnd.shuffle(desired)
    corr = diff(desired_of(desired), persisted_of(files))
    assert _apply(corr, desired, files) == Counter(desired)
    have = Counter(k for rows in files for k in rows)
    assert corr.inserted == len(corr.insert_rows) == sum((Counter(desired) - have).values())
    assert corr.retracted == sum((have - Counter(desired)).values())
    assert corr.inserts_all_desired == (corr.inserted == len(desired))
