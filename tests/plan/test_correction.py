"""The correction algebra: for any persisted and desired multisets, applying it yields desired."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.plan.correction import diff
from mvsink.table.fingerprint import Fingerprints
from tests.helpers import persisted_of

# Few distinct values so that duplicates, and 64-bit halves shared by different rows, are common.
fp = st.tuples(st.integers(-3, 3), st.integers(-2, 2))


def desired_of(keys: list[tuple[int, int]]) -> Fingerprints:
    a = np.array([k[0] for k in keys], dtype=np.int64)
    b = np.array([k[1] for k in keys], dtype=np.int64)
    return Fingerprints(a, b)


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
    for a, b in zip(corr.new_a, corr.new_b, strict=True):
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


@settings(max_examples=200, deadline=None)
@given(st.lists(mixed, max_size=40), st.lists(st.lists(mixed, max_size=8), max_size=6), st.randoms())
def test_the_diff_by_buckets_and_by_file_starts_is_the_diff(desired: list, files: list, rnd) -> None:
    """A big diff runs bucket by bucket over persisted rows located by their files' first rows
    (``starts``, as the driver's index gives them): the same correction as one diff."""
    import mvsink.plan.correction as correction

    desired = desired + [k for rows in files for k in rows if rnd.random() < 0.8]
    rnd.shuffle(desired)
    whole = diff(desired_of(desired), persisted_of(files))
    sizes = [len(rows) for rows in files]
    packed = persisted_of(files)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if files else None
    located = Fingerprints(packed.a, packed.b, starts=starts)
    saved = correction._BUCKET_ROWS, correction.BUCKET_BITS
    correction._BUCKET_ROWS, correction.BUCKET_BITS = 0, 2  # every diff by buckets, few of them
    try:
        bucketed = diff(desired_of(desired), located)
    finally:
        correction._BUCKET_ROWS, correction.BUCKET_BITS = saved
    # Which of equal desired copies is inserted is free; which stored copies go is not.
    assert Counter(desired[i] for i in bucketed.insert_rows) == Counter(desired[i] for i in whole.insert_rows)
    assert {f: list(p) for f, p in bucketed.retracted_positions().items()} == {
        f: list(p) for f, p in whole.retracted_positions().items()
    }
    assert Counter(zip(bucketed.new_a, bucketed.new_b, bucketed.new_n, strict=True)) == Counter(
        zip(whole.new_a, whole.new_b, whole.new_n, strict=True)
    )
    assert Counter(zip(bucketed.part_a, bucketed.part_b, bucketed.part_n, strict=True)) == Counter(
        zip(whole.part_a, whole.part_b, whole.part_n, strict=True)
    )


def test_rows_of_empty_files_are_located_in_the_next_file() -> None:
    located = Fingerprints(np.arange(5), np.arange(5), starts=np.array([0, 0, 2, 2, 5]))
    file, pos = located.locate(np.arange(5))
    assert list(file) == [1, 1, 3, 3, 3] and list(pos) == [0, 1, 0, 1, 2]


def test_a_bucket_is_the_top_bits_of_the_first_lane() -> None:
    from mvsink.plan.correction import BUCKET_BITS, _bucket

    lane = np.random.default_rng(3).integers(-(2**63), 2**63 - 1, 10_000)
    lane[:4] = [-1, 0, -(2**63), 2**63 - 1]
    top = lane.view(np.uint64) >> np.uint64(64 - BUCKET_BITS)
    assert np.array_equal(_bucket(lane), top.astype(np.uint8))


def test_a_big_diff_runs_by_buckets_and_gives_the_one_diff() -> None:
    """Past ``_BUCKET_ROWS``, by buckets: a million persisted rows in 20 files; desired has
    100 of them changed, 200 gone, 10 held twice and 5 new."""
    from mvsink.plan.correction import _bucket_diff

    rng = np.random.default_rng(7)
    n = 1_000_000
    a, b = rng.integers(-(2**63), 2**63 - 1, n), rng.integers(-(2**63), 2**63 - 1, n)
    new_a, new_b = rng.integers(-(2**63), 2**63 - 1, 5), rng.integers(-(2**63), 2**63 - 1, 5)
    stored_b = b.copy()
    stored_b[:100] += 1  # the stored rows of the 100 that changed
    d_a = np.concatenate([a[:100], a[300:], a[400:410], new_a])
    d_b = np.concatenate([b[:100], b[300:], b[400:410], new_b])
    order = rng.permutation(len(d_a))
    desired = Fingerprints(d_a[order], d_b[order])
    corr = diff(desired, Fingerprints(a, stored_b, starts=np.arange(0, n, 50_000, dtype=np.int64)))
    located = Fingerprints(a, stored_b, np.arange(n) // 50_000, np.arange(n) % 50_000)
    one = _bucket_diff(desired, located, None, None)

    def inserted(c):
        return Counter(zip(desired.a[c.insert_rows].tolist(), desired.b[c.insert_rows].tolist(), strict=True))

    assert inserted(corr) == inserted(one)
    assert (corr.inserted, corr.retracted) == (115, 300)
    assert sorted(zip(corr.retract_file.tolist(), corr.retract_pos.tolist(), strict=True)) == [
        (0, p) for p in range(300)
    ]


def test_of_the_rows_fetched_as_many_copies_as_inserted_are_kept_or_repeated() -> None:
    """The driver fetches the rows to insert by fingerprint (``complete._copies``): of each
    fingerprint only as many copies as the diff inserts are kept, the earliest, and one that
    came once (desired holds more copies than are inserted: one of each is fetched) is
    repeated; a fetch lacking a fingerprint, or bringing another, is refused (Spark tasks
    write the rows then)."""
    from mvsink.plan.complete import _copies

    stored = [[(1, 1)], [(2, 2), (2, 2)]]
    desired = [(1, 1), (1, 1), (1, 1), (2, 2), (2, 2), (2, 2), (3, 3), (3, 3)]
    corr = diff(desired_of(desired), persisted_of(stored))
    assert corr.inserted == 5  # 2 more of (1, 1), 1 more of (2, 2), 2 of (3, 3)

    def kept(got: list[tuple[int, int]]) -> list[int] | None:
        keep = _copies(desired_of(got), corr)
        if keep is not None:
            assert len(keep) == corr.inserted
            assert Counter(got[i] for i in keep) == Counter({(1, 1): 2, (2, 2): 1, (3, 3): 2})
        return None if keep is None else keep.tolist()

    assert kept([(3, 3), (2, 2), (1, 1), (2, 2), (1, 1), (3, 3), (2, 2), (1, 1)]) == [0, 1, 2, 4, 5]
    assert kept([(3, 3), (1, 1), (2, 2)]) == [0, 0, 1, 1, 2]  # one of each, repeated
    assert kept([(3, 3), (1, 1)]) is None  # (2, 2) missing
    assert kept([(3, 3), (1, 1), (2, 2), (4, 4)]) is None  # (4, 4) not inserted


def test_rows_found_by_their_first_lane_alone_are_kept_only_if_both_lanes_are_wanted() -> None:
    """A fetch from the caller's cache finds rows by their first lane (``complete._fetch``):
    one whose second lane is not wanted (two rows whose first lanes collide) is left out."""
    from mvsink.plan.complete import _among

    got = desired_of([(5, 1), (5, 2), (7, 7), (9, 9), (5, 3)])
    want = desired_of([(5, 2), (9, 9), (5, 3), (1, 1)])
    assert _among(got, want.a, want.b).tolist() == [False, True, False, True, True]
    assert _among(got, want.a[:0], want.b[:0]).tolist() == [False] * 5
