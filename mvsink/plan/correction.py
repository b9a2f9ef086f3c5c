"""The correction: desired - persisted, as a multiset of row fingerprints.

Pure numpy, no Spark: desired arrives as one fingerprint per row, persisted as one fingerprint
per (file, row position). For every fingerprint ``f`` with ``d`` copies desired and ``p``
persisted, the correction inserts ``d - p`` copies if ``d > p`` and retracts ``p - d`` specific
persisted rows if ``p > d``. Applying it to persisted yields desired exactly (property-tested).

Which persisted copies of an over-represented row are retracted is free; we keep the earliest
(by file order, then position) and retract the rest, so a rogue duplicate appended later is the
one removed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from mvsink.table.fingerprint import I64, Fingerprints


@dataclass(frozen=True)
class Correction:
    """What one epoch must write so that persisted becomes desired."""

    new_a: I64
    new_b: I64
    """Fingerprints absent from persisted: every desired copy is inserted."""
    part_a: I64
    part_b: I64
    part_n: I64
    """Fingerprints persisted too few times: ``part_n`` more copies are inserted."""
    retract_file: I64
    retract_pos: I64
    """Persisted rows to remove, by file number (into the persisted file list) and position."""
    desired_rows: int
    new_n: I64
    """Desired multiplicity of each ``new`` fingerprint: that many copies are inserted."""
    insert_rows: I64
    """The desired rows (indices into desired) to insert: every copy of a ``new``
    fingerprint, the first ``part_n`` copies of a ``part`` one."""

    def insert_keys(self) -> tuple[I64, I64, I64]:
        """Every fingerprint inserted (``new`` then ``part``) and how many copies of each."""
        return (
            np.concatenate([self.new_a, self.part_a]),
            np.concatenate([self.new_b, self.part_b]),
            np.concatenate([self.new_n, self.part_n]),
        )

    @property
    def new_copies(self) -> int:
        return int(self.new_n.sum())

    @property
    def inserted(self) -> int:
        return int(self.new_copies + self.part_n.sum())

    @property
    def retracted(self) -> int:
        return len(self.retract_file)

    @property
    def is_empty(self) -> bool:
        return self.inserted == 0 and self.retracted == 0

    @property
    def inserts_all_desired(self) -> bool:
        """Every desired row is inserted, so desired itself can be written as is."""
        return self.inserted == self.desired_rows

    def retracted_positions(self) -> dict[int, I64]:
        """Row positions to drop, per file number, each sorted."""
        out: dict[int, I64] = {}
        if not len(self.retract_file):
            return out
        order = np.lexsort((self.retract_pos, self.retract_file))
        files, pos = self.retract_file[order], self.retract_pos[order]
        bounds = np.flatnonzero(np.diff(files)) + 1
        for chunk_f, chunk_p in zip(np.split(files, bounds), np.split(pos, bounds), strict=True):
            out[int(chunk_f[0])] = chunk_p
        return out


def _sorted_runs(a: I64, b: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """An order that groups equal fingerprints together, and where each group starts.

    A plain sort on the first hash is several times faster than a lexicographic sort on both;
    it groups correctly unless two different rows share a first hash (a 64-bit collision),
    which is detected and handled by the slower sort.
    """
    order = np.argsort(a)
    a_s, b_s = a[order], b[order]
    new_a = a_s[1:] != a_s[:-1]
    new_run = new_a | (b_s[1:] != b_s[:-1])
    if np.count_nonzero(new_run) != np.count_nonzero(new_a):
        order = np.lexsort((b, a))
        a_s, b_s = a[order], b[order]
        new_run = (a_s[1:] != a_s[:-1]) | (b_s[1:] != b_s[:-1])
    return order, np.concatenate([np.ones(min(1, len(a)), dtype=bool), new_run])


BUCKET_BITS = 4
"""(At most 8.) A big diff runs as ``2 ** BUCKET_BITS`` smaller ones, by these top bits of each
fingerprint's first lane:
equal fingerprints share a bucket, so each bucket's multisets are complete. The buckets' working
arrays are a sixteenth of the view each and reused, where one diff over everything would touch
several fresh arrays of the view's size (page faults cost more there than the arithmetic)."""
_BUCKET_ROWS = 1 << 20
"""Below this many rows on both sides together, one diff."""


def diff(desired: Fingerprints, persisted: Fingerprints) -> Correction:
    """desired - persisted as a ``Correction`` (see the module doc), bucket by bucket
    (``BUCKET_BITS``). ``persisted`` says where its rows live (``Fingerprints.locate``)."""
    nd, np_ = len(desired), len(persisted)
    if np_ and not persisted.locatable:
        raise ValueError("persisted fingerprints need file and pos, or starts")
    if nd + np_ < _BUCKET_ROWS:
        return _bucket_diff(desired, persisted, None, None)
    d_bucket, p_bucket = _bucket(desired.a), _bucket(persisted.a)
    parts = [
        _bucket_diff(desired, persisted, np.flatnonzero(d_bucket == k), np.flatnonzero(p_bucket == k))
        for k in range(1 << BUCKET_BITS)
    ]
    return Correction(
        new_a=np.concatenate([c.new_a for c in parts]),
        new_b=np.concatenate([c.new_b for c in parts]),
        part_a=np.concatenate([c.part_a for c in parts]),
        part_b=np.concatenate([c.part_b for c in parts]),
        part_n=np.concatenate([c.part_n for c in parts]),
        retract_file=np.concatenate([c.retract_file for c in parts]),
        retract_pos=np.concatenate([c.retract_pos for c in parts]),
        desired_rows=nd,
        new_n=np.concatenate([c.new_n for c in parts]),
        insert_rows=np.sort(np.concatenate([c.insert_rows for c in parts])),
    )


def _bucket(lane: I64) -> npt.NDArray[np.uint8]:
    """Each value's bucket, its top ``BUCKET_BITS`` bits, read from its top byte: a byte a
    row where a shift of the whole values would take eight."""
    raw = np.ascontiguousarray(lane).view(np.uint8)
    top = raw[7::8] if np.little_endian else raw[::8]
    return top >> np.uint8(8 - BUCKET_BITS)


def _bucket_diff(
    desired: Fingerprints, persisted: Fingerprints, d_rows: I64 | None, p_rows: I64 | None
) -> Correction:
    """The correction over desired's rows ``d_rows`` and persisted's ``p_rows`` (None: all),
    holding every copy of their fingerprints; ``insert_rows`` index into all of desired.

    Most rows of a steady view are held once and wanted once: those pairs are settled first
    by sorting each side and matching (``_unique_pairs``), and the full multiset algorithm
    runs on the rest only, the persisted rest located in its files. Each fingerprint is
    settled whole or not at all, so the rest holds complete multisets and the result is the
    same."""
    d = desired if d_rows is None else Fingerprints(desired.a[d_rows], desired.b[d_rows])
    p = persisted if p_rows is None else Fingerprints(persisted.a[p_rows], persisted.b[p_rows])
    if len(d) and len(p):
        d_left, p_left = _unique_pairs(d, p)
    else:
        d_left, p_left = np.arange(len(d), dtype=np.int64), np.arange(len(p), dtype=np.int64)
    file, pos = persisted.locate(p_left if p_rows is None else p_rows[p_left])
    rest = _diff(Fingerprints(d.a[d_left], d.b[d_left]), Fingerprints(p.a[p_left], p.b[p_left], file, pos))
    inserted = d_left[rest.insert_rows]
    return replace(rest, desired_rows=len(d), insert_rows=inserted if d_rows is None else d_rows[inserted])


def _unique_pairs(desired: Fingerprints, persisted: Fingerprints) -> tuple[I64, I64]:
    """The desired and persisted rows left once every fingerprint held exactly once on each
    side is set aside as unchanged.

    One sort of both sides' rows by the high bits of the first lane, with the row's number in
    the low bits (numpy sorts plain integers several times faster than it argsorts): a group of
    equal high bits that is exactly one desired and one persisted row with equal fingerprints
    is settled. Equal fingerprints share their high bits, so such a fingerprint occurs nowhere
    else; any other group (a change, a duplicate, high bits shared by chance) is left to the
    exact algorithm."""
    nd, n = len(desired), len(desired) + len(persisted)
    bits = max(1, (n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    # Few, reused buffers: a fresh array of hundreds of MB costs more in page faults than the
    # arithmetic on it.
    keys = np.concatenate([desired.a, persisted.a]).view(np.uint64)
    np.bitwise_and(keys, ~low, out=keys)
    work = np.arange(n, dtype=np.int64).view(np.uint64)
    np.bitwise_or(keys, work, out=keys)
    keys.sort()
    row = np.bitwise_and(keys, low, out=work).view(np.int64)
    same = np.empty(max(0, n - 1), dtype=bool)  # same[k]: rows k and k+1 share high bits
    if n >= 2:
        np.bitwise_xor(keys[1:], keys[:-1], out=keys[1:])  # keys[0] is not needed again
        np.less_equal(keys[1:], low, out=same)
    # k starts a group of exactly two: k, k+1 alike, k-1 and k+2 not.
    pair = np.zeros(n, dtype=bool)
    if n >= 2:
        pair[:-1] = same
        pair[1:-1] &= ~same[:-1]
        pair[:-2] &= ~same[1:]
    first = np.flatnonzero(pair)
    x, y = row[first], row[first + 1]
    d, p = np.minimum(x, y), np.maximum(x, y) - nd  # a settled pair is one row of each side
    one_each = (d < nd) & (p >= 0)
    d, p = d[one_each], p[one_each]
    settled = (desired.a[d] == persisted.a[p]) & (desired.b[d] == persisted.b[p])
    done_d = np.zeros(nd, dtype=bool)
    done_d[d[settled]] = True
    done_p = np.zeros(n - nd, dtype=bool)
    done_p[p[settled]] = True
    return np.flatnonzero(~done_d), np.flatnonzero(~done_p)


def _diff(desired: Fingerprints, persisted: Fingerprints) -> Correction:
    """The multiset difference by one sort of both sides together (duplicates, collisions)."""
    nd, np_ = len(desired), len(persisted)
    z = np.zeros(0, dtype=np.int64)
    p_file = persisted.file if persisted.file is not None else z
    p_pos = persisted.pos if persisted.pos is not None else z
    n = nd + np_
    if n == 0:
        return Correction(z, z, z, z, z, z, z, 0, z, z)
    a = np.concatenate([desired.a, persisted.a])
    b = np.concatenate([desired.b, persisted.b])
    order, new_run = _sorted_runs(a, b)
    is_p = order >= nd
    starts = np.flatnonzero(new_run)
    run_id = np.cumsum(new_run) - 1
    lengths = np.diff(np.append(starts, n))
    p_count = np.bincount(run_id, weights=is_p, minlength=len(starts)).astype(np.int64)
    d_count = lengths - p_count
    ka, kb = a[order[starts]], b[order[starts]]

    # Retract every persisted copy of a fingerprint desired lacks entirely...
    gone = is_p & (d_count[run_id] == 0)
    r_src = [order[gone] - nd]
    # ...and, where desired has fewer copies than persisted, the copies beyond the earliest
    # d_count (by file, then position). Rare (duplicated rows), so done on that subset only.
    fewer = is_p & (d_count[run_id] > 0) & (p_count[run_id] > d_count[run_id])
    if fewer.any():
        src = order[fewer] - nd
        runs = run_id[fewer]
        o = np.lexsort((p_pos[src], p_file[src], runs))
        src, runs = src[o], runs[o]
        first = np.flatnonzero(np.concatenate([[True], runs[1:] != runs[:-1]]))
        rank = np.arange(len(src)) - np.repeat(first, np.diff(np.append(first, len(src))))
        r_src.append(src[rank >= d_count[runs]])
    src_all = np.concatenate(r_src)
    # Desired rows to insert: in each run, the first d - p desired copies (all when p == 0).
    is_d = ~is_p
    seen_d = np.cumsum(is_d)
    d_before_run: I64 = (seen_d - is_d)[starts]
    d_rank = seen_d - 1 - d_before_run[run_id]
    take = is_d & (d_rank < (d_count - p_count)[run_id])
    insert_rows = np.sort(order[take]).astype(np.int64)
    new = (d_count > 0) & (p_count == 0)
    part = (p_count > 0) & (d_count > p_count)
    return Correction(
        new_a=ka[new],
        new_b=kb[new],
        part_a=ka[part],
        part_b=kb[part],
        part_n=(d_count - p_count)[part],
        retract_file=p_file[src_all].astype(np.int64),
        retract_pos=p_pos[src_all].astype(np.int64),
        desired_rows=nd,
        new_n=d_count[new],
        insert_rows=insert_rows,
    )
