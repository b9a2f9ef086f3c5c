"""The exact change of one Delta commit: rows inserted (+1) and retracted (-1), as multisets.

A commit that rewrites a file removes it and adds a new file holding the rows that stay plus
any new ones. Delta's change data feed over copy-on-write reports every row of both files;
the exact change is the multiset difference ``rows(added files) - rows(removed files)``: a row
that is in both (an untouched row of a rewritten file) cancels, as many times as it occurs on
both sides.

Rows are compared by fingerprint (``fingerprint.py``: mvsink's row equality, 128 bits). This
module decides *which* rows of which files carry the change, from the files' fingerprints
alone; the caller reads the files and keeps the rows the masks select. Memory is the
fingerprints of the commit's touched rows (about 40 bytes a row), never the rows themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from mvsink.table.fingerprint import Lanes

Mask = npt.NDArray[np.bool_]


def exact_change(added: Sequence[Lanes], removed: Sequence[Lanes]) -> tuple[list[Mask], list[Mask]]:
    """Per file, which rows carry the change: ``(masks of added files, masks of removed files)``.

    A row of an added file is selected (an insert, +1) for each time its value occurs more
    often among added rows than among removed ones; a row of a removed file (a retraction, -1)
    the other way round. Among equal rows, the first ones in file order are selected, so the
    result does not depend on anything but the two sides' contents and order.
    """
    sides = [*added, *removed]
    sizes = np.array([len(a) for a, _ in sides], dtype=np.int64)
    if not len(sides) or not sizes.sum():
        return [np.zeros(len(a), dtype=bool) for a, _ in added], [
            np.zeros(len(a), dtype=bool) for a, _ in removed
        ]
    lane_a = np.concatenate([a for a, _ in sides])
    lane_b = np.concatenate([b for _, b in sides])
    n_added = int(sizes[: len(added)].sum())
    sign = np.ones(len(lane_a), dtype=np.int64)
    sign[n_added:] = -1
    # Group equal fingerprints: sort by both lanes, a new group where either lane changes.
    order = np.lexsort((lane_b, lane_a))
    a_sorted, b_sorted = lane_a[order], lane_b[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (a_sorted[1:] != a_sorted[:-1]) | (b_sorted[1:] != b_sorted[:-1])
    group_sorted = np.cumsum(starts) - 1
    group = np.empty_like(group_sorted)
    group[order] = group_sorted
    net = np.bincount(group, weights=sign, minlength=int(group_sorted[-1]) + 1).astype(np.int64)
    keep = np.zeros(len(lane_a), dtype=bool)
    for side, limit in ((slice(0, n_added), net), (slice(n_added, None), -net)):
        rows = np.arange(len(lane_a))[side]
        g = group[side]
        # Rank of each row among the equal rows of its side, in file order.
        by_group = np.argsort(g, kind="stable")
        g_sorted = g[by_group]
        first = np.ones(len(g_sorted), dtype=bool)
        first[1:] = g_sorted[1:] != g_sorted[:-1]
        run_start = np.maximum.accumulate(np.where(first, np.arange(len(g_sorted)), 0))
        rank = np.empty(len(g_sorted), dtype=np.int64)
        rank[by_group] = np.arange(len(g_sorted)) - run_start
        keep[rows] = rank < limit[g]
    masks = np.split(keep, np.cumsum(sizes)[:-1])
    return masks[: len(added)], masks[len(added) :]
