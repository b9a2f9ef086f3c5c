"""Mint: the batch description an epoch commits at, once ``decide`` found it may.

A description ``(lower, upper)`` reads "replace the contents valid at ``lower`` by desired as of
``upper - 1``". ``lower`` is the frontier read from the snapshot the correction is computed
against, ``upper`` is ``epoch + 1``. Epoch numbers compare only within a lineage
(``lineage.py``): a takeover description (a new lineage's first epoch) and a clocked one (a
shared clock's time decides, ``clock.py``) may have an upper at or below their lower. Every
other description advances the frontier, checked here where it is built (keeps I1,
``mvsink.epoch``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mvsink.errors import InvariantViolation, Where


@dataclass(frozen=True)
class BatchDescription:
    """``(lower, upper)``: lower is None for a target this view never committed to."""

    lower: int | None
    upper: int
    takeover: bool = False
    """A new lineage's first epoch: its upper counts in its own epochs, not the old lineage's."""
    clocked: bool = False
    """Minted under a shared clock (``clock.py``): the time decides, not the upper."""

    def __post_init__(self) -> None:
        if self.lower is not None and self.upper <= self.lower and not (self.takeover or self.clocked):
            raise InvariantViolation(f"a description must advance the frontier: {self}")


def mint(
    epoch: int, frontier: int | None, *, where: Where, takeover: bool = False, clocked: bool = False
) -> BatchDescription:
    """The description of ``epoch`` against ``frontier``: ``(frontier, epoch + 1)``.
    ``InvariantViolation`` (naming ``where``) for a plain one that would not advance it."""
    try:
        return BatchDescription(frontier, epoch + 1, takeover=takeover, clocked=clocked)
    except InvariantViolation as exc:
        raise InvariantViolation(exc.message, where) from None
