"""Mint: turn an epoch and the target's frontier into a batch description, or into nothing.

A description ``(lower, upper)`` reads "replace the contents valid at ``lower`` by desired as of
``upper - 1``". ``lower`` is the frontier read from the snapshot the correction is computed
against, ``upper`` is ``epoch + 1``. We mint only when

1. the epoch is at or past ``as_of`` (earlier epochs produce nothing), and
2. the epoch is not yet reflected: ``epoch + 1 > lower`` (otherwise this is a replay after a
   restart, or a replica that is behind, and writing would move the frontier backwards), and
3. the sink is not read-only.

Because every description is minted from a fresh snapshot and only ever committed against that
snapshot, lowers strictly increase across committed descriptions (I1), and at most one
description is valid at a time: the one whose lower is the current frontier (I2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mvsink.errors import InvariantViolation, Where

Skip = Literal["replay", "before_as_of", "read_only"]


@dataclass(frozen=True)
class BatchDescription:
    """``(lower, upper)``: lower is None for a target this view never committed to."""

    lower: int | None
    upper: int

    def __post_init__(self) -> None:
        if self.lower is not None and self.upper <= self.lower:
            raise InvariantViolation(f"a description must advance the frontier: {self}")


def mint(
    epoch: int, frontier: int | None, *, as_of: int, read_only: bool, where: Where
) -> BatchDescription | Skip:
    """The description for ``epoch`` against ``frontier``, or why there is none."""
    if epoch < as_of:
        return "before_as_of"
    if frontier is not None and epoch + 1 <= frontier:
        return "replay"
    if read_only:
        return "read_only"
    try:
        return BatchDescription(lower=frontier, upper=epoch + 1)
    except InvariantViolation as exc:
        raise InvariantViolation(exc.message, where) from None
