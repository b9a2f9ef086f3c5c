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

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Fingerprints:
    """Row fingerprints; ``file`` and ``pos`` say where each persisted row lives."""

    a: I64
    b: I64
    file: I64 | None = None
    pos: I64 | None = None

    def __len__(self) -> int:
        return len(self.a)

    @staticmethod
    def empty() -> Fingerprints:
        z = np.zeros(0, dtype=np.int64)
        return Fingerprints(z, z, z, z)


@dataclass(frozen=True)
class Correction:
    """What one epoch must write so that persisted becomes desired."""

    whole_a: I64
    whole_b: I64
    """Fingerprints absent from persisted: every desired copy is inserted."""
    part_a: I64
    part_b: I64
    part_n: I64
    """Fingerprints persisted too few times: ``part_n`` more copies are inserted."""
    retract_file: I64
    retract_pos: I64
    """Persisted rows to remove, by file number (into the persisted file list) and position."""
    desired_rows: int
    whole_copies: int
    """Rows inserted for the ``whole`` fingerprints (their desired multiplicities summed)."""

    @property
    def inserted(self) -> int:
        return int(self.whole_copies + self.part_n.sum())

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


def diff(desired: Fingerprints, persisted: Fingerprints) -> Correction:
    """desired - persisted as a ``Correction`` (see the module doc)."""
    nd, np_ = len(desired), len(persisted)
    if np_ and (persisted.file is None or persisted.pos is None):
        raise ValueError("persisted fingerprints need file and pos")
    a = np.concatenate([desired.a, persisted.a])
    b = np.concatenate([desired.b, persisted.b])
    side = np.concatenate([np.zeros(nd, np.int8), np.ones(np_, np.int8)])
    n = nd + np_
    z = np.zeros(0, dtype=np.int64)
    if n == 0:
        return Correction(z, z, z, z, z, z, z, 0, 0)
    # Sort by fingerprint, desired copies before persisted ones within each fingerprint.
    order = np.lexsort((side, b, a))
    a_s, b_s, side_s = a[order], b[order], side[order]
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    np.not_equal(a_s[1:], a_s[:-1], out=new_run[1:])
    new_run[1:] |= b_s[1:] != b_s[:-1]
    starts = np.flatnonzero(new_run)
    run_id = np.cumsum(new_run) - 1
    lengths = np.diff(np.append(starts, n))
    d_count = np.bincount(run_id, weights=(side_s == 0), minlength=len(starts)).astype(np.int64)
    p_count = lengths - d_count
    # Within a run, persisted copy k (0-based) is kept iff k < d_count; its index in the
    # sorted order is start + d_count + k.
    rank = np.arange(n) - starts[run_id]
    retract = (side_s == 1) & (rank >= 2 * d_count[run_id])
    src = order[retract] - nd
    assert persisted.file is not None or not len(src)
    r_file = persisted.file[src] if persisted.file is not None else z
    r_pos = persisted.pos[src] if persisted.pos is not None else z
    whole = (d_count > 0) & (p_count == 0)
    part = (p_count > 0) & (d_count > p_count)
    ka, kb = a_s[starts], b_s[starts]
    return Correction(
        whole_a=ka[whole],
        whole_b=kb[whole],
        part_a=ka[part],
        part_b=kb[part],
        part_n=(d_count - p_count)[part],
        retract_file=r_file.astype(np.int64),
        retract_pos=r_pos.astype(np.int64),
        desired_rows=nd,
        whole_copies=int(d_count[whole].sum()),
    )
